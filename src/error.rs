//! Errors on the request path, each knowing its side ([`Side`]: client, upstream, store) and
//! mapping to exactly one status. They are turned into responses (rendered by `answers`, with
//! a log line naming the cause), never into a dropped connection. [`chain`] is how every log
//! line spells a cause: the error and its sources as one readable sentence.

use std::time::Duration;

use http::StatusCode;

use crate::body::BoxError;

/// Who is at fault for an error: what logs and metrics tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client sent something that cannot be forwarded.
    Client,
    /// The upstream could not be reached or broke the exchange.
    Upstream,
    /// The rate limit store failed.
    Store,
}

impl Side {
    /// The side as logs name it (`side=client`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Upstream => "upstream",
            Side::Store => "store",
        }
    }
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The client sent something we cannot forward.
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    /// The client's body is larger than `max_request_body`.
    #[error("request body larger than {limit} bytes")]
    BodyTooLarge { limit: u64 },
    /// No connection to the upstream could be made (refused, unreachable, connect timeout,
    /// TLS failure).
    #[error("upstream unreachable: {0}")]
    UpstreamConnect(#[source] BoxError),
    /// The upstream did not send a response head in time.
    #[error("upstream sent no response within {0:?}")]
    UpstreamTimeout(Duration),
    /// The upstream broke the exchange (reset, garbage instead of HTTP, closed early).
    #[error("upstream failed: {0}")]
    Upstream(#[source] BoxError),
    /// The client's request body could not be read while it was being forwarded: malformed
    /// chunked framing (a chunk size that is not hex, an extension with a bare newline, a
    /// size that overflows) or a connection cut mid-body. The client's fault, not the app's.
    #[error("the request body could not be read: {0}")]
    ClientBody(#[source] BoxError),
    /// The limit store failed and `on_error: deny` says to refuse.
    #[error("rate limit store unavailable")]
    StoreUnavailable,
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BadRequest(_) | ProxyError::ClientBody(_) => StatusCode::BAD_REQUEST,
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::UpstreamConnect(_) | ProxyError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Who is at fault.
    pub fn side(&self) -> Side {
        match self {
            ProxyError::BadRequest(_)
            | ProxyError::BodyTooLarge { .. }
            | ProxyError::ClientBody(_) => Side::Client,
            ProxyError::UpstreamConnect(_)
            | ProxyError::UpstreamTimeout(_)
            | ProxyError::Upstream(_) => Side::Upstream,
            ProxyError::StoreUnavailable => Side::Store,
        }
    }
}

impl ProxyError {
    /// A failed upstream send: the client's fault when the request body the client is
    /// streaming failed to read (hyper reports the body's own error as a user error with that
    /// error as its source), the upstream's otherwise.
    pub fn from_send(error: BoxError) -> ProxyError {
        if client_body_failed(&*error) {
            ProxyError::ClientBody(error)
        } else {
            ProxyError::Upstream(error)
        }
    }
}

/// Whether a send error's chain holds hyper's "the user's body stream failed" with a cause:
/// the outgoing body is the client's incoming one, so its failure is a read error on the
/// client's connection (bad framing, a cut connection), never something the upstream did.
fn client_body_failed(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_user() && std::error::Error::source(h).is_some() {
                return true;
            }
        }
        next = e.source();
    }
    false
}

/// An error and its sources as one sentence, joined with ": " (`upstream unreachable: client
/// error (Connect): tcp connect error: Connection refused (os error 111)`), for the `cause`
/// field of log lines. A source whose text the previous one already contains is skipped:
/// many errors print their source inside their own message.
pub fn chain<'a>(error: &'a (dyn std::error::Error + 'a)) -> Chain<'a> {
    Chain(error)
}

/// What [`chain`] returns: formats the chain when displayed (nothing is built before).
#[derive(Clone, Copy)]
pub struct Chain<'a>(&'a (dyn std::error::Error + 'a));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut previous = self.0.to_string();
        f.write_str(&previous)?;
        let mut next = self.0.source();
        while let Some(source) = next {
            let text = source.to_string();
            if !text.is_empty() && !previous.contains(&text) {
                f.write_str(": ")?;
                f.write_str(&text)?;
            }
            previous = text;
            next = source.source();
        }
        Ok(())
    }
}

impl std::fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a message and an optional source, as the tests build chains.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn a_chain_reads_as_one_sentence() {
        let three = Layer(
            "upstream unreachable",
            Some(Box::new(Layer(
                "tcp connect error",
                Some(Box::new(Layer("Connection refused (os error 111)", None))),
            ))),
        );
        assert_eq!(
            chain(&three).to_string(),
            "upstream unreachable: tcp connect error: Connection refused (os error 111)"
        );
        assert_eq!(chain(&Layer("alone", None)).to_string(), "alone");
    }

    #[test]
    fn a_source_already_in_the_message_is_not_repeated() {
        let repeated = Layer(
            "store error: broken pipe",
            Some(Box::new(Layer(
                "broken pipe",
                Some(Box::new(Layer("os error 32", None))),
            ))),
        );
        assert_eq!(
            chain(&repeated).to_string(),
            "store error: broken pipe: os error 32"
        );
        // The real thing: a ProxyError printing its source inside its own message.
        let error = ProxyError::UpstreamConnect(Box::new(Layer(
            "client error (Connect)",
            Some(Box::new(Layer("Connection refused", None))),
        )));
        assert_eq!(
            chain(&error).to_string(),
            "upstream unreachable: client error (Connect): Connection refused"
        );
    }
}

//! Errors on the request path, each knowing its side ([`Side`]: client, upstream, store) and
//! mapping to exactly one status. They are turned into responses (with a short plain body and
//! a log line naming the cause), never into a dropped connection.

use std::time::Duration;

use http::{header, HeaderValue, Response, StatusCode};

use crate::body::{full, BoxError, ProxyBody};

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
    /// The limit store failed and `on_error: deny` says to refuse.
    #[error("rate limit store unavailable")]
    StoreUnavailable,
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::UpstreamConnect(_) | ProxyError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Who is at fault.
    pub fn side(&self) -> Side {
        match self {
            ProxyError::BadRequest(_) | ProxyError::BodyTooLarge { .. } => Side::Client,
            ProxyError::UpstreamConnect(_)
            | ProxyError::UpstreamTimeout(_)
            | ProxyError::Upstream(_) => Side::Upstream,
            ProxyError::StoreUnavailable => Side::Store,
        }
    }

    /// A short plain-text answer. Causes stay in the log: they can name internal hosts.
    pub fn into_response(self) -> Response<ProxyBody> {
        self.response()
    }

    /// [`ProxyError::into_response`], keeping the error (for the request's record, which logs
    /// its cause).
    pub fn response(&self) -> Response<ProxyBody> {
        let status = self.status();
        let text = match self {
            ProxyError::BadRequest(why) => format!("400 Bad Request: {why}\n"),
            ProxyError::BodyTooLarge { limit } => {
                format!("413 Payload Too Large: the request body is limited to {limit} bytes\n")
            }
            ProxyError::UpstreamConnect(_) => {
                "502 Bad Gateway: the upstream is unreachable\n".into()
            }
            ProxyError::Upstream(_) => "502 Bad Gateway: the upstream failed\n".into(),
            ProxyError::UpstreamTimeout(_) => {
                "504 Gateway Timeout: the upstream did not answer in time\n".into()
            }
            ProxyError::StoreUnavailable => {
                "503 Service Unavailable: rate limiting is unavailable, try again shortly\n".into()
            }
        };
        let mut response = Response::new(full(text));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if matches!(self, ProxyError::StoreUnavailable) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if matches!(self, ProxyError::BodyTooLarge { .. }) {
            // The rest of the body was not read: the connection cannot be reused.
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_maps_to_one_status() {
        let cases: Vec<(ProxyError, u16, &str)> = vec![
            (ProxyError::BadRequest("x"), 400, "client"),
            (ProxyError::BodyTooLarge { limit: 1 }, 413, "client"),
            (
                ProxyError::UpstreamConnect("refused".into()),
                502,
                "upstream",
            ),
            (ProxyError::Upstream("reset".into()), 502, "upstream"),
            (
                ProxyError::UpstreamTimeout(Duration::from_secs(1)),
                504,
                "upstream",
            ),
            (ProxyError::StoreUnavailable, 503, "store"),
        ];
        for (error, status, side) in cases {
            assert_eq!(error.side().as_str(), side);
            let response = error.into_response();
            assert_eq!(response.status().as_u16(), status);
            assert_eq!(
                response.headers()["content-type"],
                "text/plain; charset=utf-8"
            );
        }
    }
}

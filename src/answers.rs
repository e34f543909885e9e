//! Every answer tollgate makes itself, rather than forwards, is rendered here: a request shape
//! refused before routing, a refused credential, a limited caller, a request `protect` shed,
//! the usage endpoint's refusals, an error on the way (see `error`). One variant of
//! [`Answer`] per kind says what is answered; [`Form`] says how the caller reads it:
//!
//! - an RFC 9457 problem (`application/problem+json`: `type`, `title`, `status`, `detail`) by
//!   default;
//! - one line of `text/plain` (`STATUS Title: detail`) when the request's `Accept` asks for
//!   `text/plain` and for no JSON type;
//! - a gRPC trailers-only status for a gRPC call (see `grpc`), whose `grpc-message` is that
//!   line.
//!
//! A limited caller's answer is the configured one (`response`: its status, the RateLimit
//! fields and the problem body `throttle::headers` renders) whatever `Accept` says; a gRPC call
//! gets it as RESOURCE_EXHAUSTED with the problem's `detail`. Every answer is `no-store`: it is
//! one caller's state at one moment. Answers are the rare path: they may allocate.

use std::borrow::Cow;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};

use crate::body::{self, ProxyBody};
use crate::config::ResponseConfig;
use crate::error::ProxyError;
use crate::identity;
use crate::throttle::headers as limit_headers;
use crate::throttle::{Denial, Limited};

/// What tollgate forwards: every method but CONNECT (a 405's `Allow`).
pub const FORWARDED_METHODS: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE";

/// What a CONNECT is told (`tollgate explain` says it too).
pub const CONNECT_REFUSED: &str = "CONNECT is not forwarded: this is a reverse proxy";

/// What tollgate answers, one variant per kind of answer.
pub enum Answer<'a> {
    /// 400: a request no app should see (a hostile shape, see `proxy::shape`, or a value an
    /// identity cannot read one way), with the reason the client is told.
    Malformed(&'static str),
    /// 405: CONNECT, which a reverse proxy does not forward.
    ConnectRefused,
    /// 401: an identity with `on_invalid: reject` refused the bearer token (an ambiguous
    /// request is [`Answer::Malformed`]), with an RFC 6750 challenge.
    Unauthorized(identity::Refusal),
    /// Over a limit: the configured response (`response`), 429 by default.
    Limited(&'a ResponseConfig, Limited<'a>),
    /// 503: `protect` shed the request to keep the app answering.
    Overloaded,
    /// An error on the way (400, 413, 502, 503, 504): see [`ProxyError`].
    Failed(&'a ProxyError),
    /// 503: the store failed and `on_error: deny` refuses the request.
    StoreUnavailable,
    /// 405: the usage endpoint answers GET and HEAD only.
    UsageMethod,
    /// 429: the usage endpoint's own rate (`limit` per `window_secs` from one client).
    UsageBusy {
        limit: u32,
        window_secs: u64,
        retry_secs: u64,
    },
    /// 503: the usage endpoint could not read the store.
    UsageUnreadable,
}

/// How the caller reads tollgate's answers (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Problem,
    Text,
    Grpc,
}

impl Form {
    /// The form for a request: gRPC for a gRPC call, else what its `Accept` lines asked for.
    pub fn of(grpc: bool, accept: Accept) -> Form {
        if grpc {
            Form::Grpc
        } else if accept.text && !accept.json {
            Form::Text
        } else {
            Form::Problem
        }
    }

    /// The form of the HTTP answer a gRPC answer is translated from (for an answer that goes
    /// through the respond stage first, translated at its end, or one that is never gRPC).
    pub fn http(self) -> Form {
        match self {
            Form::Grpc => Form::Problem,
            other => other,
        }
    }
}

/// What a request's `Accept` lines ask for, as far as tollgate's answers care.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Accept {
    /// A range is `text/plain`.
    text: bool,
    /// A range is a JSON type (`application/json`, `application/problem+json`, ...).
    json: bool,
}

impl Accept {
    /// Adds one `Accept` line (its parameters and weights are not read).
    pub fn read(&mut self, value: &[u8]) {
        for range in value.split(|&b| b == b',') {
            let range = range.split(|&b| b == b';').next().unwrap_or_default();
            let range = range.trim_ascii();
            if range.eq_ignore_ascii_case(b"text/plain") {
                self.text = true;
            } else if range.len() >= 4 && range[range.len() - 4..].eq_ignore_ascii_case(b"json") {
                self.json = true;
            }
        }
    }

    /// What all of `headers`' `Accept` lines ask for.
    pub fn of(headers: &HeaderMap) -> Accept {
        let mut accept = Accept::default();
        for value in headers.get_all(header::ACCEPT) {
            accept.read(value.as_bytes());
        }
        accept
    }
}

/// The parts every answer but a limited one is written from.
struct Problem {
    status: StatusCode,
    /// The problem's `type`.
    kind: &'static str,
    title: &'static str,
    detail: Cow<'static, str>,
}

impl Answer<'_> {
    /// The answer in `form`, with the HTTP status tollgate chose (what the record logs; a gRPC
    /// answer's own status is 200).
    pub fn render(self, form: Form) -> (StatusCode, Response<ProxyBody>) {
        let limited = matches!(self, Answer::Limited(..));
        let response = match self {
            Answer::Limited(config, limited) => limited_response(config, &limited),
            other => other.problem_response(form.http()),
        };
        let status = response.status();
        match form {
            Form::Grpc => (status, for_grpc(response, limited)),
            Form::Problem | Form::Text => (status, response),
        }
    }

    fn problem(&self) -> Problem {
        let (status, detail): (StatusCode, Cow<'static, str>) = match self {
            Answer::Malformed(why) => (StatusCode::BAD_REQUEST, Cow::Borrowed(*why)),
            Answer::ConnectRefused => (StatusCode::METHOD_NOT_ALLOWED, CONNECT_REFUSED.into()),
            Answer::Unauthorized(refusal) => (
                StatusCode::UNAUTHORIZED,
                format!("The bearer token was refused: {}.", refusal.as_str()).into(),
            ),
            Answer::Overloaded => {
                return Problem {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    kind: "urn:tollgate:problem:overloaded",
                    title: "Service Overloaded",
                    detail: concat!(
                        "The application is overloaded and this request was shed to keep it ",
                        "answering; retry after 1 second(s)."
                    )
                    .into(),
                }
            }
            Answer::Failed(error) => (error.status(), failure_detail(error)),
            Answer::StoreUnavailable => failed_store(),
            Answer::UsageMethod => (
                StatusCode::METHOD_NOT_ALLOWED,
                "the usage endpoint answers GET and HEAD".into(),
            ),
            Answer::UsageBusy {
                limit,
                window_secs,
                retry_secs,
            } => (
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "the usage endpoint answers at most {limit} requests per {window_secs}s from one client: retry after {retry_secs}s"
                )
                .into(),
            ),
            Answer::UsageUnreadable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "rate limiting state is unavailable, try again shortly".into(),
            ),
            Answer::Limited(..) => unreachable!("a limited answer is the configured one"),
        };
        Problem {
            status,
            kind: "about:blank",
            title: status.canonical_reason().unwrap_or("Error"),
            detail,
        }
    }

    /// Headers an answer carries besides its content type: `Allow` for a 405, `Retry-After`
    /// where a retry soon helps, the 401's challenge, `Connection: close` after a body left
    /// unread.
    fn add_headers(&self, headers: &mut HeaderMap) {
        match self {
            Answer::ConnectRefused => {
                headers.insert(header::ALLOW, HeaderValue::from_static(FORWARDED_METHODS));
            }
            Answer::UsageMethod => {
                headers.insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            }
            Answer::Overloaded | Answer::StoreUnavailable => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Answer::Failed(ProxyError::StoreUnavailable) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Answer::Failed(ProxyError::BodyTooLarge { .. }) => {
                // The rest of the body was not read: the connection cannot be reused.
                headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Answer::UsageBusy { retry_secs, .. } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(*retry_secs));
            }
            Answer::Unauthorized(refusal) => {
                let challenge = format!(
                    "Bearer error=\"invalid_token\", error_description=\"{}\"",
                    refusal.as_str()
                );
                if let Ok(value) = HeaderValue::from_str(&challenge) {
                    headers.insert(header::WWW_AUTHENTICATE, value);
                }
            }
            _ => {}
        }
    }

    /// The answer as a problem document or a line of text.
    fn problem_response(self, form: Form) -> Response<ProxyBody> {
        let problem = self.problem();
        let (content_type, body) = match form {
            Form::Text => (
                "text/plain; charset=utf-8",
                format!(
                    "{} {}: {}\n",
                    problem.status.as_u16(),
                    problem.title,
                    problem.detail
                )
                .into_bytes(),
            ),
            Form::Problem | Form::Grpc => {
                let document = serde_json::json!({
                    "type": problem.kind,
                    "title": problem.title,
                    "status": problem.status.as_u16(),
                    "detail": problem.detail,
                });
                let body = serde_json::to_vec(&document).expect("JSON values serialize");
                ("application/problem+json", body)
            }
        };
        let mut response = Response::new(body::full(body));
        *response.status_mut() = problem.status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        self.add_headers(headers);
        response
    }
}

/// What the client is told of an error: causes stay in the log, they can name internal hosts.
fn failure_detail(error: &ProxyError) -> Cow<'static, str> {
    match error {
        ProxyError::BadRequest(why) => Cow::Borrowed(*why),
        ProxyError::BodyTooLarge { limit } => {
            format!("the request body is limited to {limit} bytes").into()
        }
        ProxyError::UpstreamConnect(_) => "the upstream is unreachable".into(),
        ProxyError::Upstream(_) => "the upstream failed".into(),
        ProxyError::ClientBody(_) => "the request body is malformed or was cut off".into(),
        ProxyError::UpstreamTimeout(_) => "the upstream did not answer in time".into(),
        ProxyError::StoreUnavailable => failed_store().1,
    }
}

fn failed_store() -> (StatusCode, Cow<'static, str>) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "rate limiting is unavailable, try again shortly".into(),
    )
}

/// A limited response as the client receives it, rendered from what the limit stage found.
fn limited_response(config: &ResponseConfig, limited: &Limited<'_>) -> Response<ProxyBody> {
    let rendered = match &limited.denial {
        Denial::Decided(verdicts) => limit_headers::render_limited_with(
            config,
            limited.set,
            limited.policy.as_deref(),
            verdicts,
        ),
        Denial::Remembered { denial, at } => limit_headers::render_remembered(
            config,
            limited.set,
            denial.aged(*at),
            &denial.rendered,
        ),
    };
    let mut response = Response::new(body::full(rendered.body));
    *response.status_mut() = rendered.status;
    *response.headers_mut() = rendered.headers;
    response
}

/// An answer rendered for HTTP, as a gRPC call receives it (see `grpc`); `limited`: it is a
/// limited caller's (RESOURCE_EXHAUSTED whatever its configured status).
pub fn for_grpc(response: Response<ProxyBody>, limited: bool) -> Response<ProxyBody> {
    crate::grpc::translate(response, limited)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body;
    use std::time::Duration;

    fn accept(lines: &[&str]) -> Accept {
        let mut accept = Accept::default();
        for line in lines {
            accept.read(line.as_bytes());
        }
        accept
    }

    #[test]
    fn text_only_for_a_client_that_asks_for_text_and_no_json() {
        let form = |lines: &[&str]| Form::of(false, accept(lines));
        assert_eq!(form(&[]), Form::Problem);
        assert_eq!(form(&["*/*"]), Form::Problem);
        assert_eq!(form(&["text/plain"]), Form::Text);
        assert_eq!(form(&["Text/Plain; q=0.9, text/html"]), Form::Text);
        assert_eq!(form(&["text/plain", "application/json"]), Form::Problem);
        assert_eq!(
            form(&["text/plain, application/problem+json;q=0.5"]),
            Form::Problem
        );
        assert_eq!(Form::of(true, accept(&["text/plain"])), Form::Grpc);
    }

    /// A body tollgate made, read at once (it is all there).
    fn body_text(response: Response<ProxyBody>) -> String {
        use std::task::{Context, Poll, Waker};
        let mut body = response.into_body();
        let mut cx = Context::from_waker(Waker::noop());
        let mut bytes = Vec::new();
        while let Poll::Ready(Some(Ok(frame))) = std::pin::Pin::new(&mut body).poll_frame(&mut cx) {
            if let Some(data) = frame.data_ref() {
                bytes.extend_from_slice(data);
            }
        }
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn each_error_maps_to_one_status_as_a_problem_or_a_line() {
        let cases: Vec<(ProxyError, u16, &str)> = vec![
            (ProxyError::BadRequest("x"), 400, "client"),
            (ProxyError::BodyTooLarge { limit: 1 }, 413, "client"),
            (
                ProxyError::UpstreamConnect("refused".into()),
                502,
                "upstream",
            ),
            (ProxyError::Upstream("reset".into()), 502, "upstream"),
            (ProxyError::ClientBody("bad chunk".into()), 400, "client"),
            (
                ProxyError::UpstreamTimeout(Duration::from_secs(1)),
                504,
                "upstream",
            ),
            (ProxyError::StoreUnavailable, 503, "store"),
        ];
        for (error, status, side) in cases {
            assert_eq!(error.side().as_str(), side);
            let (chosen, response) = Answer::Failed(&error).render(Form::Problem);
            assert_eq!(chosen.as_u16(), status);
            assert_eq!(response.status().as_u16(), status);
            assert_eq!(
                response.headers()["content-type"],
                "application/problem+json"
            );
            let problem: serde_json::Value = serde_json::from_str(&body_text(response)).unwrap();
            assert_eq!(problem["status"], status);
            assert_eq!(problem["type"], "about:blank");
            let (_, response) = Answer::Failed(&error).render(Form::Text);
            assert_eq!(
                response.headers()["content-type"],
                "text/plain; charset=utf-8"
            );
            assert!(body_text(response).starts_with(&format!("{status} ")));
        }
        let (_, response) =
            Answer::Failed(&ProxyError::BodyTooLarge { limit: 10 }).render(Form::Text);
        assert_eq!(response.headers()["connection"], "close");
        assert_eq!(
            body_text(response),
            "413 Payload Too Large: the request body is limited to 10 bytes\n"
        );
    }

    #[test]
    fn refusals_are_problems_and_connect_names_what_is_allowed() {
        let (_, response) = Answer::ConnectRefused.render(Form::Problem);
        assert_eq!(response.status(), 405);
        assert_eq!(response.headers()["allow"], FORWARDED_METHODS);
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let (_, response) = Answer::Malformed("x").render(Form::Problem);
        assert_eq!(response.status(), 400);
        assert!(response.headers().get("allow").is_none());
        // The shed answer is the document it always was.
        let (_, response) = Answer::Overloaded.render(Form::Problem);
        assert_eq!(response.headers()["retry-after"], "1");
        assert_eq!(
            body_text(response),
            concat!(
                r#"{"detail":"The application is overloaded and this request was shed to keep it "#,
                r#"answering; retry after 1 second(s).","status":503,"title":"Service Overloaded","#,
                r#""type":"urn:tollgate:problem:overloaded"}"#
            )
        );
    }

    fn grpc_headers(response: &Response<ProxyBody>) -> (&str, &str, Option<&str>) {
        let h = response.headers();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(h["content-type"], "application/grpc");
        assert!(response.body().is_end_stream());
        (
            h["grpc-status"].to_str().unwrap(),
            h["grpc-message"].to_str().unwrap(),
            h.get("grpc-retry-pushback-ms").map(|v| v.to_str().unwrap()),
        )
    }

    /// Every error tollgate answers with, as a gRPC call receives it.
    #[test]
    fn own_errors_become_their_grpc_status_with_their_text() {
        let cases: Vec<(ProxyError, &str, &str, Option<&str>)> = vec![
            (
                ProxyError::StoreUnavailable,
                "14",
                "503 Service Unavailable: rate limiting is unavailable, try again shortly",
                Some("1000"),
            ),
            (
                ProxyError::BadRequest("the request target must be a path"),
                "13",
                "400 Bad Request: the request target must be a path",
                None,
            ),
            (
                ProxyError::BodyTooLarge { limit: 10 },
                "8",
                "413 Payload Too Large: the request body is limited to 10 bytes",
                None,
            ),
            (
                ProxyError::UpstreamConnect("refused".into()),
                "14",
                "502 Bad Gateway: the upstream is unreachable",
                None,
            ),
            (
                ProxyError::Upstream("reset".into()),
                "14",
                "502 Bad Gateway: the upstream failed",
                None,
            ),
            (
                ProxyError::UpstreamTimeout(Duration::from_secs(1)),
                "4",
                "504 Gateway Timeout: the upstream did not answer in time",
                None,
            ),
        ];
        for (error, code, text, pushback) in cases {
            let (status, translated) = Answer::Failed(&error).render(Form::Grpc);
            assert_eq!(status, error.status());
            assert_eq!(grpc_headers(&translated), (code, text, pushback), "{text}");
            // `Connection: close` (413) is HTTP/1's; HTTP/2 refuses it.
            assert!(translated.headers().get("connection").is_none());
            // Translated late (after the respond stage), the same.
            let (_, late) = Answer::Failed(&error).render(Form::Problem);
            let late = for_grpc(late, false);
            assert_eq!(grpc_headers(&late), (code, text, pushback), "{text}");
        }
    }
}

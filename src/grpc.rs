//! gRPC callers are answered in gRPC: when tollgate itself answers a gRPC request (it is
//! limited, the store is down under `on_error: deny`, the request is refused, the upstream
//! cannot be reached or does not answer in time), the HTTP response it would have sent becomes
//! a gRPC *trailers-only* response: HTTP 200, `content-type: application/grpc`, `grpc-status`
//! and `grpc-message` in the one HEADERS frame, and no body. `answers` renders those answers
//! and asks this module to translate them; `grpc-message` is a limited call's problem
//! `detail`, and for every other answer the line a `text/plain` client reads
//! (`STATUS Title: detail`).
//!
//! Why: a gRPC client reads its outcome from `grpc-status`. Given a bare HTTP 429 it falls
//! back to the spec's HTTP→gRPC table (grpc/doc/http-grpc-status-mapping.md), which turns 429
//! into UNAVAILABLE: the client would retry at once, as for a server restart, and never learn
//! that it was rate limited or for how long. Here a limited call is RESOURCE_EXHAUSTED and
//! carries `grpc-retry-pushback-ms`, the server pushback gRPC's retry design (gRFC A6) reads.
//!
//! Responses that come from the upstream are never translated: they are the application's
//! own gRPC answers (or its own HTTP errors), and `grpc-status` from it passes as it is.
//!
//! The mapping, HTTP status tollgate would send → gRPC status:
//!
//! | tollgate's answer | gRPC status | why |
//! | --- | --- | --- |
//! | limited (the configured status, 429 by default) | RESOURCE_EXHAUSTED (8) | gRPC's code for "some resource has been exhausted, perhaps a per-user quota"; the spec table's UNAVAILABLE would invite an immediate retry |
//! | 503, the store is down (`on_error: deny`) | UNAVAILABLE (14) | spec table; transient, and safe to retry: nothing reached the upstream |
//! | 503, the app is overloaded (`protect` shed the request) | UNAVAILABLE (14), with `grpc-retry-pushback-ms` | spec table; nothing reached the app, and the pushback spaces the retry |
//! | 400, the request cannot be forwarded | INTERNAL (13) | spec table: the HTTP request itself was malformed, not an argument of the call |
//! | 413, the body is over `max_request_body` | RESOURCE_EXHAUSTED (8) | what gRPC itself answers for a message over its size limit (the table has no 413) |
//! | 502, the upstream is unreachable or failed | UNAVAILABLE (14) | spec table; it is what a gRPC client reports itself when its connection fails |
//! | 504, the upstream sent no head in time | DEADLINE_EXCEEDED (4) | the call ran out of time while the upstream may have been working on it. The spec table says UNAVAILABLE, which retry policies replay by default; DEADLINE_EXCEEDED is what gRPC reports when a call may have been executed, so a non-idempotent call is not replayed blindly |
//! | any other status (none today) | the spec table (401→16, 403→7, 404→12, 429/502/503/504→14, else UNKNOWN 2) | |
//!
//! `Retry-After` becomes `grpc-retry-pushback-ms` (seconds × 1000). A limited call that no
//! wait can admit (it asks more than the limit holds at once, so tollgate sends no
//! `Retry-After`) gets a pushback of `-1`, which A6 defines as "do not retry". The RateLimit
//! fields (and `Retry-After`) stay as response metadata.
//!
//! Only `application/grpc`, `application/grpc+proto` and the like count: gRPC-Web
//! (`application/grpc-web…`) carries its trailers in the body and is left alone.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body::Body;

use crate::body::{empty, ProxyBody};

pub static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
pub static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
pub static GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The gRPC status codes tollgate can answer with (grpc/doc/statuscodes.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Unknown = 2,
    DeadlineExceeded = 4,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl Code {
    fn header_value(self) -> HeaderValue {
        HeaderValue::from(self as u16)
    }
}

/// True for a gRPC request: `content-type` is `application/grpc`, alone or followed by `+`
/// (a message format, `application/grpc+proto`) or `;` (parameters). Case-insensitive, as
/// media types are.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    let value = value.as_bytes();
    value.len() >= GRPC.len()
        && value[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(value.get(GRPC.len()), None | Some(b'+' | b';'))
}

/// The gRPC status for a response tollgate made itself with HTTP `status`; `limited` says the
/// response is a rate-limit denial (whose status is configurable, so it cannot be told from
/// the status alone). See the module docs for the reasons behind each row.
pub fn code_for(status: StatusCode, limited: bool) -> Code {
    if limited {
        return Code::ResourceExhausted;
    }
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        413 => Code::ResourceExhausted,
        504 => Code::DeadlineExceeded,
        429 | 502 | 503 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// `grpc-message` encoding (grpc/doc/PROTOCOL-HTTP2.md): the UTF-8 bytes, with every byte
/// outside printable ASCII (0x20–0x7E), and `%` itself, written as `%XX` in upper-case hex.
pub fn encode_message(message: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut encoded = String::with_capacity(message.len());
    for &byte in message.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            encoded.push(byte as char);
        } else {
            encoded.push('%');
            encoded.push(HEX[usize::from(byte >> 4)] as char);
            encoded.push(HEX[usize::from(byte & 0x0f)] as char);
        }
    }
    encoded
}

/// The trailers-only gRPC answer for tollgate's own response with `status`, `headers` and
/// body `text` (a problem+json document, or a line of plain text).
pub fn trailers_only(
    status: StatusCode,
    headers: &HeaderMap,
    text: &str,
    limited: bool,
) -> Response<ProxyBody> {
    let code = code_for(status, limited);
    let mut out = headers.clone();
    // The body goes, and with it what described it; the connection stays HTTP/2's business.
    out.remove(header::CONTENT_LENGTH);
    out.remove(header::CONNECTION);
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    out.insert(&GRPC_STATUS, code.header_value());
    let message = message(status, text, limited);
    if let Ok(value) = HeaderValue::from_str(&encode_message(&message)) {
        out.insert(&GRPC_MESSAGE, value);
    }
    match retry_after_secs(headers) {
        Some(secs) => {
            out.insert(
                &GRPC_RETRY_PUSHBACK_MS,
                HeaderValue::from(secs.saturating_mul(1000)),
            );
        }
        // A denial without Retry-After can never be admitted: A6 reads a negative pushback as
        // "do not retry".
        None if limited => {
            out.insert(&GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
        }
        None => {}
    }
    let mut response = Response::new(empty());
    *response.headers_mut() = out;
    response
}

/// [`trailers_only`] for a whole response tollgate made. Its body was built here in one
/// piece, so it is read at once, without waiting.
pub fn translate(response: Response<ProxyBody>, limited: bool) -> Response<ProxyBody> {
    let (parts, mut body) = response.into_parts();
    let text = ready_text(&mut body);
    trailers_only(parts.status, &parts.headers, &text, limited)
}

/// What of `body` is ready now, as text: all of it for the full bodies tollgate makes itself.
fn ready_text(body: &mut ProxyBody) -> String {
    let mut cx = Context::from_waker(Waker::noop());
    let mut bytes = BytesMut::new();
    while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut *body).poll_frame(&mut cx) {
        if let Some(data) = frame.data_ref() {
            bytes.extend_from_slice(data);
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The human-readable part: a denial's problem `detail`; for tollgate's other answers the line
/// a `text/plain` client reads (`STATUS Title: detail`, from the problem document or the text
/// itself); the status and its reason when neither is there.
fn message(status: StatusCode, text: &str, limited: bool) -> String {
    let problem = serde_json::from_str::<serde_json::Value>(text).ok();
    let field = |name: &str| {
        problem
            .as_ref()
            .and_then(|problem| problem.get(name)?.as_str().map(str::to_owned))
    };
    let detail = if limited {
        field("detail")
    } else if problem.is_some() {
        field("detail").map(|detail| {
            let title = field("title");
            let title = title
                .as_deref()
                .or(status.canonical_reason())
                .unwrap_or("error");
            format!("{} {title}: {detail}", status.as_u16())
        })
    } else {
        Some(text.trim().to_owned()).filter(|t| !t.is_empty())
    };
    detail.unwrap_or_else(|| {
        let reason = if limited {
            "Too Many Requests"
        } else {
            status.canonical_reason().unwrap_or("error")
        };
        format!("{} {reason}", status.as_u16())
    })
}

/// `Retry-After` as delta-seconds (the only form tollgate writes).
fn retry_after_secs(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn content_type(value: &'static str) -> HeaderMap {
        headers(&[("content-type", value)])
    }

    #[test]
    fn grpc_requests_are_told_by_their_content_type() {
        for grpc in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc+json",
            "application/grpc;charset=utf-8",
            "Application/GRPC",
        ] {
            assert!(is_grpc(&content_type(grpc)), "{grpc}");
        }
        for other in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/grpcx",
            "application/json",
            "application/grp",
            "",
        ] {
            assert!(!is_grpc(&content_type(other)), "{other}");
        }
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn each_own_status_maps_to_its_grpc_code() {
        let cases = [
            (429, true, Code::ResourceExhausted),
            // A denial is a denial whatever status it is configured with.
            (503, true, Code::ResourceExhausted),
            (503, false, Code::Unavailable),
            (400, false, Code::Internal),
            (413, false, Code::ResourceExhausted),
            (502, false, Code::Unavailable),
            (504, false, Code::DeadlineExceeded),
            // The spec table for the rest.
            (401, false, Code::Unauthenticated),
            (403, false, Code::PermissionDenied),
            (404, false, Code::Unimplemented),
            (429, false, Code::Unavailable),
            (500, false, Code::Unknown),
        ];
        for (status, limited, code) in cases {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(
                code_for(status, limited),
                code,
                "{status} limited={limited}"
            );
        }
        assert_eq!(Code::ResourceExhausted.header_value(), "8");
        assert_eq!(Code::Unauthenticated.header_value(), "16");
    }

    #[test]
    fn messages_are_percent_encoded_as_grpc_requires() {
        assert_eq!(encode_message("plain text; ok!"), "plain text; ok!");
        assert_eq!(encode_message("100%"), "100%25");
        assert_eq!(encode_message("a\nb\tc"), "a%0Ab%09c");
        // UTF-8 bytes one by one, upper-case hex.
        assert_eq!(encode_message("café ☕"), "caf%C3%A9 %E2%98%95");
        assert_eq!(encode_message("\x7f~ "), "%7F~ ");
    }

    fn grpc_headers(response: &Response<ProxyBody>) -> (&str, &str, Option<&str>) {
        let h = response.headers();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(h["content-type"], "application/grpc");
        assert!(response.body().is_end_stream(), "trailers-only: no body");
        (
            h["grpc-status"].to_str().unwrap(),
            h["grpc-message"].to_str().unwrap(),
            h.get("grpc-retry-pushback-ms").map(|v| v.to_str().unwrap()),
        )
    }

    #[test]
    fn a_denial_becomes_resource_exhausted_with_pushback_and_ratelimit_fields() {
        let mut response = Response::new(crate::body::full(
            r#"{"detail":"Too many requests for route `api`; retry after 9 second(s).","status":429}"#,
        ));
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        *response.headers_mut() = headers(&[
            ("content-type", "application/problem+json"),
            ("cache-control", "no-store"),
            ("retry-after", "9"),
            ("ratelimit", "\"api\";r=0;t=9"),
            ("ratelimit-policy", "\"api\";q=5;w=60"),
            ("x-ratelimit-remaining", "0"),
        ]);
        let translated = translate(response, true);
        let (status, message, pushback) = grpc_headers(&translated);
        assert_eq!(status, "8");
        assert_eq!(
            message,
            "Too many requests for route `api`; retry after 9 second(s)."
        );
        assert_eq!(pushback, Some("9000"));
        let h = translated.headers();
        assert_eq!(h["ratelimit"], "\"api\";r=0;t=9");
        assert_eq!(h["ratelimit-policy"], "\"api\";q=5;w=60");
        assert_eq!(h["x-ratelimit-remaining"], "0");
        assert_eq!(h["retry-after"], "9");
    }

    #[test]
    fn a_denial_no_wait_can_admit_says_do_not_retry() {
        let response = trailers_only(
            StatusCode::TOO_MANY_REQUESTS,
            &content_type("application/problem+json"),
            "not json",
            true,
        );
        let (status, message, pushback) = grpc_headers(&response);
        assert_eq!((status, message), ("8", "429 Too Many Requests"));
        assert_eq!(pushback, Some("-1"));
    }
}

//! Request shapes refused before routing, because no framework should see them and some would
//! route them where tollgate's routes do not look:
//!
//! - a method token that is a standard method in another case (`post`): methods are
//!   case-sensitive (RFC 9110 §9.1), yet some servers (werkzeug's) upper-case them and route
//!   `post` as `POST`, past a `methods: [POST]` route;
//! - a Host (or HTTP/2 `:authority`) with userinfo (`x@api.example.com`), a comma list, obs-text
//!   (bytes ≥ 0x80), a port that is not a number (`api.example.com:abc`, `:80:80`), a character
//!   no host name has, or more than one Host line: apps pick different parts of such a value
//!   than tollgate's host matching does (RFC 9112 §3.2 asks for 400);
//! - `CONNECT`: tollgate is a reverse proxy, not a tunnel to anywhere; 405 with `Allow`.
//!
//! Each is answered by `answers`, as every answer tollgate makes itself (a problem document
//! unless the client asked for text).

use http::request::Parts;
use http::{Method, StatusCode};

use super::headers::Found;
use crate::answers::Answer;

/// The standard methods (RFC 9110 §9 and PATCH), as they must be spelled.
const STANDARD_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// Why a request is refused before routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeRefusal {
    /// 400, with the reason the client is told.
    Malformed(&'static str),
    /// 405: CONNECT.
    Connect,
}

/// The refusal `request`'s shape calls for, if any (`found` is [`super::headers::scan`]'s pass
/// over its headers).
pub fn check(request: &Parts, found: &Found) -> Option<ShapeRefusal> {
    let method = &request.method;
    if *method == Method::CONNECT {
        return Some(ShapeRefusal::Connect);
    }
    // The standard methods are upper case: a token without a lower-case letter is either one of
    // them or no spelling of one (the common case, decided without comparing names).
    let name = method.as_str();
    if name.len() <= 7
        && name.bytes().any(|b| b.is_ascii_lowercase())
        && STANDARD_METHODS
            .iter()
            .any(|m| m.eq_ignore_ascii_case(name))
    {
        return Some(ShapeRefusal::Malformed(
            "the method must be spelled in upper case",
        ));
    }
    if found.host_lines > 1 {
        return Some(ShapeRefusal::Malformed(
            "the request has more than one Host",
        ));
    }
    if let Some(host) = &found.host {
        if let Some(why) = bad_host(host.as_bytes()) {
            return Some(ShapeRefusal::Malformed(why));
        }
    }
    if let Some(authority) = request.uri.authority() {
        if let Some(why) = bad_host(authority.as_str().as_bytes()) {
            return Some(ShapeRefusal::Malformed(why));
        }
    }
    None
}

/// Why a Host value is no `host[:port]` as apps read it, if it is not (see
/// [`crate::routing::host_name`]: route matching reads the host with the same function).
fn bad_host(host: &[u8]) -> Option<&'static str> {
    crate::routing::host_name(host).err()
}

impl ShapeRefusal {
    pub fn status(self) -> StatusCode {
        match self {
            ShapeRefusal::Malformed(_) => StatusCode::BAD_REQUEST,
            ShapeRefusal::Connect => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// What the client is told (the problem's `detail`; `tollgate explain` says it too).
    pub fn detail(self) -> &'static str {
        match self {
            ShapeRefusal::Malformed(why) => why,
            ShapeRefusal::Connect => crate::answers::CONNECT_REFUSED,
        }
    }

    /// The answer (see `answers`); a 405 names the methods tollgate forwards in `Allow`.
    pub fn answer(self) -> Answer<'static> {
        match self {
            ShapeRefusal::Malformed(why) => Answer::Malformed(why),
            ShapeRefusal::Connect => Answer::ConnectRefused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, Request};

    fn refusal(request: http::request::Builder) -> Option<ShapeRefusal> {
        let (parts, ()) = request.body(()).unwrap().into_parts();
        let found = super::super::headers::scan(&parts.headers);
        check(&parts, &found)
    }

    #[test]
    fn standard_methods_in_another_case_are_refused_and_other_tokens_pass() {
        for method in ["post", "Get", "pOST", "delete", "patch"] {
            let request = Request::builder().method(method).uri("/");
            assert!(
                matches!(refusal(request), Some(ShapeRefusal::Malformed(_))),
                "{method}"
            );
        }
        for method in ["GET", "POST", "PROPFIND", "purge", "M-SEARCH"] {
            let request = Request::builder().method(method).uri("/");
            assert_eq!(refusal(request), None, "{method}");
        }
        let connect = Request::builder().method("CONNECT").uri("example.com:443");
        assert_eq!(refusal(connect), Some(ShapeRefusal::Connect));
    }

    #[test]
    fn hosts_with_userinfo_lists_or_obs_text_are_refused() {
        for host in [
            &b"x@api.example.com"[..],
            b"api.example.com, evil.example",
            b"api.\xe9xample.com",
        ] {
            let request = Request::builder()
                .uri("/")
                .header("host", HeaderValue::from_bytes(host).unwrap());
            assert!(
                matches!(refusal(request), Some(ShapeRefusal::Malformed(_))),
                "{host:?}"
            );
        }
        let two = Request::builder()
            .uri("/")
            .header("host", "a.example")
            .header("host", "b.example");
        assert!(matches!(refusal(two), Some(ShapeRefusal::Malformed(_))));
        let authority = Request::builder().uri("http://x@api.example.com/login");
        assert!(matches!(
            refusal(authority),
            Some(ShapeRefusal::Malformed(_))
        ));
        // Issue 38: a name for a port, several colons, characters no host name has.
        for host in [
            "api.example.com:abc",
            "api.example.com:80:80",
            "api.example.com:x:y",
            "[::1]:abc",
            "api.example.com/x",
        ] {
            let request = Request::builder().uri("/").header("host", host);
            assert!(
                matches!(refusal(request), Some(ShapeRefusal::Malformed(_))),
                "{host}"
            );
        }
        let authority = Request::builder().uri("http://api.example.com:abc/h");
        assert!(matches!(
            refusal(authority),
            Some(ShapeRefusal::Malformed(_))
        ));
        for fine in [
            "api.example.com",
            "api.example.com:8443",
            "api.example.com:",
            "[::1]:80",
            "api.example.com.",
        ] {
            let request = Request::builder().uri("/").header("host", fine);
            assert_eq!(refusal(request), None, "{fine}");
        }
    }
}

//! Which route a request belongs to: routes are tried in file order and the first whose
//! path prefix, methods, host and headers (`match.headers`: exact values, names
//! case-insensitive) all match wins. No match means the request is forwarded
//! unlimited.
//!
//! Path prefixes are plain string prefixes of the request path (as nginx and Traefik do): write
//! `/api/` rather than `/api` unless `/apikeys` should match too. The path is normalised for
//! matching (and only for matching: the upstream gets it as sent): percent-encoded unreserved
//! characters decoded, repeated slashes collapsed, `.` and `..` segments resolved — otherwise
//! `//login` or `/%6Cogin` would slip past a `/login` limit while the app serves them as
//! `/login`.

use std::borrow::Cow;
use std::sync::Arc;

use http::header;
use http::request::Parts;

use crate::config::Route;

/// What the route stage adds to a request: the route it matched and that route's place in
/// the configuration's order (per-route state, such as its metrics, is kept in that order).
#[derive(Debug, Clone, Copy)]
pub struct Routed<'c> {
    pub index: usize,
    pub route: &'c Arc<Route>,
}

/// The route stage: the first route matching `request`, or None (forwarded unlimited).
pub fn route<'c>(routes: &'c [Arc<Route>], request: &Parts) -> Option<Routed<'c>> {
    position(routes, request).map(|index| Routed {
        index,
        route: &routes[index],
    })
}

/// The index of the first route matching `request`.
pub fn position(routes: &[Arc<Route>], request: &Parts) -> Option<usize> {
    // Only a route with a host pattern needs the host: skip the allocation otherwise.
    let host = if routes.iter().any(|r| r.host.is_some()) {
        request_host(request)
    } else {
        None
    };
    let path = normalize_path(request.uri.path());
    routes
        .iter()
        .position(|route| matches(route, &path, request, host.as_deref()))
}

/// The path as an app would route it (see the module docs). Borrowed when already normal.
pub fn normalize_path(path: &str) -> Cow<'_, str> {
    if !needs_normalizing(path) {
        return Cow::Borrowed(path);
    }
    let decoded = decode_unreserved(path);
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            other => segments.push(other),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if out.is_empty()
        || decoded.ends_with('/')
        || decoded.ends_with("/.")
        || decoded.ends_with("/..")
    {
        out.push('/');
    }
    Cow::Owned(out)
}

/// True if `path` has an empty, `.` or `..` segment after the first, or a `%`: the cases
/// [`normalize_path`] changes. One pass over the bytes, since every routed request asks.
fn needs_normalizing(path: &str) -> bool {
    let bytes = path.as_bytes();
    let mut segment_start = 0;
    for i in 0..=bytes.len() {
        let at_end = i == bytes.len();
        if !at_end && bytes[i] == b'%' {
            return true;
        }
        if at_end || bytes[i] == b'/' {
            let segment = &bytes[segment_start..i];
            if segment == b"." || segment == b".." {
                return true;
            }
            // "//": an empty segment that is not the one before the leading slash.
            if !at_end && i > 0 && bytes[i - 1] == b'/' {
                return true;
            }
            segment_start = i + 1;
        }
    }
    false
}

/// Decodes `%XX` where XX is an unreserved character (RFC 3986 §2.3); every other escape, such
/// as `%2F`, stays as it is because decoding it would change the path's structure.
fn decode_unreserved(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(value) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                if value.is_ascii_alphanumeric() || matches!(value, b'-' | b'.' | b'_' | b'~') {
                    out.push(value as char);
                    i += 3;
                    continue;
                }
            }
        }
        out.push(bytes[i] as char);
        i += 1;
    }
    out
}

fn matches(route: &Route, path: &str, request: &Parts, host: Option<&str>) -> bool {
    if let Some(prefix) = &route.path_prefix {
        if !path.starts_with(prefix.as_str()) {
            return false;
        }
    }
    if let Some(methods) = &route.methods {
        if !methods.contains(&request.method) {
            return false;
        }
    }
    for (name, value) in &route.headers {
        if request.headers.get(name) != Some(value) {
            return false;
        }
    }
    if let Some(pattern) = &route.host {
        let Some(host) = host else { return false };
        let matched = match pattern.strip_prefix("*.") {
            Some(domain) => host
                .strip_suffix(domain)
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            None => host == pattern,
        };
        if !matched {
            return false;
        }
    }
    true
}

/// The host the client asked for, lower-cased, without port: the Host header (HTTP/1.1) or
/// the URI authority (HTTP/2).
fn request_host(request: &Parts) -> Option<String> {
    let raw = match request
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
    {
        Some(host) => host,
        None => request.uri.authority()?.as_str(),
    };
    let without_port = match raw.rsplit_once(':') {
        // `[::1]:8080` or `example.com:8080`, but not a bare IPv6 literal.
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !host.ends_with(':') => {
            host
        }
        _ => raw,
    };
    Some(without_port.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Method, Request};

    #[test]
    fn the_one_pass_check_agrees_with_the_plain_definition() {
        // Every string of up to 6 bytes over the characters that matter.
        fn plain(path: &str) -> bool {
            path.contains("//")
                || path.contains('%')
                || path.split('/').any(|s| s == "." || s == "..")
        }
        let alphabet = ['/', '.', '%', 'a'];
        let mut paths = vec![String::new()];
        for _ in 0..6 {
            let longer: Vec<String> = paths
                .iter()
                .filter(|p| p.len() == paths.last().map_or(0, |l| l.len()))
                .flat_map(|p| alphabet.iter().map(move |c| format!("{p}{c}")))
                .collect();
            paths.extend(longer);
        }
        assert_eq!(paths.len(), 1 + 4 + 16 + 64 + 256 + 1024 + 4096);
        for path in &paths {
            assert_eq!(needs_normalizing(path), plain(path), "{path:?}");
        }
    }

    fn route(
        name: &str,
        prefix: Option<&str>,
        methods: Option<&[Method]>,
        host: Option<&str>,
    ) -> Arc<Route> {
        Arc::new(Route {
            name: name.into(),
            path_prefix: prefix.map(Into::into),
            methods: methods.map(|m| m.to_vec()),
            host: host.map(Into::into),
            headers: vec![],
            limits: crate::config::LimitSet::new(name, None, vec![], true),
            allow: Default::default(),
            overrides: vec![],
        })
    }

    fn parts(method: Method, uri: &str, host: Option<&str>) -> Parts {
        let mut builder = Request::builder().method(method).uri(uri);
        if let Some(host) = host {
            builder = builder.header("host", host);
        }
        builder.body(()).unwrap().into_parts().0
    }

    fn found(routes: &[Arc<Route>], p: &Parts) -> Option<String> {
        super::route(routes, p).map(|r| r.route.name.clone())
    }

    #[test]
    fn first_match_wins_in_file_order() {
        let routes = vec![
            route("login", Some("/login"), Some(&[Method::POST]), None),
            route(
                "posts",
                Some("/api/posts/"),
                Some(&[Method::POST, Method::PUT]),
                None,
            ),
            route("api", Some("/api/"), None, None),
        ];
        assert_eq!(
            found(&routes, &parts(Method::POST, "/login", None)).as_deref(),
            Some("login")
        );
        assert_eq!(found(&routes, &parts(Method::GET, "/login", None)), None);
        assert_eq!(
            found(&routes, &parts(Method::PUT, "/api/posts/1", None)).as_deref(),
            Some("posts")
        );
        assert_eq!(
            found(&routes, &parts(Method::GET, "/api/posts/1", None)).as_deref(),
            Some("api")
        );
        assert_eq!(found(&routes, &parts(Method::GET, "/apix", None)), None);
        assert_eq!(found(&routes, &parts(Method::GET, "/", None)), None);
    }

    #[test]
    fn paths_are_normalised_for_matching_so_limits_cannot_be_dodged() {
        assert_eq!(normalize_path("/login"), "/login");
        assert!(matches!(normalize_path("/api/x"), Cow::Borrowed(_)));
        assert_eq!(normalize_path("//login"), "/login");
        assert_eq!(normalize_path("/%6Cogin"), "/login");
        assert_eq!(normalize_path("/%6cogin/"), "/login/");
        assert_eq!(normalize_path("/api/../login"), "/login");
        assert_eq!(normalize_path("/./login"), "/login");
        assert_eq!(normalize_path("/a/b/.."), "/a/");
        assert_eq!(normalize_path("/../../"), "/");
        assert_eq!(
            normalize_path("/a%2Fb"),
            "/a%2Fb",
            "an encoded slash stays encoded"
        );
        assert_eq!(normalize_path("/bad%zz%"), "/bad%zz%");
        let routes = vec![route("login", Some("/login"), None, None)];
        for dodge in ["//login", "/%6Cogin", "/x/../login", "/./login"] {
            assert_eq!(
                found(&routes, &parts(Method::GET, dodge, None)).as_deref(),
                Some("login"),
                "{dodge}"
            );
        }
    }

    #[test]
    fn host_matches_exactly_or_by_wildcard_ignoring_port_and_case() {
        let routes = vec![
            route("exact", None, None, Some("api.example.com")),
            route("wild", None, None, Some("*.example.com")),
        ];
        assert_eq!(
            found(
                &routes,
                &parts(Method::GET, "/", Some("API.example.com:8443"))
            )
            .as_deref(),
            Some("exact")
        );
        assert_eq!(
            found(&routes, &parts(Method::GET, "/", Some("a.b.example.com"))).as_deref(),
            Some("wild")
        );
        assert_eq!(
            found(&routes, &parts(Method::GET, "/", Some("example.com"))),
            None
        );
        assert_eq!(
            found(&routes, &parts(Method::GET, "/", Some("badexample.com"))),
            None
        );
        assert_eq!(
            found(
                &routes,
                &parts(Method::GET, "http://api.example.com/x", None)
            )
            .as_deref(),
            Some("exact")
        );
        assert_eq!(found(&routes, &parts(Method::GET, "/", None)), None);
    }
}

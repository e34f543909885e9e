//! Which route a request belongs to: routes are tried in file order and the first whose
//! path prefix, methods, host and headers (`match.headers`: exact values, names
//! case-insensitive) all match wins. No match means the request is forwarded
//! unlimited.
//!
//! Path prefixes are plain string prefixes of the request path (as nginx and Traefik do): write
//! `/api/` rather than `/api` unless `/apikeys` should match too. The path is normalised for
//! matching, and only for matching (the upstream gets it as sent), into every spelling a common
//! framework routes to the same handler; otherwise `//login` or `/%6Cogin` would slip past a
//! `/login` limit while the app serves them as `/login`:
//!
//! - percent-encoded unreserved characters decoded (`/%6Cogin`), and `%2F`, `%5C` and `\` read
//!   as `/` (Flask on werkzeug and gunicorn decode `%2F` before routing; IIS and ASP.NET take
//!   `\` for `/`);
//! - `;` path parameters dropped from each segment (`/;x=1/login`, `/.;/login`,
//!   `/a/..;/login`: Tomcat and Jetty strip them before routing);
//! - repeated slashes collapsed, `.` and `..` segments resolved;
//! - with `match.case: insensitive`, ASCII letters compared without case (Express by default,
//!   ASP.NET).
//!
//! A `methods: [GET]` route matches `HEAD` too (Express, Flask, Rails and Spring answer HEAD
//! with the GET handler), and the Host is compared without port or trailing dot.

use std::borrow::Cow;
use std::sync::Arc;

use http::request::Parts;
use http::{header, Method};

use crate::config::{MatchCase, Route};

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

/// The routes a request counts against: the one it is routed to (the route of its own method,
/// else of a method it names in an override), then every other route a method it names
/// reaches (see [`method_override_positions`]), each once, in the order found.
pub fn routes_of<'c>(
    routes: &'c [Arc<Route>],
    request: &Parts,
) -> (Option<Routed<'c>>, Vec<Routed<'c>>) {
    let own = position(routes, request);
    let mut also = method_override_positions(routes, request, own);
    let first = own.or_else(|| (!also.is_empty()).then(|| also.remove(0)));
    let routed = |index: usize| Routed {
        index,
        route: &routes[index],
    };
    (first.map(routed), also.into_iter().map(routed).collect())
}

/// The most methods looked at per place a request may name them (the headers, each query
/// field): more is no app's spelling.
const MAX_NAMED: usize = 8;

/// Routes reached by the methods a request names in `X-HTTP-Method-Override`,
/// `X-HTTP-Method`, `X-Method-Override` (every line, every comma-separated entry, as apps
/// upper-case them) or a route's `method_override.query` field, other than `own` (the route
/// of its own method): for each method named, the first route that matches the request with
/// that method. A route with `methods` is reached so only when its `method_override` reads
/// where the method was named; a route without `methods` matches every method anyway. Empty
/// (no allocation, no header looked up) when no route with `methods` reads overrides.
pub fn method_override_positions(
    routes: &[Arc<Route>],
    request: &Parts,
    own: Option<usize>,
) -> Vec<usize> {
    let reads = |r: &Arc<Route>| r.methods.is_some() && r.method_override.is_on();
    if !routes.iter().any(reads) {
        return Vec::new();
    }
    // The methods named in the headers, and in each query field some route reads.
    let mut in_headers: Vec<Method> = Vec::new();
    if routes.iter().any(|r| reads(r) && r.method_override.headers) {
        for name in crate::config::METHOD_OVERRIDE_HEADERS {
            for value in request.headers.get_all(name) {
                named_methods(value.as_bytes(), &request.method, &mut in_headers);
            }
        }
    }
    let mut in_fields: Vec<(&str, Vec<Method>)> = Vec::new();
    if let Some(query) = request.uri.query() {
        for route in routes.iter().filter(|r| reads(r)) {
            let Some(field) = route.method_override.query.as_deref() else {
                continue;
            };
            if in_fields.iter().any(|(f, _)| *f == field) {
                continue;
            }
            let mut methods = Vec::new();
            for value in crate::identity::query_values(query, field) {
                named_methods(&value, &request.method, &mut methods);
            }
            in_fields.push((field, methods));
        }
    }
    let mut named: Vec<&Method> = in_headers.iter().collect();
    for method in in_fields.iter().flat_map(|(_, methods)| methods) {
        if !named.contains(&method) {
            named.push(method);
        }
    }
    if named.is_empty() {
        return Vec::new();
    }
    let host = if routes.iter().any(|r| r.host.is_some()) {
        request_host(request)
    } else {
        None
    };
    let path = normalize_path(request.uri.path());
    let mut lower: Option<String> = None;
    let mut found: Vec<usize> = Vec::new();
    for method in named {
        let reached = routes.iter().position(|route| {
            let path = match route.case {
                MatchCase::Sensitive => &*path,
                MatchCase::Insensitive => lower.get_or_insert_with(|| path.to_ascii_lowercase()),
            };
            if !matches_except_method(route, path, request, host.as_deref()) {
                return false;
            }
            let Some(methods) = &route.methods else {
                return true;
            };
            let o = &route.method_override;
            let by_header = o.headers && in_headers.contains(method);
            let by_query = o.query.as_deref().is_some_and(|field| {
                in_fields
                    .iter()
                    .any(|(f, m)| *f == field && m.contains(method))
            });
            (by_header || by_query) && method_matches(methods, method)
        });
        if let Some(index) = reached {
            if Some(index) != own && !found.contains(&index) {
                found.push(index);
            }
        }
    }
    found
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
    // Lower-cased once, and only if a route ignores case.
    let mut lower: Option<String> = None;
    routes.iter().position(|route| {
        let path = match route.case {
            MatchCase::Sensitive => &*path,
            MatchCase::Insensitive => lower.get_or_insert_with(|| path.to_ascii_lowercase()),
        };
        matches(route, path, request, host.as_deref())
    })
}

/// The path as an app would route it (see the module docs). Borrowed when already normal.
pub fn normalize_path(path: &str) -> Cow<'_, str> {
    if !needs_normalizing(path) {
        return Cow::Borrowed(path);
    }
    let decoded = decode_for_matching(path);
    let mut segments: Vec<&str> = Vec::new();
    let mut last = "";
    for segment in decoded.split('/') {
        // `;` starts a segment's path parameters (RFC 3986 §3.3), which Tomcat drops.
        let segment = segment.split_once(';').map_or(segment, |(name, _)| name);
        last = segment;
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
    if out.is_empty() || matches!(last, "" | "." | "..") {
        out.push('/');
    }
    Cow::Owned(out)
}

/// True if `path` has an empty, `.` or `..` segment after the first, a `%`, a `\` or a `;`: the
/// cases [`normalize_path`] changes. One pass over the bytes, since every routed request asks.
fn needs_normalizing(path: &str) -> bool {
    let bytes = path.as_bytes();
    let mut segment_start = 0;
    for i in 0..=bytes.len() {
        let at_end = i == bytes.len();
        if !at_end && matches!(bytes[i], b'%' | b'\\' | b';') {
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

/// Decodes `%XX` where XX is an unreserved character (RFC 3986 §2.3), and reads `%2F`, `%5C`
/// and `\` as `/`: apps that decode those before routing see a separator there. Every other
/// escape stays as it is.
fn decode_for_matching(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(value) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                if value.is_ascii_alphanumeric() || matches!(value, b'-' | b'.' | b'_' | b'~') {
                    out.push(value);
                    i += 3;
                    continue;
                }
                if matches!(value, b'/' | b'\\') {
                    out.push(b'/');
                    i += 3;
                    continue;
                }
            }
        }
        out.push(if bytes[i] == b'\\' { b'/' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

fn matches(route: &Route, path: &str, request: &Parts, host: Option<&str>) -> bool {
    if let Some(methods) = &route.methods {
        if !method_matches(methods, &request.method) {
            return false;
        }
    }
    matches_except_method(route, path, request, host)
}

/// Adds to `into` each method named in an override `value` (comma-separated entries, as
/// apps upper-case them) that is not `own` nor already there, up to [`MAX_NAMED`]. An entry is
/// trimmed as apps trim it: Express's method-override uses JS `trim()`, which drops U+00A0 of
/// the Latin-1 decoded header too, so `GET\xa0` names GET ([`crate::identity::trim_wide`]),
/// and of a decoded query field's UTF-8 (`_method=GET%C2%A0`).
fn named_methods(value: &[u8], own: &Method, into: &mut Vec<Method>) {
    for entry in value.split(|&b| b == b',') {
        if into.len() >= MAX_NAMED {
            return;
        }
        // A query field's value is UTF-8 to apps, whose `trim()` drops any Unicode whitespace
        // (JS: U+FEFF too); a header's is Latin-1. Trimming more than an app would only counts
        // more.
        let entry = match std::str::from_utf8(entry) {
            Ok(text) => text
                .trim_matches(|c: char| c.is_whitespace() || c == '\u{feff}')
                .as_bytes(),
            Err(_) => crate::identity::trim_wide(entry),
        };
        let Ok(method) = Method::from_bytes(&entry.to_ascii_uppercase()) else {
            continue;
        };
        if method != *own && !into.contains(&method) {
            into.push(method);
        }
    }
}

/// `method` is one of `methods`, or HEAD where GET is (HEAD is GET without the body: apps
/// answer it with their GET handler).
fn method_matches(methods: &[Method], method: &Method) -> bool {
    methods.contains(method) || (*method == Method::HEAD && methods.contains(&Method::GET))
}

/// Everything of [`matches`] but the method.
fn matches_except_method(route: &Route, path: &str, request: &Parts, host: Option<&str>) -> bool {
    if let Some(prefix) = &route.path_prefix {
        if !path.starts_with(prefix.as_str()) {
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

/// The host the client asked for, lower-cased, without port or trailing dot: the Host header
/// (HTTP/1.1) or the URI authority (HTTP/2), read by [`host_name`]. None for a value that is no
/// `host[:port]` (the request path refuses those before routing, see `proxy::shape`).
fn request_host(request: &Parts) -> Option<String> {
    let raw = match request.headers.get(header::HOST) {
        Some(host) => host.as_bytes(),
        None => request.uri.authority()?.as_str().as_bytes(),
    };
    let name = host_name(raw).ok()?;
    // `api.example.com.` is the fully qualified spelling of `api.example.com`.
    let name = name.strip_suffix(b".").unwrap_or(name);
    // Only ASCII passed `host_name`.
    Some(String::from_utf8_lossy(name).to_ascii_lowercase())
}

/// The host of a Host (or `:authority`) value, as apps read it: `host[:port]`, the port
/// numeric or empty (`api.example.com:` is `api.example.com`), the host a name of letters,
/// digits, `-`, `.`, `_` and `~` (a DNS name or an IPv4 address) or a bracketed IPv6 literal
/// (`[::1]:8080`). An empty value is an empty host. Anything else is no host, and why: Express
/// cuts `api.example.com:abc` at the first `:` and serves `api.example.com`, while a reading
/// of the whole value would match no host route, so such values are refused, never guessed.
pub fn host_name(raw: &[u8]) -> Result<&[u8], &'static str> {
    // The bytes whose meaning differs most between readers, wherever they are.
    if let Some(why) = raw.iter().find_map(|b| match b {
        b'@' => Some("the Host must not carry userinfo"),
        b',' => Some("the Host must name one host"),
        0x80.. => Some("the Host must be ASCII"),
        _ => None,
    }) {
        return Err(why);
    }
    let (name, port) = match raw.first() {
        Some(b'[') => {
            let close = raw
                .iter()
                .position(|&b| b == b']')
                .ok_or("the Host's IPv6 address is not closed")?;
            let literal = std::str::from_utf8(&raw[1..close]).unwrap_or("");
            if literal.parse::<std::net::Ipv6Addr>().is_err() {
                return Err("the Host's IPv6 address is malformed");
            }
            let port = match &raw[close + 1..] {
                [] => None,
                [b':', port @ ..] => Some(port),
                _ => return Err("the Host must be host[:port]"),
            };
            (&raw[..=close], port)
        }
        _ => {
            let (name, port) = match raw.iter().position(|&b| b == b':') {
                Some(colon) => (&raw[..colon], Some(&raw[colon + 1..])),
                None => (raw, None),
            };
            let name_byte =
                |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~');
            if !name.iter().all(name_byte) {
                return Err(
                    "the Host must be a host name, an IPv4 address or a bracketed IPv6 address",
                );
            }
            if name.is_empty() && port.is_some() {
                return Err("the Host must name a host");
            }
            (name, port)
        }
    };
    if port.is_some_and(|port| !port.iter().all(u8::is_ascii_digit)) {
        return Err("the Host's port must be a number");
    }
    Ok(name)
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
                || path.contains(['%', '\\', ';'])
                || path.split('/').any(|s| s == "." || s == "..")
        }
        let alphabet = ['/', '.', '%', 'a', '\\', ';'];
        let mut paths = vec![String::new()];
        for _ in 0..6 {
            let longer: Vec<String> = paths
                .iter()
                .filter(|p| p.len() == paths.last().map_or(0, |l| l.len()))
                .flat_map(|p| alphabet.iter().map(move |c| format!("{p}{c}")))
                .collect();
            paths.extend(longer);
        }
        assert_eq!(paths.len(), (0..=6).map(|n| 6usize.pow(n)).sum::<usize>());
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
        route_with_case(name, prefix, methods, host, MatchCase::Sensitive)
    }

    fn route_with_case(
        name: &str,
        prefix: Option<&str>,
        methods: Option<&[Method]>,
        host: Option<&str>,
        case: MatchCase,
    ) -> Arc<Route> {
        Arc::new(Route {
            name: name.into(),
            path_prefix: prefix.map(Into::into),
            methods: methods.map(|m| m.to_vec()),
            host: host.map(Into::into),
            case,
            upgrades: vec!["websocket".into()],
            headers: vec![],
            limits: crate::config::LimitSet::new(name, None, vec![], true),
            allow: Default::default(),
            tiers: vec![],
            method_override: Default::default(),
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
        assert_eq!(normalize_path("/bad%zz%"), "/bad%zz%");
        assert_eq!(
            normalize_path("/a%3Fb%25"),
            "/a%3Fb%25",
            "other escapes stay"
        );
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

    /// Every spelling issue 31 found an app routing to `/login` while tollgate did not.
    #[test]
    fn encoded_separators_and_path_parameters_are_read_as_apps_read_them() {
        for (sent, matched) in [
            ("/%2flogin", "/login"),
            ("/%2Flogin", "/login"),
            ("/%5Clogin", "/login"),
            ("/\\login", "/login"),
            ("/a\\..\\login", "/login"),
            ("/;x=1/login", "/login"),
            ("/.;/login", "/login"),
            ("/a/..;/login", "/login"),
            ("/login;jsessionid=1", "/login"),
            ("/login/;x", "/login/"),
            ("/api/x%2F..%2F..%2Flogin", "/login"),
            ("/a%2fb", "/a/b"),
            ("/%2E%2E/login", "/login"),
        ] {
            assert_eq!(normalize_path(sent), matched, "{sent}");
        }
        let routes = vec![route("login", Some("/login"), Some(&[Method::POST]), None)];
        for dodge in [
            "/%2flogin",
            "/;x=1/login",
            "/.;/login",
            "/a/..;/login",
            "/%5clogin",
        ] {
            assert_eq!(
                found(&routes, &parts(Method::POST, dodge, None)).as_deref(),
                Some("login"),
                "{dodge}"
            );
        }
    }

    #[test]
    fn an_insensitive_route_matches_any_case_and_a_sensitive_one_only_its_own() {
        let routes = vec![
            route_with_case("login", Some("/login"), None, None, MatchCase::Insensitive),
            route("Admin", Some("/Admin"), None, None),
        ];
        for sent in ["/LOGIN", "/Login/", "/%4cOGIN", "/login"] {
            assert_eq!(
                found(&routes, &parts(Method::GET, sent, None)).as_deref(),
                Some("login"),
                "{sent}"
            );
        }
        assert_eq!(
            found(&routes, &parts(Method::GET, "/Admin/x", None)).as_deref(),
            Some("Admin")
        );
        assert_eq!(found(&routes, &parts(Method::GET, "/admin/x", None)), None);
    }

    #[test]
    fn a_get_route_matches_head_and_nothing_else_does() {
        let routes = vec![
            route("report", Some("/report"), Some(&[Method::GET]), None),
            route("form", Some("/form"), Some(&[Method::POST]), None),
        ];
        assert_eq!(
            found(&routes, &parts(Method::HEAD, "/report", None)).as_deref(),
            Some("report")
        );
        assert_eq!(found(&routes, &parts(Method::HEAD, "/form", None)), None);
        assert_eq!(
            found(&routes, &parts(Method::OPTIONS, "/report", None)),
            None
        );
    }

    #[test]
    fn a_trailing_dot_names_the_same_host() {
        let routes = vec![
            route("exact", None, None, Some("api.example.com")),
            route("wild", None, None, Some("*.example.org")),
        ];
        for (host, expected) in [
            ("api.example.com.", Some("exact")),
            ("API.example.com.:443", Some("exact")),
            ("a.example.org.", Some("wild")),
            ("api.example.com..", None),
        ] {
            assert_eq!(
                found(&routes, &parts(Method::GET, "/", Some(host))).as_deref(),
                expected,
                "{host}"
            );
        }
    }

    /// Issue 38: the host is read as apps read `host[:port]`; anything else is no host (the
    /// request path refuses it before routing), never a host that matches no route.
    #[test]
    fn a_host_is_host_and_numeric_port_or_nothing() {
        for (raw, name) in [
            ("api.example.com", "api.example.com"),
            ("api.example.com:8080", "api.example.com"),
            ("api.example.com:", "api.example.com"),
            ("API.example.com.:443", "API.example.com."),
            ("10.0.0.1:80", "10.0.0.1"),
            ("[::1]", "[::1]"),
            ("[::1]:8080", "[::1]"),
            ("[2001:db8::1]:", "[2001:db8::1]"),
            ("", ""),
        ] {
            assert_eq!(host_name(raw.as_bytes()), Ok(name.as_bytes()), "{raw}");
        }
        for raw in [
            "api.example.com:abc",
            "api.example.com:80:80",
            "api.example.com:x:y",
            "api.example.com:80x",
            "api.example.com: 80",
            ":80",
            "::1",
            "[::1",
            "[::1]x",
            "[::1]:x",
            "[::1]:80:80",
            "[not-v6]:80",
            "[fe80::1%25eth0]",
            "api.example.com/x",
            "api example.com",
            "api.example.com\\x",
            "api%2eexample.com",
            "x@api.example.com",
            "a.example, b.example",
        ] {
            assert!(host_name(raw.as_bytes()).is_err(), "{raw}");
        }
        let routes = vec![route("exact", None, None, Some("api.example.com"))];
        assert_eq!(
            found(&routes, &parts(Method::GET, "/", Some("api.example.com:"))).as_deref(),
            Some("exact")
        );
        let v6 = vec![route("v6", None, None, Some("[::1]"))];
        assert_eq!(
            found(&v6, &parts(Method::GET, "/", Some("[::1]:8080"))).as_deref(),
            Some("v6")
        );
        assert_eq!(
            found(
                &routes,
                &parts(Method::GET, "/", Some("api.example.com:abc"))
            ),
            None
        );
    }

    fn with_override(route: Arc<Route>, o: crate::config::MethodOverride) -> Arc<Route> {
        let mut route = (*route).clone();
        route.method_override = o;
        Arc::new(route)
    }

    fn names(routes: &[Arc<Route>], p: &Parts) -> Vec<String> {
        let (first, also) = routes_of(routes, p);
        first
            .into_iter()
            .chain(also)
            .map(|r| r.route.name.clone())
            .collect()
    }

    fn with_header(mut p: Parts, name: &'static str, value: &str) -> Parts {
        p.headers.append(name, value.parse().unwrap());
        p
    }

    /// Issue 38: `POST /report` with `X-HTTP-Method-Override: GET` is the `GET /report` of an
    /// app behind Express's method-override; it counts against every route either method
    /// reaches, once.
    #[test]
    fn a_method_named_in_an_override_reaches_its_route_too() {
        let routes = vec![
            route("report", Some("/report"), Some(&[Method::GET]), None),
            route("writes", Some("/report"), Some(&[Method::POST]), None),
            route("delete", Some("/report"), Some(&[Method::DELETE]), None),
        ];
        let post = || parts(Method::POST, "/report", None);
        assert_eq!(names(&routes, &post()), ["writes"]);
        for header in crate::config::METHOD_OVERRIDE_HEADERS {
            let p = with_header(post(), header, "get");
            assert_eq!(names(&routes, &p), ["writes", "report"], "{header}");
        }
        // Every line and entry; the request's own method and unknown tokens add nothing.
        let p = with_header(post(), "x-http-method-override", " POST , Delete,,@@");
        let p = with_header(p, "x-http-method", "GET");
        assert_eq!(names(&routes, &p), ["writes", "delete", "report"]);
        // Only an override reaches a route: it is the request's route.
        let p = with_header(
            parts(Method::PUT, "/report", None),
            "x-method-override",
            "GET",
        );
        assert_eq!(names(&routes, &p), ["report"]);
        // Both spellings reach one route: counted once.
        let any = vec![route("all", Some("/report"), None, None)];
        let p = with_header(post(), "x-http-method-override", "GET");
        assert_eq!(names(&any, &p), ["all"]);
        let head = vec![route("report", Some("/report"), Some(&[Method::GET]), None)];
        let p = with_header(
            parts(Method::HEAD, "/report", None),
            "x-http-method-override",
            "GET",
        );
        assert_eq!(names(&head, &p), ["report"]);
    }

    #[test]
    fn method_override_is_per_route_and_the_query_field_only_where_named() {
        use crate::config::MethodOverride;
        let off = MethodOverride {
            headers: false,
            query: None,
        };
        let query_only = MethodOverride {
            headers: false,
            query: Some("_method".into()),
        };
        let routes = vec![
            with_override(route("off", Some("/a"), Some(&[Method::GET]), None), off),
            with_override(
                route("form", Some("/b"), Some(&[Method::DELETE]), None),
                query_only,
            ),
            route("headers", Some("/b"), Some(&[Method::PUT]), None),
        ];
        let p = with_header(
            parts(Method::POST, "/a", None),
            "x-http-method-override",
            "GET",
        );
        assert!(names(&routes, &p).is_empty());
        let p = with_header(
            parts(Method::POST, "/b", None),
            "x-http-method-override",
            "DELETE",
        );
        assert!(
            names(&routes, &p).is_empty(),
            "the form route reads no header"
        );
        let p = parts(Method::POST, "/b?x=1&_method=delete", None);
        assert_eq!(names(&routes, &p), ["form"]);
        let p = parts(Method::POST, "/b?_method=PUT", None);
        assert!(
            names(&routes, &p).is_empty(),
            "the header route reads no query"
        );
        let p = with_header(
            parts(Method::POST, "/b?_method=DELETE", None),
            "x-http-method",
            "PUT",
        );
        assert_eq!(names(&routes, &p), ["headers", "form"]);
        // No route reads overrides: nothing is looked at.
        let plain = vec![route("r", Some("/"), None, None)];
        let p = with_header(parts(Method::POST, "/", None), "x-http-method", "GET");
        assert_eq!(
            method_override_positions(&plain, &p, Some(0)),
            Vec::<usize>::new()
        );
    }
}

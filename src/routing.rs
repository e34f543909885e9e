//! Which route a request belongs to: routes are tried in file order and the first whose
//! path prefix, methods and host all match wins. No match means the request is forwarded
//! unlimited.
//!
//! Path prefixes are plain string prefixes of the request path (as nginx and Traefik do): write
//! `/api/` rather than `/api` unless `/apikeys` should match too.

use std::sync::Arc;

use http::header;
use http::request::Parts;

use crate::config::Route;

/// Finds the first route matching `request`.
pub fn find<'a>(routes: &'a [Arc<Route>], request: &Parts) -> Option<&'a Arc<Route>> {
    let host = request_host(request);
    routes
        .iter()
        .find(|route| matches(route, request, host.as_deref()))
}

fn matches(route: &Route, request: &Parts, host: Option<&str>) -> bool {
    if let Some(prefix) = &route.path_prefix {
        if !request.uri.path().starts_with(prefix.as_str()) {
            return false;
        }
    }
    if let Some(methods) = &route.methods {
        if !methods.contains(&request.method) {
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
            limits: vec![],
            shared_key: true,
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
        find(routes, p).map(|r| r.name.clone())
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

//! `GET /console` on the admin listener: a page for a person in an incident, who would rather
//! look than read JSON. It shows every route with its limits and modes and charts of its
//! allowed / limited / shed rates over the last ten minutes ([`history`], sampled here so a
//! page opened late has them), the fleet's top offenders, the recent denials, the store's
//! health, and a search by a caller's identity value: their state on every route, what
//! `explain` says for a request of theirs, and buttons to reset them or override their limits.
//!
//! The page is four files embedded in the binary (no CDN, no build step, works offline):
//! vanilla JavaScript that builds the DOM with `textContent` (never HTML from data) and draws
//! small SVG charts. Every answer here carries a strict Content-Security-Policy (no inline
//! script or style, scripts and requests from this origin only, never framed, Trusted Types
//! required so no script can inject markup). The page reads JSON endpoints served here
//! (`/console/api/overview`, `/console/api/caller`, `/limits/explain`), open like every read
//! of the admin listener; its actions call the admin API's own `POST /limits/reset` and
//! `POST|DELETE /limits/override` (an override previewed first with `dry_run=true`), which
//! need the admin token (or a loopback listener without one) and write the audit trail, and
//! it reads `GET /limits/overrides` and `GET /limits/audit`: the console adds no way to change
//! anything. Callers are named by the routes' display rule ([`crate::control::shown`]); the
//! masking of credential values in a described request's explanation is in [`shown`].

mod history;
pub(crate) mod shown;
mod view;

use std::net::IpAddr;
use std::sync::Arc;

use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::body::{full, ProxyBody};
use crate::proxy::Proxy;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");
const FAVICON: &str = include_str!("assets/favicon.svg");

/// Every console answer's policy: nothing inline, nothing from elsewhere, never framed.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'; require-trusted-types-for 'script'; trusted-types 'none'";

/// The console's state: the proxy it shows and the sampler's history.
pub struct Console {
    proxy: Proxy,
    history: Arc<history::History>,
    resolved: view::Resolved,
}

impl Console {
    /// The console of `proxy`, with its sampler running until `stop`.
    pub fn start(proxy: Proxy, stop: CancellationToken) -> Console {
        let history = Arc::new(history::History::default());
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(history::run(proxy.clone(), history.clone(), stop));
        }
        Console {
            proxy,
            history,
            resolved: view::Resolved::default(),
        }
    }

    /// The answer to a console request (the page, its files and JSON, `/limits/explain`), or
    /// None for a path that is not the console's. `loopback`: the admin listener is on a
    /// loopback address (mutations are then allowed without a token when none is configured).
    pub async fn respond<B>(
        &self,
        request: &Request<B>,
        loopback: bool,
    ) -> Option<Response<ProxyBody>> {
        let path = request.uri().path();
        let known: &[&str] = match path {
            "/console"
            | "/console/"
            | "/console/app.js"
            | "/console/app.css"
            | "/console/favicon.svg"
            | "/console/api/overview" => &[],
            "/console/api/caller" => &["identity"],
            "/limits/explain" => EXPLAIN_PARAMS,
            _ => return None,
        };
        let get = request.method() == Method::GET || request.method() == Method::HEAD;
        if !get {
            let mut answer = error(StatusCode::METHOD_NOT_ALLOWED, "use GET".into());
            answer
                .headers_mut()
                .insert(http::header::ALLOW, HeaderValue::from_static("GET"));
            return Some(answer);
        }
        if let Err(why) = known_params(request, path, known) {
            return Some(error(StatusCode::BAD_REQUEST, why));
        }
        Some(match path {
            "/console" | "/console/" => asset(INDEX_HTML, "text/html; charset=utf-8"),
            "/console/app.js" => asset(APP_JS, "text/javascript; charset=utf-8"),
            "/console/app.css" => asset(APP_CSS, "text/css; charset=utf-8"),
            "/console/favicon.svg" => asset(FAVICON, "image/svg+xml"),
            "/console/api/overview" => json_answer(
                StatusCode::OK,
                &view::overview(&self.proxy, &self.history, loopback).await,
            ),
            "/console/api/caller" => match param(request, "identity").filter(|v| !v.is_empty()) {
                Some(raw) => json_answer(
                    StatusCode::OK,
                    &view::caller(&self.proxy, &self.resolved, &raw).await,
                ),
                None => error(
                    StatusCode::BAD_REQUEST,
                    "missing query parameter `identity`: write ?identity=VALUE".into(),
                ),
            },
            _ => self.explain(request).await,
        })
    }

    /// `GET /limits/explain`: `tollgate explain` for a request described in the query.
    async fn explain<B>(&self, request: &Request<B>) -> Response<ProxyBody> {
        let described = match described(request) {
            Ok(described) => described,
            Err(why) => return error(StatusCode::BAD_REQUEST, why),
        };
        let (live, text) = match (flag(request, "live"), format_text(request)) {
            (Ok(live), Ok(text)) => (live, text),
            (Err(why), _) | (_, Err(why)) => return error(StatusCode::BAD_REQUEST, why),
        };
        match view::explain_request(&self.proxy, &described, live).await {
            Ok((_, shown)) if text => with_headers(
                Response::new(full(shown)),
                "text/plain; charset=utf-8",
                NO_STORE,
            ),
            Ok((value, _)) => json_answer(StatusCode::OK, &value),
            Err(why) => error(StatusCode::BAD_REQUEST, why),
        }
    }
}

const EXPLAIN_PARAMS: &[&str] = &["url", "method", "header", "client_ip", "live", "format"];
/// Parameters that may be given more than once.
const REPEATABLE: &[&str] = &["header"];

const NO_STORE: &str = "no-store";
/// The page's files are tiny: asked again each load, so a new binary's page is used at once.
const NO_CACHE: &str = "no-cache";

fn asset(text: &'static str, content_type: &'static str) -> Response<ProxyBody> {
    with_headers(Response::new(full(text)), content_type, NO_CACHE)
}

/// A state-changing request that a browser sent from a page of another origin: refused (403),
/// with why. A browser names the page's origin in `Origin` on every `POST` and `DELETE`; the
/// console's own page has this listener's origin, which the `Host` header names by an address
/// or `localhost`. Anything else is a page elsewhere making the operator's browser act
/// (cross-site request forgery, which a loopback listener without a token would otherwise
/// accept) or a DNS name rebound to this listener. Requests without `Origin` (curl, scripts,
/// `tollgate limits`) are not a browser's, and pass to the token and loopback rules.
pub fn refuse_foreign_origin<B>(request: &Request<B>) -> Option<Response<ProxyBody>> {
    if request.method() == Method::GET || request.method() == Method::HEAD {
        return None;
    }
    let origin = request.headers().get(http::header::ORIGIN)?;
    let own = request
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|host| is_address(host));
    let same = origin.to_str().ok().and_then(|o| o.strip_prefix("http://"));
    match (same, own) {
        (Some(origin), Some(host)) if origin.eq_ignore_ascii_case(host) => None,
        _ => Some(error(
            StatusCode::FORBIDDEN,
            format!(
                "refused: a browser page from another origin ({}) may not change state here; \
                 use the console this listener serves",
                String::from_utf8_lossy(origin.as_bytes())
            ),
        )),
    }
}

/// `host[:port]` names an IP address or `localhost` (not a DNS name that could be rebound).
fn is_address(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(v6) => {
            return v6
                .split(']')
                .next()
                .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => authority
            .rsplit_once(':')
            .map_or(authority, |(host, port)| {
                if port.chars().all(|c| c.is_ascii_digit()) {
                    host
                } else {
                    authority
                }
            }),
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::Ipv4Addr>().is_ok()
}

/// The path of the overload protection's state as the page reads it; the admin listener
/// answers it (it owns `GET /protect`), with [`json_answer`].
pub const PROTECT_PATH: &str = "/console/api/protect";

/// A JSON answer with the console's headers.
pub fn json_answer(status: StatusCode, value: &Value) -> Response<ProxyBody> {
    let mut text = serde_json::to_string_pretty(value).expect("JSON");
    text.push('\n');
    let mut response = Response::new(full(text));
    *response.status_mut() = status;
    with_headers(response, "application/json", NO_STORE)
}

fn error(status: StatusCode, message: String) -> Response<ProxyBody> {
    json_answer(status, &json!({ "error": message }))
}

/// The headers every console answer carries.
fn with_headers(
    mut response: Response<ProxyBody>,
    content_type: &'static str,
    cache: &'static str,
) -> Response<ProxyBody> {
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static(cache));
    headers.insert(
        http::header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        http::header::X_FRAME_OPTIONS,
        HeaderValue::from_static("DENY"),
    );
    headers.insert(
        http::header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(
        HeaderName::from_static("cross-origin-resource-policy"),
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// Every value of query parameter `name`, decoded (form rules).
fn params<B>(request: &Request<B>, name: &str) -> Vec<Vec<u8>> {
    let Some(query) = request.uri().query() else {
        return Vec::new();
    };
    query
        .split('&')
        .filter_map(|pair| crate::identity::query_param(pair, name))
        .collect()
}

fn param<B>(request: &Request<B>, name: &str) -> Option<Vec<u8>> {
    params(request, name).into_iter().next()
}

/// The admin listener's rule (see `query_params`), with [`REPEATABLE`] ones allowed twice.
fn known_params<B>(request: &Request<B>, path: &str, known: &[&str]) -> Result<(), String> {
    crate::query_params::known_params(request, path, known, REPEATABLE)
}

fn text_param<B>(request: &Request<B>, name: &str) -> Option<String> {
    param(request, name).map(|v| String::from_utf8_lossy(&v).into_owned())
}

/// `?format=`: `json` (the default) or `text`.
fn format_text<B>(request: &Request<B>) -> Result<bool, String> {
    match text_param(request, "format").as_deref() {
        None | Some("json") => Ok(false),
        Some("text") => Ok(true),
        Some(_) => Err("format must be `json` or `text`".to_owned()),
    }
}

/// A `true` / `false` parameter, false when absent.
fn flag<B>(request: &Request<B>, name: &str) -> Result<bool, String> {
    match text_param(request, name).as_deref() {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(_) => Err(format!("{name} must be `true` or `false`")),
    }
}

/// The request `/limits/explain` describes: `url` (required), `method` (GET), each `header`
/// as `Name: value`, `client_ip` (the TCP peer, 127.0.0.1).
fn described<B>(request: &Request<B>) -> Result<crate::explain::Described, String> {
    let url = text_param(request, "url")
        .filter(|u| !u.is_empty())
        .ok_or("missing query parameter `url`: write ?url=/path (a path, or a full URL)")?;
    let peer: IpAddr = match text_param(request, "client_ip") {
        None => [127, 0, 0, 1].into(),
        Some(ip) => ip
            .parse()
            .map_err(|_| format!("client_ip must be an IP address, not `{ip}`"))?,
    };
    Ok(crate::explain::Described {
        method: text_param(request, "method").unwrap_or_else(|| "GET".into()),
        url,
        headers: params(request, "header")
            .into_iter()
            .map(|h| String::from_utf8_lossy(&h).into_owned())
            .collect(),
        peer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap()
    }

    #[test]
    fn explain_parameters_are_checked() {
        let check = |uri: &str| known_params(&get(uri), "/limits/explain", EXPLAIN_PARAMS);
        assert_eq!(
            check("/limits/explain?url=/a&header=a:1&header=b:2"),
            Ok(())
        );
        assert_eq!(
            check("/limits/explain?url=/a&url=/b"),
            Err("query parameter `url` given more than once".into())
        );
        assert!(check("/limits/explain?uri=/a")
            .unwrap_err()
            .contains("takes url, method"));
        assert_eq!(
            known_params(&get("/console?x=1"), "/console", &[]),
            Err("unknown query parameter `x`: /console takes none".into())
        );
        assert_eq!(
            format_text(&get("/limits/explain?format=xml")),
            Err("format must be `json` or `text`".into())
        );
        assert_eq!(
            flag(&get("/limits/explain?live=yes"), "live"),
            Err("live must be `true` or `false`".into())
        );
        let d = described(&get(
            "/limits/explain?url=%2Fapi%2Fx&header=X-User%3A%20alice&client_ip=10.0.0.1",
        ))
        .unwrap();
        assert_eq!(
            (d.url.as_str(), d.headers[0].as_str()),
            ("/api/x", "X-User: alice")
        );
        assert_eq!(d.peer, "10.0.0.1".parse::<IpAddr>().unwrap());
        assert!(described(&get("/limits/explain?url=/a&client_ip=nope")).is_err());
        assert!(described(&get("/limits/explain")).is_err());
    }

    #[test]
    fn browsers_change_state_only_from_this_listeners_own_page() {
        let post = |origin: Option<&str>, host: &str| {
            let mut builder =
                Request::post("/limits/reset?route=a&identity=b").header("host", host);
            if let Some(origin) = origin {
                builder = builder.header("origin", origin);
            }
            refuse_foreign_origin(&builder.body(()).unwrap()).is_none()
        };
        assert!(post(None, "example.com"), "not a browser");
        assert!(post(Some("http://127.0.0.1:9901"), "127.0.0.1:9901"));
        assert!(post(Some("http://localhost:9901"), "LOCALHOST:9901"));
        assert!(post(Some("http://[::1]:9901"), "[::1]:9901"));
        assert!(!post(Some("http://evil.example"), "127.0.0.1:9901"));
        assert!(!post(Some("null"), "127.0.0.1:9901"));
        assert!(!post(Some("http://127.0.0.1:9902"), "127.0.0.1:9901"));
        assert!(!post(Some("https://127.0.0.1:9901"), "127.0.0.1:9901"));
        // A DNS name rebound to the listener: same origin as far as the browser knows.
        assert!(!post(
            Some("http://rebound.example:9901"),
            "rebound.example:9901"
        ));
        assert!(refuse_foreign_origin(
            &Request::get("/console")
                .header("origin", "http://evil.example")
                .body(())
                .unwrap()
        )
        .is_none());
    }

    #[test]
    fn the_page_has_no_inline_script_or_style() {
        let lower = INDEX_HTML.to_ascii_lowercase();
        assert!(!lower.contains("<script>"), "inline script");
        assert!(!lower.contains("style="), "style attribute");
        assert!(!lower.contains("<style"), "style element");
        for (at, _) in lower.match_indices(" on") {
            let name: String = lower[at + 3..]
                .chars()
                .take_while(|c| c.is_ascii_alphabetic())
                .collect();
            assert!(
                !lower[at + 3 + name.len()..].starts_with('='),
                "event handler attribute on{name}"
            );
        }
        assert!(!APP_JS.contains("innerHTML"), "markup from strings");
        let js = APP_JS.replace("http://www.w3.org/2000/svg", "");
        assert!(
            !js.contains("http://") && !js.contains("https://"),
            "another origin"
        );
    }
}

//! The admin listener: health, readiness and metrics for the platform, and the operators'
//! endpoints for "someone is being blocked": who is denied most (`GET /limits/top`: over the
//! fleet through Redis, or `?scope=local` this replica alone), one caller's state
//! (`GET /limits/state`) and its reset (`POST /limits/reset`); for "a customer asks for more":
//! a temporary override of one caller's limits (`POST /limits/override`, ended
//! early by `DELETE /limits/override`); and the audit trail of those actions
//! (`GET /limits/audit`, see [`crate::control::audit`]); for "which limit should I set":
//! callers' peak rates per route and suggested limits (`GET /limits/suggest`, see
//! [`crate::suggest`]). `GET /protect` shows the app's
//! protection: its adaptive limit, what it learned and what it admitted and shed.
//! A person rather than a script uses `GET /console` ([`crate::console`]), a page over the
//! same endpoints.
//!
//! Every request, read or change, must name this listener in `Host` by an IP address,
//! `localhost` or a name in `admin.hosts`; any other is refused 421 (see [`check_host`]: a
//! page elsewhere must not read these endpoints through a DNS name rebound to the listener).
//! Reads are open to whoever reaches the listener (keep it off public interfaces). A mutation
//! needs `Authorization: Bearer <token>` when `admin.token_env` names a token; without one,
//! mutations are allowed only on a loopback listener, where only this host can call. Refused
//! mutations are answered 403 whether the token is missing or wrong: the caller is not allowed
//! to do this, and a 401 would invite a credential prompt that this API does not have. The
//! token is compared in constant time. Every mutation, allowed or refused, is logged (target
//! `tollgate::admin`) with the peer address, the route, the identity as logs show it, and the
//! result; a mutation that was carried out is also written to the audit trail.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::header::{ACCEPT, ALLOW, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::admin_endpoints::ENDPOINTS;
use crate::body::{full, ProxyBody};
use crate::config::Secret;
use crate::console::{self, Console};
use crate::control::audit::{self, Who};
use crate::control::caller::CallerError;
use crate::control::offenders::{self, View};
use crate::control::overrides;
use crate::control::results::{to_json, AuditParameters};
use crate::idle::{Activity, IdleIo, Idleness};
use crate::limit::Cause;
use crate::proxy::Proxy;
use crate::throttle::overrides::Adjust;

/// What readiness depends on: not draining, and a store that answers unless `on_error`
/// makes its absence harmless. Lives here, beside `/readyz`, so that the server (which drains
/// it) imports the admin listener and not the other way round.
pub struct Health {
    draining: AtomicBool,
    proxy: Proxy,
}

impl Health {
    pub fn new(proxy: Proxy) -> Self {
        Health {
            draining: AtomicBool::new(false),
            proxy,
        }
    }

    /// From now on, not ready: the server is shutting down.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Ready or not, in the words `/readyz` answers with. Not ready while the store's first
    /// connection is being made. A store that is down names its cause (refused, timed out,
    /// authentication failed, ...), also when `on_error` keeps this instance ready: a second
    /// line then says so. So a bare `ready` means the store is deciding (or there is none).
    pub fn readiness(&self) -> Result<String, String> {
        if self.draining.load(Ordering::Acquire) {
            return Err("draining\n".into());
        }
        let health = self.proxy.store_health();
        if health.connecting {
            return Err(format!(
                "rate limit store {}: its first connection is being made\n",
                Cause::NotConnected.describe()
            ));
        }
        let cause = health.cause.map(Cause::describe);
        if !self.proxy.store_ready() {
            Err(match cause {
                Some(cause) => format!("rate limit store unreachable (on_error: deny): {cause}\n"),
                None => "rate limit store unreachable (on_error: deny)\n".into(),
            })
        } else {
            Ok(match cause {
                Some(cause) => format!(
                    "ready\nrate limit store down ({cause}); on_error: {} applies\n",
                    health.on_error
                ),
                None => "ready\n".into(),
            })
        }
    }
}

/// Callers per route `/limits/top` lists unless `?k=` says otherwise.
pub const DEFAULT_TOP: usize = 10;

/// `/healthz`: the process is alive. `/readyz`: it should receive traffic (not draining, the
/// store answers or does not matter). `/metrics`: Prometheus text format. `/limits/*`: see the
/// module docs.
pub async fn serve(
    listener: TcpListener,
    health: Arc<Health>,
    proxy: Proxy,
    stop: CancellationToken,
) {
    let loopback = listener
        .local_addr()
        .map(|a| a.ip().is_loopback())
        .unwrap_or(false);
    // `GET /console` and the JSON behind it (see [`crate::console`]).
    let console = Arc::new(Console::start(proxy.clone(), stop.clone()));
    // Bounded as the proxy listener's connections are (`admin.header_read_timeout`,
    // `admin.idle_timeout`, `admin.max_connections`), so that silent or trickling peers
    // cannot hold this listener's descriptors, nor take the proxy listener's.
    let bounds = proxy.config().admin_connections;
    let h1 = crate::conn::http1_builder(bounds.header_read_timeout);
    let permits = Arc::new(Semaphore::new(bounds.max_connections));
    loop {
        // Past max_connections, new connections wait in the kernel's backlog.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p,
            _ = stop.cancelled() => return,
        };
        let Ok(permit) = permit else { return };
        let accepted: std::io::Result<(TcpStream, SocketAddr)> = tokio::select! {
            r = listener.accept() => r,
            _ = stop.cancelled() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(target: "tollgate::admin", cause = %crate::error::chain(&e), "admin accept failed");
                tokio::select! {
                    _ = tokio::time::sleep(crate::conn::ACCEPT_BACKOFF) => continue,
                    _ = stop.cancelled() => return,
                }
            }
        };
        // Ends the connection's input once nothing is in flight and no byte has moved for
        // idle_timeout; hyper bounds each request head by header_read_timeout.
        let activity = Arc::new(Activity::default());
        let stream =
            IdleIo::with_hook(stream, Idleness::new(bounds.idle_timeout, activity.clone()));
        let health = health.clone();
        let proxy = proxy.clone();
        let console = console.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            let health = health.clone();
            let proxy = proxy.clone();
            let console = console.clone();
            let in_flight = activity.start();
            async move {
                let _in_flight = in_flight;
                let client = AdminClient { peer, loopback };
                if let Err(why) = check_host(&request, &proxy.config().admin_hosts) {
                    tracing::warn!(target: "tollgate::admin", peer = %client.peer, path = request.uri().path(), result = "refused", why, "admin request for another host refused");
                    return Ok::<_, Infallible>(error(StatusCode::MISDIRECTED_REQUEST, why));
                }
                if let Some(refused) = console::refuse_foreign_origin(&request) {
                    tracing::warn!(target: "tollgate::admin", peer = %client.peer, path = request.uri().path(), result = "refused", why = "a browser page from another origin", "admin mutation refused");
                    return Ok::<_, Infallible>(refused);
                }
                if request.uri().path() == console::PROTECT_PATH {
                    return Ok::<_, Infallible>(protect_for_console(&proxy));
                }
                if let Some(answer) = console.respond(&request, loopback).await {
                    return Ok::<_, Infallible>(answer);
                }
                let request = match with_body_params(request).await {
                    Ok(request) => request,
                    Err(refused) => return Ok::<_, Infallible>(refused),
                };
                Ok::<_, Infallible>(respond(&request, &health, &proxy, client).await)
            }
        });
        let h1 = h1.clone();
        tokio::spawn(async move {
            let _ = h1.serve_connection(TokioIo::new(stream), service).await;
            drop(permit);
        });
    }
}

/// Whether the admin listener answers a request for the host it names (`Host`, or the
/// target's authority in absolute form), or why not (421 Misdirected Request).
///
/// Answered: an IP address (any port), `localhost` (any port), or a name listed in
/// `admin.hosts`. A browser sends the name a page was loaded from, so a page elsewhere whose
/// DNS name is rebound to this listener (DNS rebinding) names itself here and is refused, for
/// reads as for changes; an address cannot be rebound, so probes and scrapers that call by
/// the pod's or host's address (which is not known in advance on `0.0.0.0`) need no entry,
/// and neither do port forwards (`kubectl port-forward`, `docker -p`), which change the port.
/// A request without `Host` is not a browser's (HTTP/1.0 health checkers): answered.
fn check_host<B>(request: &Request<B>, hosts: &[crate::config::AdminHost]) -> Result<(), String> {
    let mut given = request.headers().get_all(http::header::HOST).iter();
    let host = given.next();
    if given.next().is_some() {
        return Err("misdirected request: more than one Host header".to_owned());
    }
    let authority = request.uri().authority().map(|a| a.as_str().as_bytes());
    for named in [host.map(HeaderValue::as_bytes), authority]
        .into_iter()
        .flatten()
    {
        if !host_answered(named, hosts) {
            return Err(format!(
                "misdirected request: this admin listener does not answer for Host `{}`; it answers IP addresses, localhost and the names in admin.hosts (a name not listed could be a DNS name rebound to it)",
                String::from_utf8_lossy(named).escape_debug()
            ));
        }
    }
    Ok(())
}

/// `host[:port]` names an IP address, `localhost` or an `admin.hosts` entry (see
/// [`check_host`]). A port must be digits (or empty, as RFC 3986 allows).
fn host_answered(authority: &[u8], hosts: &[crate::config::AdminHost]) -> bool {
    let Ok(authority) = std::str::from_utf8(authority) else {
        return false;
    };
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let Some((literal, rest)) = v6.split_once(']') else {
                return false;
            };
            let port_ok = rest.is_empty()
                || rest
                    .strip_prefix(':')
                    .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()));
            return port_ok && literal.parse::<std::net::Ipv6Addr>().is_ok();
        }
        None => match authority.split_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => {
                (host, if port.is_empty() { None } else { Some(port) })
            }
            Some(_) => return false,
            None => (authority, None),
        },
    };
    let port = match port.map(str::parse::<u16>) {
        None => None,
        Some(Ok(port)) => Some(port),
        Some(Err(_)) => return false,
    };
    if host.parse::<std::net::Ipv4Addr>().is_ok() {
        return true;
    }
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    if name == "localhost" {
        return true;
    }
    hosts.iter().any(|entry| entry.matches(&name, port))
}

/// Who is calling the admin listener (not a limited caller: see `identity::caller`).
#[derive(Clone, Copy)]
struct AdminClient {
    peer: SocketAddr,
    /// The listener is on a loopback address.
    loopback: bool,
}

async fn respond<B>(
    request: &Request<B>,
    health: &Health,
    proxy: &Proxy,
    client: AdminClient,
) -> Response<ProxyBody> {
    let path = request.uri().path();
    let Some(methods) = ENDPOINTS
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, methods)| *methods)
    else {
        return health_response(request, health, proxy);
    };
    let method = request.method().clone();
    if let Some(refused) = allowed(request, methods) {
        return refused;
    }
    let known = match path {
        "/limits/top" => TOP_PARAMS,
        "/limits/suggest" => SUGGEST_PARAMS,
        "/limits/state" => STATE_PARAMS,
        "/limits/reset" => RESET_PARAMS,
        "/limits/override" if method == Method::DELETE => UNOVERRIDE_PARAMS,
        "/limits/override" => OVERRIDE_PARAMS,
        "/limits/audit" => AUDIT_PARAMS,
        "/limits/overrides" => OVERRIDES_PARAMS,
        _ => PROTECT_PARAMS,
    };
    if let Err(why) = crate::query_params::known_params(request, path, known, &[]) {
        return error(StatusCode::BAD_REQUEST, why);
    }
    match path {
        "/limits/top" => top(request, proxy).await,
        "/limits/suggest" => suggest(request, proxy).await,
        "/limits/state" => state(request, proxy).await,
        "/limits/override" if method == Method::DELETE => unoverride(request, proxy, client).await,
        "/limits/override" => set_override(request, proxy, client).await,
        "/limits/audit" => audit(request, proxy).await,
        "/limits/overrides" => overrides_list(request, proxy).await,
        "/protect" => protect_state(request, proxy),
        _ => reset(request, proxy, client).await,
    }
}

/// The console's view of the overload protection: what `GET /protect` answers, as
/// `{"available": true, "state": ...}`, or `{"available": false}` while this listener has no
/// such endpoint, so that the page never asks a path that answers 404 (a browser logs that as
/// an error).
fn protect_for_console(proxy: &Proxy) -> Response<ProxyBody> {
    let value = match proxy.protector() {
        Some(protector) => {
            let s = protector.snapshot();
            json!({ "available": true, "state": protect_json(&s, &latency_setting(&s)) })
        }
        None => json!({ "available": false }),
    };
    console::json_answer(StatusCode::OK, &value)
}

/// The largest body the admin API reads: its parameters are a few short values.
const MAX_BODY: usize = 16 * 1024;

/// An operator request with all its parameters in the query: those of a JSON body
/// (`Content-Type: application/json`, an object of the names the query takes, each a string,
/// number or boolean) are appended to it, so the endpoints read one place and a name given in
/// both is refused as given twice. Any other body is refused (400, saying why) rather than
/// ignored: whoever sent it meant something by it. An empty body is no body. The health
/// endpoints' bodies are not read (probes send what they send).
async fn with_body_params(request: Request<Incoming>) -> Result<Request<()>, Response<ProxyBody>> {
    use http_body_util::BodyExt;
    let (mut parts, body) = request.into_parts();
    if !ENDPOINTS.iter().any(|(path, _)| *path == parts.uri.path()) {
        return Ok(Request::from_parts(parts, ()));
    }
    let bytes = match http_body_util::Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is larger than {MAX_BODY} bytes: the admin API takes a few parameters"),
            ))
        }
        Err(e) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("the request body could not be read: {e}"),
            ))
        }
    };
    if bytes.trim_ascii().is_empty() {
        return Ok(Request::from_parts(parts, ()));
    }
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let pairs = body_params(content_type.as_deref(), &bytes)
        .map_err(|why| error(StatusCode::BAD_REQUEST, why))?;
    let mut query = form_urlencoded::Serializer::new(parts.uri.query().unwrap_or("").to_owned());
    query.extend_pairs(pairs);
    let path_and_query = format!("{}?{}", parts.uri.path(), query.finish());
    let mut uri = parts.uri.clone().into_parts();
    uri.path_and_query = Some(path_and_query.parse().map_err(|_| {
        error(
            StatusCode::BAD_REQUEST,
            "the body's parameters do not make a valid query",
        )
    })?);
    parts.uri = http::Uri::from_parts(uri).map_err(|_| {
        error(
            StatusCode::BAD_REQUEST,
            "the body's parameters do not make a valid query",
        )
    })?;
    Ok(Request::from_parts(parts, ()))
}

/// The `(name, value)` pairs of a non-empty body of `content_type`, or why it cannot be used.
fn body_params(content_type: Option<&str>, body: &[u8]) -> Result<Vec<(String, String)>, String> {
    let media = content_type
        .and_then(|t| t.split(';').next())
        .map(str::trim)
        .unwrap_or("");
    if !media.eq_ignore_ascii_case("application/json") {
        return Err(format!(
            "a body of type `{}` is not read: give the parameters in the query, or as a JSON \
             object with `Content-Type: application/json`",
            if media.is_empty() { "(none)" } else { media }
        ));
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let Value::Object(object) = value else {
        return Err(
            "the JSON body must be an object of the parameters, such as {\"route\": \"api\", \"identity\": \"acme\"}"
                .to_owned(),
        );
    };
    object
        .into_iter()
        .map(|(name, value)| match value {
            Value::String(text) => Ok((name, text)),
            Value::Number(n) => Ok((name, n.to_string())),
            Value::Bool(b) => Ok((name, b.to_string())),
            _ => Err(format!(
                "`{name}` in the JSON body must be a string, a number or a boolean"
            )),
        })
        .collect()
}

/// The query parameters each operator endpoint takes; any other is refused (400) with these
/// named, so that a misspelt parameter is never silently ignored. The health endpoints
/// (`/healthz`, `/readyz`, `/metrics`) take none and ignore the query: probes and scrapers may
/// add their own.
const TOP_PARAMS: &[&str] = &["k", "format", "scope"];
const SUGGEST_PARAMS: &[&str] = &["window", "format", "scope"];
const STATE_PARAMS: &[&str] = &["route", "identity", "format"];
const RESET_PARAMS: &[&str] = &["route", "identity", "limit_name", "format"];
const OVERRIDE_PARAMS: &[&str] = &[
    "route",
    "identity",
    "limit",
    "multiply",
    "for",
    "limit_name",
    "dry_run",
    "format",
];
const UNOVERRIDE_PARAMS: &[&str] = &["route", "identity", "limit_name", "format"];
const OVERRIDES_PARAMS: &[&str] = &["format"];
const AUDIT_PARAMS: &[&str] = &["limit", "format"];
const PROTECT_PARAMS: &[&str] = &["format"];

/// The endpoints that existed before the operators' ones, unchanged.
fn health_response<B>(request: &Request<B>, health: &Health, proxy: &Proxy) -> Response<ProxyBody> {
    if request.uri().path() == "/metrics" {
        let mut response = Response::new(full(proxy.render_metrics()));
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return response;
    }
    let (status, text) = match request.uri().path() {
        "/healthz" => (StatusCode::OK, "ok\n".to_string()),
        "/readyz" => match health.readiness() {
            Ok(text) => (StatusCode::OK, text),
            Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "not found: try /healthz or /readyz\n".into(),
        ),
    };
    let mut response = Response::new(full(text));
    *response.status_mut() = status;
    response
}

/// None when the request's method is one of `methods` (HEAD counts as GET), else a 405 whose
/// `Allow` lists every method the endpoint takes.
fn allowed<B>(request: &Request<B>, methods: &[Method]) -> Option<Response<ProxyBody>> {
    let given = request.method();
    if methods
        .iter()
        .any(|m| m == given || (*m == Method::GET && given == Method::HEAD))
    {
        return None;
    }
    let mut names: Vec<&str> = methods.iter().map(Method::as_str).collect();
    if methods.contains(&Method::GET) {
        names.push("HEAD");
    }
    let mut response = json_response(
        StatusCode::METHOD_NOT_ALLOWED,
        &json!({ "error": format!("use {}", names.join(" or ")) }),
    );
    response.headers_mut().insert(
        ALLOW,
        HeaderValue::from_str(&names.join(", ")).expect("method names"),
    );
    Some(response)
}

fn json_response(status: StatusCode, value: &Value) -> Response<ProxyBody> {
    let mut text = serde_json::to_string_pretty(value).expect("JSON");
    text.push('\n');
    let mut response = Response::new(full(text));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn text_response(status: StatusCode, text: String) -> Response<ProxyBody> {
    let mut response = Response::new(full(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn error(status: StatusCode, message: impl Into<String>) -> Response<ProxyBody> {
    json_response(status, &json!({ "error": message.into() }))
}

/// A query parameter, decoded (form rules), or None when absent.
fn param<B>(request: &Request<B>, name: &str) -> Option<Vec<u8>> {
    crate::identity::query_param(request.uri().query()?, name)
}

/// `?format=text`, or no `format` and a client that accepts text/plain and not JSON;
/// Err for a `format` other than `json` or `text`.
fn wants_text<B>(request: &Request<B>) -> Result<bool, String> {
    match param(request, "format").as_deref() {
        Some(b"text") => Ok(true),
        Some(b"json") => Ok(false),
        Some(_) => Err("format must be `json` or `text`".to_owned()),
        None => Ok(request
            .headers()
            .get(ACCEPT)
            .and_then(|a| a.to_str().ok())
            .is_some_and(|a| a.contains("text/plain") && !a.contains("json"))),
    }
}

/// `GET /protect`: the controller's state (limit, in-flight, waiting, learned baseline,
/// current latency and its target), why the limit is where it is (what the last window did,
/// the level the app was lately served at, a paced level, the last cut and its cause) and
/// what was admitted and shed per priority; 404 without a `protect` section.
fn protect_state<B>(request: &Request<B>, proxy: &Proxy) -> Response<ProxyBody> {
    let text = match wants_text(request) {
        Ok(text) => text,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let Some(protector) = proxy.protector() else {
        return error(
            StatusCode::NOT_FOUND,
            "no `protect` section in the configuration: the app is not protected",
        );
    };
    let s = protector.snapshot();
    let latency_setting = latency_setting(&s);
    if text {
        text_response(StatusCode::OK, protect_text(&s, &latency_setting))
    } else {
        json_response(StatusCode::OK, &protect_json(&s, &latency_setting))
    }
}

/// The latency target as configured: `3x` (of the baseline) or a duration.
fn latency_setting(s: &crate::protect::Snapshot) -> String {
    match s.settings.latency {
        crate::config::LatencyTarget::Multiple(m) => format!("{m}x"),
        crate::config::LatencyTarget::Absolute(d) => humantime::format_duration(d).to_string(),
    }
}

/// Milliseconds with microsecond precision, as `/protect` shows durations.
fn protect_ms(d: Option<std::time::Duration>) -> Option<f64> {
    d.map(|d| (d.as_secs_f64() * 1e6).round() / 1e3)
}

/// `GET /protect` as JSON: the controller's reading and why the limit is where it is.
fn protect_json(s: &crate::protect::Snapshot, latency_setting: &str) -> Value {
    let ms = protect_ms;
    let by_priority = |counts: [u64; 4]| {
        let mut map = serde_json::Map::new();
        for priority in crate::config::Priority::ALL.into_iter().rev() {
            map.insert(priority.as_str().into(), json!(counts[priority.index()]));
        }
        Value::Object(map)
    };
    json!({
        "mode": s.mode.as_str(),
        "limit": s.limit,
        "in_flight": s.in_flight,
        "waiting": s.waiting,
        "baseline_ms": ms(s.reading.baseline),
        "latency_ms": ms(s.reading.latency),
        "target_ms": ms(s.reading.target),
        "error_share": s.reading.error_share,
        "windows": s.reading.windows,
        "state": s.reading.state.as_str(),
        "good_limit": s.reading.good,
        "paced": s.reading.paced.map(|p| json!({
            "level": p.level,
            "until_window": p.until,
            "windows_left": p.until.saturating_sub(s.reading.windows),
        })),
        "last_cut": s.reading.last_cut.map(|cut| json!({
            "cause": cut.cause.as_str(),
            "window": cut.window,
            "ago_ms": ms(Some(cut.at.elapsed())),
            "from": cut.from,
            "to": cut.to,
        })),
        "settings": {
            "latency": latency_setting,
            "max_wait_ms": ms(Some(s.max_wait)),
            "min_limit": s.settings.min_limit,
            "max_limit": s.settings.max_limit,
        },
        "admitted": by_priority(s.admitted),
        "shed": by_priority(s.shed),
    })
}

/// `GET /protect?format=text`: the same reading in lines an operator reads at a glance.
fn protect_text(s: &crate::protect::Snapshot, latency_setting: &str) -> String {
    let ms = protect_ms;
    let show = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v} ms"));
    let mut out = format!(
        "protect   {} (latency {latency_setting}, max_wait {} ms, limit {}..{})\n\
         limit     {} ({} in flight, {} waiting)\n\
         latency   {} now, baseline {}, target {}\n\
         errors    {:.1}% of the last window\n\
         state     {} (window {}{}{})\n\
         last cut  {}\n",
        s.mode.as_str(),
        ms(Some(s.max_wait)).unwrap_or(0.0),
        s.settings.min_limit,
        s.settings.max_limit,
        s.limit,
        s.in_flight,
        s.waiting,
        show(ms(s.reading.latency)),
        show(ms(s.reading.baseline)),
        show(ms(s.reading.target)),
        s.reading.error_share * 100.0,
        s.reading.state.as_str(),
        s.reading.windows,
        s.reading.good.map_or(String::new(), |good| format!(
            ", served without a queue up to {good}"
        )),
        s.reading.paced.map_or(String::new(), |p| format!(
            ", {} paced until window {}",
            p.level, p.until
        )),
        s.reading.last_cut.map_or("none".to_owned(), |cut| format!(
            "{} → {} by {} at window {}, {:.1} s ago",
            cut.from,
            cut.to,
            cut.cause.as_str(),
            cut.window,
            cut.at.elapsed().as_secs_f64()
        )),
    );
    let shed = if s.mode == crate::config::ProtectMode::Shadow {
        "would shed"
    } else {
        "shed"
    };
    out.push_str(&priority_table(s.admitted, s.shed, shed));
    out
}

/// What was admitted and shed per priority, most important first, as a table whose numbers
/// are right-aligned under their headings (the labels above take the same 10 columns).
fn priority_table(admitted: [u64; 4], shed: [u64; 4], shed_heading: &str) -> String {
    let priorities = crate::config::Priority::ALL.into_iter().rev();
    let width = |heading: &str, counts: [u64; 4]| {
        counts
            .iter()
            .map(|n| n.to_string().len())
            .chain([heading.len()])
            .max()
            .unwrap_or(0)
    };
    let (a, d) = (width("admitted", admitted), width(shed_heading, shed));
    let mut out = format!(
        "{:<9} {:>a$}  {:>d$}\n",
        "priority", "admitted", shed_heading
    );
    for priority in priorities {
        let i = priority.index();
        out.push_str(&format!(
            "{:<9} {:>a$}  {:>d$}\n",
            priority.as_str(),
            admitted[i],
            shed[i]
        ));
    }
    out
}

/// `?k=`: how many callers per route, from 1 to what the sketch holds.
fn top_k<B>(request: &Request<B>) -> Result<usize, String> {
    let Some(text) = param(request, "k") else {
        return Ok(DEFAULT_TOP);
    };
    std::str::from_utf8(&text)
        .ok()
        .and_then(|t| t.parse::<usize>().ok())
        .filter(|k| (1..=offenders::CAPACITY).contains(k))
        .ok_or_else(|| {
            format!(
                "k must be a whole number from 1 to {} (the callers each route keeps)",
                offenders::CAPACITY
            )
        })
}

/// `?scope=`: the fleet's view (the default) or this replica's.
fn top_scope<B>(request: &Request<B>) -> Result<View, String> {
    match param(request, "scope").as_deref() {
        None | Some(b"fleet") => Ok(View::Fleet),
        Some(b"local") => Ok(View::Local),
        Some(_) => Err("scope must be `fleet` or `local`".to_owned()),
    }
}

async fn top<B>(request: &Request<B>, proxy: &Proxy) -> Response<ProxyBody> {
    let parsed = top_k(request).and_then(|k| {
        let text = wants_text(request)?;
        Ok((k, text, top_scope(request)?))
    });
    let (k, text, view) = match parsed {
        Ok(parsed) => parsed,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let control = proxy.throttle_control();
    let top = match control.offenders() {
        Some(sketch) => sketch.top_of(k, view).await,
        None => offenders::Top {
            view: View::Local,
            replicas: 1,
            ..offenders::Top::default()
        },
    };
    // A route's networks and per-limit lists go with its entry; a list without its route's
    // (the route's own list is never empty when they are not) is left out.
    let mut networks: std::collections::HashMap<String, Vec<offenders::Offender>> =
        top.networks.into_iter().collect();
    let mut by_limit: std::collections::HashMap<String, Vec<(String, Vec<offenders::Offender>)>> =
        std::collections::HashMap::new();
    for (route, limit, callers) in top.by_limit {
        by_limit.entry(route).or_default().push((limit, callers));
    }
    let routes: Vec<Value> = top
        .routes
        .into_iter()
        .map(|(route, top)| {
            // Each caller as its route shows it: the short form the other endpoints show.
            let shown = control.shown(&route);
            let callers: Vec<Value> = top
                .into_iter()
                .map(|o| o.to_json(shown.item(&o.item)))
                .collect();
            let nets: Vec<Value> = networks
                .remove(&route)
                .unwrap_or_default()
                .into_iter()
                .map(|o| {
                    json!({
                        "network": o.item,
                        "count": o.count,
                        "error": o.error,
                        "replicas": o.replicas,
                    })
                })
                .collect();
            let limits: Vec<Value> = by_limit
                .remove(&route)
                .unwrap_or_default()
                .into_iter()
                .map(|(limit, callers)| {
                    let callers: Vec<Value> = callers
                        .into_iter()
                        .map(|o| o.to_json(shown.item(&o.item)))
                        .collect();
                    json!({ "limit": limit, "top": callers })
                })
                .collect();
            json!({ "route": route, "top": callers, "networks": nets, "by_limit": limits })
        })
        .collect();
    let mut body = json!({
        "scope": match top.view { View::Fleet => "fleet", View::Local => "local" },
        "replicas": top.replicas,
        "window_seconds": offenders::WINDOWS as u64 * offenders::WINDOW_MS / 1000,
        "k": k,
        "routes": routes,
    });
    if let Some(reason) = top.reason {
        body["reason"] = json!(reason);
    }
    if text {
        return text_response(StatusCode::OK, top_text(&body));
    }
    json_response(StatusCode::OK, &body)
}

/// `GET /limits/suggest?window=1h|24h&scope=fleet|local&format=json|text`: per route, callers'
/// peak rates and the limits that would refuse at most 0.1 % and 1 % of them (see
/// `crate::suggest`).
async fn suggest<B>(request: &Request<B>, proxy: &Proxy) -> Response<ProxyBody> {
    use crate::suggest::{advice, View as SuggestView};
    let window = match param(request, "window").as_deref() {
        None => Ok(advice::Window::Day),
        Some(text) => std::str::from_utf8(text)
            .ok()
            .and_then(advice::Window::parse)
            .ok_or_else(|| "window must be `1h` or `24h`".to_owned()),
    };
    let parsed = window.and_then(|window| {
        let text = wants_text(request)?;
        let view = match top_scope(request)? {
            View::Fleet => SuggestView::Fleet,
            View::Local => SuggestView::Local,
        };
        Ok((window, text, view))
    });
    let (window, text, view) = match parsed {
        Ok(parsed) => parsed,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let (record, config) = proxy.suggest();
    let merged = record.merged(view).await;
    let body = advice::report(&config.throttle, &merged, window, crate::suggest::unix_ms());
    if text {
        return text_response(StatusCode::OK, advice::text(&body));
    }
    json_response(StatusCode::OK, &body)
}

fn top_text(body: &Value) -> String {
    let over = match (body["scope"].as_str(), body["replicas"].as_u64()) {
        (Some("fleet"), Some(1)) => "the fleet (1 replica reporting)".to_owned(),
        (Some("fleet"), Some(n)) => format!("the fleet ({n} replicas reporting)"),
        _ => match body["reason"].as_str() {
            Some(reason) => format!("this replica only ({reason})"),
            None => "this replica only".to_owned(),
        },
    };
    let mut out = format!(
        "denied most in the last {}s on {over} (counts are upper bounds; ± is how much they may overcount)\n",
        body["window_seconds"]
    );
    let routes = body["routes"].as_array().cloned().unwrap_or_default();
    if routes.is_empty() {
        out.push_str("nobody was denied\n");
    }
    for route in routes {
        out.push_str(&format!(
            "route {}\n",
            route["route"].as_str().unwrap_or("?")
        ));
        for caller in route["top"].as_array().into_iter().flatten() {
            let replicas = match caller["replicas"].as_u64() {
                Some(1) | None => "1 replica".to_owned(),
                Some(n) => format!("{n} replicas"),
            };
            out.push_str(&format!("{}  {replicas}\n", caller_line(caller)));
        }
        let networks = route["networks"].as_array().cloned().unwrap_or_default();
        if !networks.is_empty() {
            out.push_str("  by client network\n");
        }
        for network in networks {
            out.push_str(&format!(
                "  {:>8}  {}{}\n",
                network["count"],
                network["network"].as_str().unwrap_or("?"),
                overcount(&network["error"]),
            ));
        }
        for limit in route["by_limit"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "  refused by limit {}\n",
                limit["limit"].as_str().unwrap_or("?")
            ));
            for caller in limit["top"].as_array().into_iter().flatten() {
                out.push_str(&format!("{}\n", caller_line(caller)));
            }
        }
    }
    out
}

/// What `/limits/state`, `/limits/reset` and `/limits/override` are asked.
struct CallerQuery {
    route: String,
    /// As given: the caller's value or its short form ([`crate::control::shown`]).
    identity: Vec<u8>,
    /// The one limit to act on (`limit_name`); None: every limit.
    limit_name: Option<String>,
    /// Answer in text rather than JSON.
    text: bool,
}

/// `route`, `identity` and the format from the query, or why the request is a bad one (400).
/// An unknown route is the store side's to say (404, with the routes there are).
fn caller_query<B>(request: &Request<B>) -> Result<CallerQuery, String> {
    let route = param(request, "route").filter(|r| !r.is_empty());
    let identity = param(request, "identity").filter(|i| !i.is_empty());
    let text = wants_text(request)?;
    match (route, identity) {
        (Some(route), Some(identity)) => Ok(CallerQuery {
            route: String::from_utf8_lossy(&route).into_owned(),
            identity,
            limit_name: param(request, "limit_name")
                .map(|name| String::from_utf8_lossy(&name).into_owned()),
            text,
        }),
        (route, _) => Err(format!(
            "missing query parameter `{}`: write ?route=ROUTE&identity=VALUE",
            if route.is_none() { "route" } else { "identity" }
        )),
    }
}

fn caller_error(e: CallerError) -> Response<ProxyBody> {
    let status = match e {
        CallerError::UnknownRoute { .. } => StatusCode::NOT_FOUND,
        CallerError::EmptyIdentity
        | CallerError::BadOverride(_)
        | CallerError::UnknownLimit { .. } => StatusCode::BAD_REQUEST,
        CallerError::NoOverride { .. }
        | CallerError::UnknownShortForm { .. }
        | CallerError::HashedShortForm { .. } => StatusCode::NOT_FOUND,
        CallerError::TooManyOverrides { .. } => StatusCode::CONFLICT,
        CallerError::Store(_) | CallerError::NotConnected | CallerError::LookupTimedOut { .. } => {
            StatusCode::SERVICE_UNAVAILABLE
        }
    };
    error(status, e.to_string())
}

/// The caller a query names, found from its short form when it gives one, and how its route
/// shows it (for the log lines); or the answer that says why not.
async fn named_caller(
    control: &crate::control::Control,
    query: &CallerQuery,
) -> Result<(Vec<u8>, String), Response<ProxyBody>> {
    let raw = control
        .resolve(&query.route, &query.identity)
        .await
        .map_err(caller_error)?;
    let shown = control.shown(&query.route).value(&raw);
    Ok((raw, shown))
}

async fn state<B>(request: &Request<B>, proxy: &Proxy) -> Response<ProxyBody> {
    let query = match caller_query(request) {
        Ok(query) => query,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let control = proxy.throttle_control();
    let (raw, _) = match named_caller(&control, &query).await {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    match control.state(&query.route, &raw).await {
        Ok(state) if query.text => text_response(StatusCode::OK, state.text()),
        Ok(state) => json_response(StatusCode::OK, &to_json(&state)),
        Err(e) => caller_error(e),
    }
}

async fn reset<B>(request: &Request<B>, proxy: &Proxy, client: AdminClient) -> Response<ProxyBody> {
    let query = match caller_query(request) {
        Ok(query) => query,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let route = query.route.as_str();
    let control = proxy.throttle_control();
    let token = proxy.config().admin_token.clone();
    if let Err(why) = authorize(request, token.as_ref(), client.loopback) {
        let shown = control.shown(route).given(&query.identity);
        tracing::warn!(target: "tollgate::admin", peer = %client.peer, action = "reset", route, identity = shown, result = "refused", why, "admin mutation refused");
        return error(StatusCode::FORBIDDEN, why);
    }
    let (identity, shown) = match named_caller(&control, &query).await {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    let limit_name = query.limit_name.as_deref();
    match control.reset(route, &identity, limit_name).await {
        Ok(done) => {
            tracing::info!(target: "tollgate::admin", peer = %client.peer, action = "reset", route, identity = shown, limit_name, result = "ok", deleted = done.deleted, "admin mutation");
            let parameters = AuditParameters::Reset {
                limit_name: done.limit_name.clone(),
                deleted: done.deleted,
            };
            audit_action(
                &control,
                &client,
                token.is_some(),
                "reset",
                route,
                &identity,
                parameters,
            )
            .await;
            if query.text {
                return text_response(StatusCode::OK, done.text());
            }
            json_response(StatusCode::OK, &to_json(&done))
        }
        Err(e) => {
            tracing::warn!(target: "tollgate::admin", peer = %client.peer, action = "reset", route, identity = shown, result = "failed", cause = %crate::error::chain(&e), "admin mutation failed");
            caller_error(e)
        }
    }
}

/// Writes an admin mutation to the audit trail; a failure to is logged, the mutation stands.
async fn audit_action(
    control: &crate::control::Control,
    client: &AdminClient,
    with_token: bool,
    action: &str,
    route: &str,
    identity: &[u8],
    parameters: AuditParameters,
) {
    if let Err(e) = control
        .audit(who(with_token), action, route, identity, parameters)
        .await
    {
        tracing::warn!(target: "tollgate::admin", peer = %client.peer, action, route, cause = %e, "the audit trail could not be written");
    }
}

/// Who a mutation is by, as the audit trail and the overrides list say.
fn who(with_token: bool) -> Who {
    if with_token {
        Who::Token
    } else {
        Who::Loopback
    }
}

/// `limit` or `multiply` (exactly one), `for` and `dry_run`, or why not.
fn override_params<B>(request: &Request<B>) -> Result<(Adjust, std::time::Duration, bool), String> {
    let text = |name: &str| param(request, name).map(|v| String::from_utf8_lossy(&v).into_owned());
    let adjust = match (text("limit"), text("multiply")) {
        (Some(limit), None) => Adjust::Limit(overrides::parse_limit(&limit)?),
        (None, Some(factor)) => Adjust::Multiply(overrides::parse_multiply(&factor)?),
        (Some(_), Some(_)) => return Err("give either `limit` or `multiply`, not both".to_owned()),
        (None, None) => {
            return Err(
                "missing query parameter `limit` or `multiply`: write &limit=N or &multiply=X"
                    .to_owned(),
            )
        }
    };
    let duration = match text("for") {
        Some(duration) => overrides::parse_for(&duration)?,
        None => return Err("missing query parameter `for`: write &for=24h".to_owned()),
    };
    let dry_run = match text("dry_run").as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err("`dry_run` must be `true` or `false`".to_owned()),
    };
    Ok((adjust, duration, dry_run))
}

async fn set_override<B>(
    request: &Request<B>,
    proxy: &Proxy,
    client: AdminClient,
) -> Response<ProxyBody> {
    let parsed = caller_query(request).and_then(|query| {
        override_params(request)
            .map(|(adjust, duration, dry_run)| (query, adjust, duration, dry_run))
    });
    let parsed = parsed.and_then(|(query, adjust, duration, dry_run)| {
        let throttle = &proxy.config().throttle;
        overrides::check_multiply(throttle, &query.route, adjust, query.limit_name.as_deref())?;
        Ok((query, adjust, duration, dry_run))
    });
    let (query, adjust, duration, dry_run) = match parsed {
        Ok(parsed) => parsed,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let route = query.route.as_str();
    let control = proxy.throttle_control();
    let token = proxy.config().admin_token.clone();
    if let Err(why) = authorize(request, token.as_ref(), client.loopback) {
        let shown = control.shown(route).given(&query.identity);
        tracing::warn!(target: "tollgate::admin", peer = %client.peer, action = "override", route, identity = shown, result = "refused", why, "admin mutation refused");
        return error(StatusCode::FORBIDDEN, why);
    }
    let (identity, shown) = match named_caller(&control, &query).await {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    let asked = overrides::Request {
        adjust,
        duration,
        limit_name: query.limit_name.clone(),
        dry_run,
        who: who(token.is_some()),
    };
    let limit_name = query.limit_name.as_deref();
    match control.set_override(route, &identity, &asked).await {
        Ok(done) if dry_run => {
            if query.text {
                return text_response(StatusCode::OK, done.text());
            }
            json_response(StatusCode::OK, &to_json(&done))
        }
        Ok(done) => {
            tracing::info!(target: "tollgate::admin", peer = %client.peer, action = "override", route, identity = shown, limit_name, result = "ok", until = done.set.until, "admin mutation");
            let parameters = done.audit_parameters(duration);
            audit_action(
                &control,
                &client,
                token.is_some(),
                "override",
                route,
                &identity,
                parameters,
            )
            .await;
            if query.text {
                return text_response(StatusCode::OK, done.text());
            }
            json_response(StatusCode::OK, &to_json(&done))
        }
        Err(e) => {
            tracing::warn!(target: "tollgate::admin", peer = %client.peer, action = "override", route, identity = shown, result = "failed", cause = %e, "admin mutation failed");
            caller_error(e)
        }
    }
}

async fn unoverride<B>(
    request: &Request<B>,
    proxy: &Proxy,
    client: AdminClient,
) -> Response<ProxyBody> {
    let query = match caller_query(request) {
        Ok(query) => query,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let route = query.route.as_str();
    let control = proxy.throttle_control();
    let token = proxy.config().admin_token.clone();
    if let Err(why) = authorize(request, token.as_ref(), client.loopback) {
        let shown = control.shown(route).given(&query.identity);
        tracing::warn!(target: "tollgate::admin", peer = %client.peer, action = "override_removed", route, identity = shown, result = "refused", why, "admin mutation refused");
        return error(StatusCode::FORBIDDEN, why);
    }
    let (identity, shown) = match named_caller(&control, &query).await {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    let limit_name = query.limit_name.as_deref();
    match control.remove_override(route, &identity, limit_name).await {
        Ok(done) => {
            tracing::info!(target: "tollgate::admin", peer = %client.peer, action = "override_removed", route, identity = shown, limit_name, result = "ok", "admin mutation");
            audit_action(
                &control,
                &client,
                token.is_some(),
                "override_removed",
                route,
                &identity,
                AuditParameters::Removed {
                    limit_name: done.limit_name.clone(),
                    removed: done.removed,
                },
            )
            .await;
            if query.text {
                return text_response(StatusCode::OK, done.text());
            }
            json_response(StatusCode::OK, &to_json(&done))
        }
        Err(e) => {
            tracing::warn!(target: "tollgate::admin", peer = %client.peer, action = "override_removed", route, identity = shown, result = "failed", cause = %e, "admin mutation failed");
            caller_error(e)
        }
    }
}

/// `GET /limits/overrides`: every override in force, fleet-wide (see
/// [`crate::control::overrides`]).
async fn overrides_list<B>(request: &Request<B>, proxy: &Proxy) -> Response<ProxyBody> {
    let text = match wants_text(request) {
        Ok(text) => text,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    match proxy.throttle_control().overrides_list().await {
        Ok(list) if text => text_response(StatusCode::OK, list.text()),
        Ok(list) => json_response(StatusCode::OK, &to_json(&list)),
        Err(e) => caller_error(e),
    }
}

/// `?limit=`: how many entries, from 1 to what the trail keeps.
fn audit_limit<B>(request: &Request<B>) -> Result<usize, String> {
    let Some(text) = param(request, "limit") else {
        return Ok(audit::DEFAULT_SHOWN);
    };
    std::str::from_utf8(&text)
        .ok()
        .and_then(|t| t.parse::<usize>().ok())
        .filter(|n| (1..=audit::CAPACITY).contains(n))
        .ok_or_else(|| {
            format!(
                "limit must be a whole number from 1 to {} (the entries the trail keeps)",
                audit::CAPACITY
            )
        })
}

async fn audit<B>(request: &Request<B>, proxy: &Proxy) -> Response<ProxyBody> {
    let (count, text) = match audit_limit(request).and_then(|n| wants_text(request).map(|t| (n, t)))
    {
        Ok(parsed) => parsed,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    match proxy.throttle_control().audit_trail(count).await {
        Ok(trail) if text => text_response(StatusCode::OK, trail.text()),
        Ok(trail) => json_response(StatusCode::OK, &to_json(&trail)),
        Err(e) => caller_error(e),
    }
}

/// Whether a mutation may proceed (see the module docs), or why not.
fn authorize<B>(
    request: &Request<B>,
    token: Option<&Secret>,
    loopback: bool,
) -> Result<(), &'static str> {
    let Some(token) = token else {
        return if loopback {
            Ok(())
        } else {
            Err("mutations are refused: the admin listener is not on a loopback address and no admin.token_env is configured")
        };
    };
    let given = request
        .headers()
        .get(AUTHORIZATION)
        .map(|v| v.as_bytes().trim_ascii())
        .and_then(|v| {
            let (scheme, rest) = v.split_at_checked(7)?;
            scheme
                .eq_ignore_ascii_case(b"bearer ")
                .then(|| rest.trim_ascii())
        });
    match given {
        None => Err("missing `Authorization: Bearer <token>` (the token from admin.token_env)"),
        Some(given) if same_secret(given, token.0.as_bytes()) => Ok(()),
        Some(_) => Err("wrong admin token"),
    }
}

/// Compares in constant time: both sides are hashed first (so neither length nor the first
/// differing byte shows in the time taken), then every byte of the digests is compared.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(given), Sha256::digest(expected));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |diff, (x, y)| diff | (x ^ y))
        == 0
}

/// One caller of `/limits/top`'s text: its count, who it is (by which source) and how much
/// the count may overcount.
fn caller_line(caller: &Value) -> String {
    format!(
        "  {:>8}  {} ({}){}",
        caller["count"],
        caller["identity"].as_str().unwrap_or("?"),
        caller["source"].as_str().unwrap_or("?"),
        overcount(&caller["error"]),
    )
}

/// ` ±N` for a count that may overcount by N, nothing for an exact one.
fn overcount(error: &Value) -> String {
    match error.as_u64() {
        Some(0) | None => String::new(),
        Some(e) => format!(" ±{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_auth(value: Option<&str>) -> Request<()> {
        let mut builder = Request::post("/limits/reset?route=a&identity=b");
        if let Some(value) = value {
            builder = builder.header(AUTHORIZATION, value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn mutations_need_the_token_or_a_loopback_listener() {
        let token = Secret("s3cret".into());
        assert!(authorize(&with_auth(Some("Bearer s3cret")), Some(&token), false).is_ok());
        assert!(authorize(&with_auth(Some("bearer  s3cret ")), Some(&token), false).is_ok());
        assert_eq!(
            authorize(&with_auth(Some("Bearer s3cre")), Some(&token), true),
            Err("wrong admin token")
        );
        assert!(authorize(&with_auth(None), Some(&token), true).is_err());
        assert!(authorize(&with_auth(Some("Basic czNjcmV0")), Some(&token), true).is_err());
        assert!(authorize(&with_auth(None), None, true).is_ok());
        assert!(authorize(&with_auth(Some("Bearer s3cret")), None, false).is_err());
    }

    #[test]
    fn a_405_allows_every_method_the_endpoint_takes() {
        let answer = |method: Method, methods: &[Method]| {
            let request = Request::builder().method(method).body(()).unwrap();
            allowed(&request, methods)
                .map(|r| (r.status(), r.headers()[ALLOW].to_str().unwrap().to_owned()))
        };
        let override_methods = &[Method::POST, Method::DELETE];
        assert_eq!(answer(Method::POST, override_methods), None);
        assert_eq!(answer(Method::DELETE, override_methods), None);
        assert_eq!(
            answer(Method::GET, override_methods),
            Some((StatusCode::METHOD_NOT_ALLOWED, "POST, DELETE".to_owned()))
        );
        assert_eq!(answer(Method::HEAD, &[Method::GET]), None);
        assert_eq!(
            answer(Method::POST, &[Method::GET]),
            Some((StatusCode::METHOD_NOT_ALLOWED, "GET, HEAD".to_owned()))
        );
        let listed = ENDPOINTS
            .iter()
            .find(|(path, _)| *path == "/limits/override")
            .unwrap();
        assert_eq!(listed.1, override_methods);
    }

    #[test]
    fn a_json_body_gives_parameters_and_any_other_body_is_refused() {
        let json = Some("application/json; charset=utf-8");
        assert_eq!(
            body_params(
                json,
                br#"{"route": "api", "identity": "acme", "multiply": 0.5, "for": "1h"}"#
            ),
            // In name order (the order does not matter: each name is one parameter).
            Ok(vec![
                ("for".to_owned(), "1h".to_owned()),
                ("identity".to_owned(), "acme".to_owned()),
                ("multiply".to_owned(), "0.5".to_owned()),
                ("route".to_owned(), "api".to_owned()),
            ])
        );
        for (content_type, body, why) in [
            (
                Some("application/x-www-form-urlencoded"),
                &b"route=api"[..],
                "a body of type `application/x-www-form-urlencoded` is not read",
            ),
            (None, b"{}", "a body of type `(none)` is not read"),
            (json, b"{\"route\": ", "the body is not valid JSON"),
            (json, b"[1, 2]", "the JSON body must be an object"),
            (
                json,
                b"{\"route\": [\"a\"]}",
                "`route` in the JSON body must be a string, a number or a boolean",
            ),
        ] {
            let refused = body_params(content_type, body).unwrap_err();
            assert!(refused.starts_with(why), "{refused:?}, wanted {why:?}");
        }
    }

    #[test]
    fn only_known_parameters_once_each() {
        let check = |uri: &str| {
            crate::query_params::known_params(
                &Request::get(uri).body(()).unwrap(),
                "/limits/top",
                TOP_PARAMS,
                &[],
            )
        };
        assert_eq!(check("/limits/top"), Ok(()));
        assert_eq!(check("/limits/top?"), Ok(()));
        assert_eq!(check("/limits/top?k=3&format=text&"), Ok(()));
        // A name is read as the endpoint reads it: decoded.
        assert_eq!(check("/limits/top?%6B=3"), Ok(()));
        assert_eq!(
            check("/limits/top?k=3&kk=4"),
            Err("unknown query parameter `kk`: /limits/top takes k, format, scope".into())
        );
        assert_eq!(
            check("/limits/top?format"),
            Ok(()),
            "a name without a value is still that parameter"
        );
        assert_eq!(
            check("/limits/top?k=3&k=4"),
            Err("query parameter `k` given more than once".into())
        );
    }

    #[test]
    fn k_and_format_are_refused_outside_what_is_allowed() {
        let get = |uri: &str| Request::get(uri).body(()).unwrap();
        assert_eq!(top_scope(&get("/limits/top")), Ok(View::Fleet));
        assert_eq!(top_scope(&get("/limits/top?scope=fleet")), Ok(View::Fleet));
        assert_eq!(top_scope(&get("/limits/top?scope=local")), Ok(View::Local));
        for bad in ["bogus", "", "Local"] {
            assert_eq!(
                top_scope(&get(&format!("/limits/top?scope={bad}"))),
                Err("scope must be `fleet` or `local`".to_owned())
            );
        }
        assert_eq!(top_k(&get("/limits/top")), Ok(DEFAULT_TOP));
        assert_eq!(top_k(&get("/limits/top?k=1")), Ok(1));
        assert_eq!(top_k(&get("/limits/top?k=128")), Ok(offenders::CAPACITY));
        for bad in ["0", "129", "1000000", "-1", "2.5", "", "nope"] {
            assert!(
                top_k(&get(&format!("/limits/top?k={bad}"))).is_err(),
                "{bad}"
            );
        }
        assert_eq!(wants_text(&get("/limits/top?format=text")), Ok(true));
        assert_eq!(wants_text(&get("/limits/top?format=json")), Ok(false));
        assert_eq!(
            wants_text(&get("/limits/top?format=xml")),
            Err("format must be `json` or `text`".into())
        );
        let by_accept = Request::get("/limits/top")
            .header(ACCEPT, "text/plain")
            .body(())
            .unwrap();
        assert_eq!(wants_text(&by_accept), Ok(true));
    }

    /// Issue 38: a page elsewhere whose DNS name is rebound to the listener names itself in
    /// `Host`; addresses, `localhost` and listed names are answered, any port.
    #[test]
    fn host_names_an_address_localhost_or_a_listed_name() {
        use crate::config::AdminHost;
        let hosts = [
            AdminHost {
                name: "tollgate-admin.internal".into(),
                port: None,
            },
            AdminHost {
                name: "*.monitoring.svc".into(),
                port: None,
            },
            AdminHost {
                name: "pinned.example".into(),
                port: Some(9901),
            },
        ];
        for good in [
            "127.0.0.1:9901",
            "10.1.2.3:9901",
            "10.1.2.3",
            "10.1.2.3:",
            "[::1]:9901",
            "[fd00::1]",
            "localhost:19901",
            "LOCALHOST",
            "localhost.:9901",
            "tollgate-admin.internal:9901",
            "Tollgate-Admin.Internal.",
            "tollgate.monitoring.svc:9901",
            "pinned.example:9901",
        ] {
            assert!(host_answered(good.as_bytes(), &hosts), "{good}");
        }
        for bad in [
            "rebind.evil.example",
            "rebind.evil.example:9901",
            "monitoring.svc",
            "pinned.example",
            "pinned.example:9902",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "127.0.0.1:abc",
            "127.0.0.1:80:80",
            "[::1]x",
            "[::1",
            "[evil]:80",
            "localhost:99999",
            "",
        ] {
            assert!(!host_answered(bad.as_bytes(), &hosts), "{bad}");
        }
        let get = |host: Option<&str>, uri: &str| {
            let mut builder = Request::get(uri);
            if let Some(host) = host {
                builder = builder.header(http::header::HOST, host);
            }
            builder.body(()).unwrap()
        };
        assert!(
            check_host(&get(None, "/healthz"), &[]).is_ok(),
            "not a browser"
        );
        assert!(check_host(&get(Some("127.0.0.1:1"), "/metrics"), &[]).is_ok());
        let refused = check_host(&get(Some("rebind.evil.example"), "/metrics"), &[]);
        assert!(refused.unwrap_err().contains("`rebind.evil.example`"));
        assert!(check_host(
            &get(Some("127.0.0.1:1"), "http://rebind.evil.example/metrics"),
            &[]
        )
        .is_err());
        let mut two = get(Some("127.0.0.1:1"), "/metrics");
        two.headers_mut()
            .append(http::header::HOST, HeaderValue::from_static("evil.example"));
        assert!(check_host(&two, &[]).is_err());
    }

    #[test]
    fn secrets_compare_by_content() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"", b"a"));
    }
    #[test]
    fn protect_text_aligns_its_numbers_under_their_headings() {
        assert_eq!(
            priority_table([413, 0, 566, 0], [1971, 0, 10, 0], "shed"),
            "priority  admitted  shed\n\
             critical         0     0\n\
             high           566    10\n\
             normal           0     0\n\
             low            413  1971\n"
        );
        assert_eq!(
            priority_table([1, 0, 0, 123456789], [0; 4], "would shed"),
            "priority   admitted  would shed\n\
             critical  123456789           0\n\
             high              0           0\n\
             normal            0           0\n\
             low               1           0\n"
        );
    }
}

//! `tollgate limits get|reset|override|overrides`: one caller's state, its reset and a
//! temporary override of its limits (`override --delete` ends one), and the overrides in force,
//! from the command line; a caller is named by its value or its short form (`sha256:...`); `tollgate limits
//! suggest`: callers' peak rates and suggested limits, from a running instance ([`suggest`]).
//!
//! With a Redis store the command talks to Redis directly (the same keys, peek and reset as the
//! admin endpoints; every replica's deny cache follows the reset generation), so it works with
//! no instance reachable. With a memory store the state lives inside each running instance, so
//! the command asks an instance's admin listener (the config's `admin` address, or `--admin`),
//! with the bearer token from the config's `admin.token_env` for a mutation. A mutation made
//! straight to Redis is written to the audit trail as the CLI's (`who: cli`); one made through
//! an admin listener is written there by the listener.

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::config::{Config, StoreConfig};
use crate::control::audit::Who;
use crate::control::caller::{CallerError, Control};
use crate::control::overrides::Request as OverrideRequest;
use crate::control::results::{
    to_json, AuditParameters, CallerState, OverrideDone, OverrideRemoved, OverridesList, ResetDone,
};
use crate::throttle::overrides::Adjust;

/// How long the command waits for an admin listener.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Get,
    /// Resets the caller's limits (the one named, or every one).
    Reset {
        limit_name: Option<String>,
    },
    /// Gives the caller `adjust` for `duration` (on the limit named, or on every one in
    /// proportion); with `dry_run`, shows what each limit would become. (Through an admin
    /// listener, the listener says who asked.)
    Override(OverrideRequest),
    /// Ends the caller's override (of the limit named, or every one).
    Unoverride {
        limit_name: Option<String>,
    },
}

impl Action {
    /// What the audit trail calls it (None: not a mutation).
    fn audited(&self) -> Option<&'static str> {
        match self {
            Action::Get => None,
            Action::Override(asked) if asked.dry_run => None,
            Action::Reset { .. } => Some("reset"),
            Action::Override(_) => Some("override"),
            Action::Unoverride { .. } => Some("override_removed"),
        }
    }

    /// Whether it changes anything (then the admin token goes with it).
    fn mutates(&self) -> bool {
        !matches!(self, Action::Get)
    }
}

/// What an action answers: the admin endpoint's answer, typed.
#[derive(Debug, Clone, PartialEq)]
pub enum ActionResult {
    State(CallerState),
    Reset(ResetDone),
    Override(OverrideDone),
    Removed(OverrideRemoved),
}

impl ActionResult {
    /// As the admin endpoint answers it (`--json`).
    pub fn json(&self) -> Value {
        match self {
            ActionResult::State(a) => to_json(a),
            ActionResult::Reset(a) => to_json(a),
            ActionResult::Override(a) => to_json(a),
            ActionResult::Removed(a) => to_json(a),
        }
    }

    /// As the admin endpoint's `format=text` shows it.
    pub fn text(&self) -> String {
        match self {
            ActionResult::State(a) => a.text(),
            ActionResult::Reset(a) => a.text(),
            ActionResult::Override(a) => a.text(),
            ActionResult::Removed(a) => a.text(),
        }
    }

    /// What the audit trail keeps of it, for an action that changed something.
    fn audit_parameters(&self, action: &Action) -> Option<AuditParameters> {
        match (self, action) {
            (ActionResult::Override(done), Action::Override(asked)) if !asked.dry_run => {
                Some(done.audit_parameters(asked.duration))
            }
            (ActionResult::Reset(done), _) => Some(AuditParameters::Reset {
                limit_name: done.limit_name.clone(),
                deleted: done.deleted,
            }),
            (ActionResult::Removed(done), _) => Some(AuditParameters::Removed {
                limit_name: done.limit_name.clone(),
                removed: done.removed,
            }),
            _ => None,
        }
    }
}

/// Why the command failed; `usage` errors (an unknown route, a bad argument) exit 2, the rest 1.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub usage: bool,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            usage: true,
        }
    }

    fn other(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            usage: false,
        }
    }
}

impl From<CallerError> for Failure {
    fn from(e: CallerError) -> Failure {
        match e {
            CallerError::UnknownRoute { .. }
            | CallerError::EmptyIdentity
            | CallerError::UnknownLimit { .. }
            | CallerError::UnknownShortForm { .. }
            | CallerError::HashedShortForm { .. } => Failure::usage(e.to_string()),
            _ => Failure::other(e.to_string()),
        }
    }
}

/// Runs the action and returns its answer (the admin endpoint's, byte for byte in content).
pub async fn run(
    config: &Config,
    action: Action,
    route: &str,
    identity: &str,
    admin: Option<&str>,
) -> Result<ActionResult, Failure> {
    match (&config.throttle.store, admin) {
        (StoreConfig::Redis(redis), None) => {
            let control = direct(config, redis).await?;
            // A short form (`sha256:...`) names the caller whose value it is.
            let raw = &control.resolve(route, identity.as_bytes()).await?;
            let done = match &action {
                Action::Get => ActionResult::State(control.state(route, raw).await?),
                Action::Reset { limit_name } => {
                    ActionResult::Reset(control.reset(route, raw, limit_name.as_deref()).await?)
                }
                Action::Override(asked) => {
                    let limit_name = asked.limit_name.as_deref();
                    crate::control::overrides::check_multiply(
                        &config.throttle,
                        route,
                        asked.adjust,
                        limit_name,
                    )
                    .map_err(Failure::usage)?;
                    ActionResult::Override(control.set_override(route, raw, asked).await?)
                }
                Action::Unoverride { limit_name } => ActionResult::Removed(
                    control
                        .remove_override(route, raw, limit_name.as_deref())
                        .await?,
                ),
            };
            if let (Some(what), Some(parameters)) =
                (action.audited(), done.audit_parameters(&action))
            {
                control
                    .audit(Who::Cli, what, route, raw, parameters)
                    .await
                    .map_err(|e| {
                        Failure::other(format!(
                            "done, but the audit trail could not be written: {e}"
                        ))
                    })?;
            }
            Ok(done)
        }
        (_, admin) => {
            let base = admin_base(config, admin, "limits live in each instance's memory and the configuration has no `admin` listener: pass --admin URL")?;
            through_admin(config, action, &base, route, identity).await
        }
    }
}

/// An address to connect to for a listener bound to `address` (an unspecified address
/// listens on loopback too).
pub fn reachable(address: std::net::SocketAddr) -> std::net::SocketAddr {
    let mut address = address;
    if address.ip().is_unspecified() {
        address.set_ip(match address {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    address
}

async fn through_admin(
    config: &Config,
    action: Action,
    base: &str,
    route: &str,
    identity: &str,
) -> Result<ActionResult, Failure> {
    let (method, path) = match action {
        Action::Get => (http::Method::GET, "/limits/state"),
        Action::Reset { .. } => (http::Method::POST, "/limits/reset"),
        Action::Override(_) => (http::Method::POST, "/limits/override"),
        Action::Unoverride { .. } => (http::Method::DELETE, "/limits/override"),
    };
    let mut url = format!(
        "{base}{path}?route={}&identity={}",
        encode(route),
        encode(identity)
    );
    match &action {
        Action::Override(OverrideRequest {
            adjust,
            duration,
            limit_name,
            dry_run,
            ..
        }) => {
            match adjust {
                Adjust::Limit(n) => url.push_str(&format!("&limit={n}")),
                Adjust::Multiply(f) => url.push_str(&format!("&multiply={f}")),
            }
            url.push_str(&format!("&for={}ms", duration.as_millis()));
            if let Some(name) = limit_name {
                url.push_str(&format!("&limit_name={}", encode(name)));
            }
            if *dry_run {
                url.push_str("&dry_run=true");
            }
        }
        Action::Reset {
            limit_name: Some(name),
        }
        | Action::Unoverride {
            limit_name: Some(name),
        } => url.push_str(&format!("&limit_name={}", encode(name))),
        _ => {}
    }
    let mut request = http::Request::builder().method(method).uri(&url);
    if let (true, Some(token)) = (action.mutates(), &config.admin_token) {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {}", token.0));
    }
    let request = request
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| Failure::usage(format!("`{url}` is not a usable URL: {e}")))?;
    Ok(match action {
        Action::Get => ActionResult::State(exchange(request, base).await?),
        Action::Reset { .. } => ActionResult::Reset(exchange(request, base).await?),
        Action::Override(_) => ActionResult::Override(exchange(request, base).await?),
        Action::Unoverride { .. } => ActionResult::Removed(exchange(request, base).await?),
    })
}

/// [`exchange_json`]'s answer read as the typed answer it is.
async fn exchange<T: DeserializeOwned>(
    request: http::Request<Empty<bytes::Bytes>>,
    base: &str,
) -> Result<T, Failure> {
    let value = exchange_json(request, base).await?;
    serde_json::from_value(value).map_err(|e| {
        Failure::other(format!(
            "{base} answered with JSON this version does not read: {e}"
        ))
    })
}

/// Sends `request` to the admin listener at `base` and returns its JSON answer, or the failure
/// (a 400 or 404: a usage error).
async fn exchange_json(
    request: http::Request<Empty<bytes::Bytes>>,
    base: &str,
) -> Result<Value, Failure> {
    let client = Client::builder(TokioExecutor::new()).build_http();
    let exchange = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, body))
    };
    let (status, body) = tokio::time::timeout(ADMIN_TIMEOUT, exchange)
        .await
        .map_err(|_| Failure::other(format!("{base} did not answer within {ADMIN_TIMEOUT:?}")))?
        .map_err(|e| Failure::other(format!("cannot reach the admin listener {base}: {e}")))?;
    let value: Value = serde_json::from_slice(&body).map_err(|_| {
        Failure::other(format!(
            "{base} answered {status} with something that is not JSON: {}",
            String::from_utf8_lossy(&body).trim()
        ))
    })?;
    if status.is_success() {
        return Ok(value);
    }
    let message = format!(
        "{base} answered {status}: {}",
        value["error"].as_str().unwrap_or("(no reason given)")
    );
    Err(match status.as_u16() {
        400 | 404 => Failure::usage(message),
        _ => Failure::other(message),
    })
}

/// `tollgate limits overrides`: the overrides in force, fleet-wide (`GET /limits/overrides`'s
/// answer): read from Redis itself with a Redis store, else asked of an admin listener.
pub async fn overrides(config: &Config, admin: Option<&str>) -> Result<OverridesList, Failure> {
    match (&config.throttle.store, admin) {
        (StoreConfig::Redis(redis), None) => {
            let control = direct(config, redis).await?;
            Ok(control.overrides_list().await?)
        }
        (_, admin) => {
            let base = admin_base(config, admin, "limits live in each instance's memory and the configuration has no `admin` listener: pass --admin URL")?;
            let url = format!("{base}/limits/overrides?format=json");
            let request = http::Request::get(&url)
                .body(Empty::<bytes::Bytes>::new())
                .map_err(|e| Failure::usage(format!("`{url}` is not a usable URL: {e}")))?;
            exchange(request, &base).await
        }
    }
}

/// A handle on the store itself, for a command run against Redis.
async fn direct(config: &Config, redis: &crate::config::RedisConfig) -> Result<Control, Failure> {
    let mut redis = redis.clone();
    // A one-off command-line call: give a slow link more than the proxy's budget.
    redis.timeout = redis.timeout.max(Duration::from_secs(2));
    let store = crate::limit::redis_store::RedisStore::open(&redis)
        .await
        .map_err(|e| Failure::other(format!("cannot reach the store: {e}")))?;
    Ok(Control::direct(
        config.throttle.clone(),
        crate::limit::Store::Redis(store),
    ))
}

/// `tollgate limits suggest`: the report of `GET /limits/suggest` from a running instance's
/// admin listener (`admin`, or the config's `admin` address): the record of callers' rates
/// lives in the instances' memory (with Redis, the instance asked merges the fleet's).
pub async fn suggest(
    config: &Config,
    admin: Option<&str>,
    window: &str,
    local: bool,
) -> Result<Value, Failure> {
    let base = admin_base(config, admin, "callers' rates are recorded in each instance's memory and the configuration has no `admin` listener: pass --admin URL")?;
    let url = format!(
        "{base}/limits/suggest?window={}&scope={}&format=json",
        encode(window),
        if local { "local" } else { "fleet" }
    );
    let request = http::Request::get(&url)
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| Failure::usage(format!("`{url}` is not a usable URL: {e}")))?;
    exchange_json(request, &base).await
}

/// The admin listener's base URL: `admin`, or the config's `admin` address.
fn admin_base(config: &Config, admin: Option<&str>, without: &str) -> Result<String, Failure> {
    match admin {
        Some(url) => Ok(url.trim_end_matches('/').to_owned()),
        None => match config.admin {
            Some(address) => Ok(format!("http://{}", reachable(address))),
            None => Err(Failure::usage(without)),
        },
    }
}

/// Percent-encodes a query value (everything but unreserved characters).
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_round_trip_through_the_admin_decoder() {
        for value in ["alice", "a b+c&d=e", "10.0.0.1", "ü/%"] {
            let query = format!("identity={}", encode(value));
            assert_eq!(
                crate::identity::query_param(&query, "identity").unwrap(),
                value.as_bytes()
            );
        }
    }
}

//! A caller's own usage (`usage: { path: /_quota }`): a request to that path on the proxy
//! listener is answered here, never forwarded, and consumes nothing. For the identity the
//! request carries, every route's limits that apply to that caller are listed with what is
//! left of them, when they are full again, and the RateLimit fields its responses on that
//! route carry, as JSON.
//!
//! The keys are built exactly as the request path builds them ([`tiers::applied`] on the
//! request's own [`Caller`]): allow-lists and tiers apply, and nothing but the request's own
//! credentials names a key, so no caller can read another's numbers. A temporary override in
//! force for the caller (in the limit stage's table, as the stage applies it) is applied the
//! same way: its keys, its limits, its `RateLimit-Policy`, and the route lists it with its
//! end, so the numbers are those that decide the caller's next request and the `headers` are
//! those its responses carry (the same fields, at no cost). The state is read
//! without consuming (the stores' `peek`, as `tollgate limits get` reads it), with a cost of
//! zero so that it shows the state as it is rather than after one more request. A route
//! whose key takes a path segment cannot be answered from a request to this path (the
//! segment would be this path's): it is listed as unknown. Identity values are never echoed
//! (a token or key stays where it was sent): only the kind of source that identified the
//! caller is shown.
//!
//! This endpoint has a small rate of its own, [`OWN_LIMIT`] per [`OWN_WINDOW`] per client
//! address (an IPv6 client by its /64) and [`NETWORK_LIMIT`] per network (an IPv4 /24, an
//! IPv6 /48), kept in each replica's memory in a bounded table ([`OwnRate`]), so that it
//! cannot be used to hammer the store, and a flood cannot lock other callers out of it. Keyed
//! by address rather than by identity: identities are whatever the client sends, an address
//! is not. Its refusals (405, 429, 503) are rendered by `answers`, as tollgate's other
//! answers.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant, UNIX_EPOCH};

use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http::{Method, Response};
use serde_json::{json, Map, Value};

use crate::answers::{Answer, Form};
use crate::body::{self, ProxyBody};
use crate::config::{Limit, LimitSet, StoreConfig, Throttle};
use crate::identity::caller::{self, Caller};
use crate::identity::Source;
use crate::limit::algorithm::{Params, Verdict};
use crate::limit::{Algorithm, Check, Decision, Store, StoreError};
use crate::store::Stores;
use crate::throttle::headers as limit_headers;
use crate::throttle::overrides::Adjust;
use crate::throttle::tiers::{self, Applied};
use crate::throttle::LimitStage;

/// Requests to the usage path one client address may make per [`OWN_WINDOW`].
pub const OWN_LIMIT: u32 = 10;
/// Requests to the usage path one network (an IPv4 /24, an IPv6 /48) may make per
/// [`OWN_WINDOW`], all its addresses together: a flood that takes a new address for every
/// request is limited as its network.
pub const NETWORK_LIMIT: u32 = 16 * OWN_LIMIT;
/// The window of [`OWN_LIMIT`] and [`NETWORK_LIMIT`].
pub const OWN_WINDOW: Duration = Duration::from_secs(10);
/// Clients and networks remembered at once. Past it, a newcomer takes the place of the
/// coldest of [`EVICTION_PROBES`] entries (see [`OwnRate`]): the table never grows, and never
/// refuses a caller for lack of room.
pub const OWN_ENTRIES: usize = 65_536;
/// Entries looked at, from the clock hand on, to find the one a newcomer replaces.
const EVICTION_PROBES: usize = 16;

/// What an entry of [`OwnRate`] counts: one client (an IPv4 address, an IPv6 /64) or one
/// network (an IPv4 /24, an IPv6 /48).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Counted {
    Client(IpAddr),
    Network(IpAddr),
}

impl Counted {
    fn limit(self) -> u32 {
        match self {
            Counted::Client(_) => OWN_LIMIT,
            Counted::Network(_) => NETWORK_LIMIT,
        }
    }
}

/// One fixed window.
#[derive(Clone, Copy)]
struct Window {
    counted: Counted,
    start: Instant,
    count: u32,
}

impl Window {
    /// How close to its limit the window is, in thousandths (0: at rest, its window over).
    fn heat(&self, now: Instant) -> u32 {
        if now.duration_since(self.start) >= OWN_WINDOW {
            return 0;
        }
        self.count.saturating_mul(1000) / self.counted.limit()
    }
}

/// The usage endpoint's own rate: one fixed window per client and one per network, in this
/// process, in a table of at most [`OWN_ENTRIES`].
///
/// A request is refused (429) only when its client or its network has used its window;
/// nothing else refuses it. When the table is full, a newcomer takes the place of the
/// coldest of the [`EVICTION_PROBES`] entries from a clock hand on: one at rest first, else
/// the one furthest from its limit. A flood from new addresses fills the table with entries
/// of one request each, which are what newcomers replace; an entry that has reached its limit
/// goes only when every entry probed is at its limit too. So a caller not seen before is
/// always answered (unless its own network is the one flooding), a flood from one network is
/// limited to [`NETWORK_LIMIT`] per window, and a caller being limited stays limited unless
/// the table is full of callers being limited (more than [`OWN_ENTRIES`] addresses, each at
/// its limit, within one window).
pub struct OwnRate(Mutex<Table>);

impl Default for OwnRate {
    fn default() -> Self {
        OwnRate(Mutex::new(Table {
            index: HashMap::new(),
            windows: Vec::new(),
            hand: 0,
            capacity: OWN_ENTRIES,
        }))
    }
}

struct Table {
    index: HashMap<Counted, usize>,
    windows: Vec<Window>,
    /// Where the next eviction starts looking.
    hand: usize,
    capacity: usize,
}

impl Table {
    /// The window of `counted` as it stands at `now`, if it has one.
    fn used(&self, counted: Counted, now: Instant) -> Option<Duration> {
        let window = &self.windows[*self.index.get(&counted)?];
        let elapsed = now.duration_since(window.start);
        (elapsed < OWN_WINDOW && window.count >= counted.limit()).then(|| OWN_WINDOW - elapsed)
    }

    /// Counts one request in the window of `counted`, making room for it if need be (never
    /// in the slot `keep`). Returns its slot.
    fn count(&mut self, counted: Counted, now: Instant, keep: Option<usize>) -> usize {
        let slot = match self.index.get(&counted) {
            Some(&slot) => slot,
            None => {
                let fresh = Window {
                    counted,
                    start: now,
                    count: 0,
                };
                let slot = if self.windows.len() < self.capacity {
                    self.windows.push(fresh);
                    self.windows.len() - 1
                } else {
                    let slot = self.coldest(now, keep);
                    self.index.remove(&self.windows[slot].counted);
                    self.windows[slot] = fresh;
                    slot
                };
                self.index.insert(counted, slot);
                slot
            }
        };
        let window = &mut self.windows[slot];
        if now.duration_since(window.start) >= OWN_WINDOW {
            window.start = now;
            window.count = 0;
        }
        window.count += 1;
        slot
    }

    /// The slot to give a newcomer: the coldest of the probed ones, at rest first.
    fn coldest(&mut self, now: Instant, keep: Option<usize>) -> usize {
        let len = self.windows.len();
        let mut best: Option<(u32, usize)> = None;
        for step in 0..EVICTION_PROBES.min(len) {
            let slot = (self.hand + step) % len;
            if Some(slot) == keep {
                continue;
            }
            let heat = self.windows[slot].heat(now);
            if best.is_none_or(|(coldest, _)| heat < coldest) {
                best = Some((heat, slot));
            }
            if heat == 0 {
                break;
            }
        }
        let slot = best.map_or((self.hand + 1) % len, |(_, slot)| slot);
        self.hand = (slot + 1) % len;
        slot
    }
}

impl OwnRate {
    /// A table of `capacity` entries instead of [`OWN_ENTRIES`] (tests).
    #[cfg(test)]
    fn with_capacity(capacity: usize) -> Self {
        let rate = OwnRate::default();
        rate.0.lock().unwrap().capacity = capacity;
        rate
    }

    /// Counts one request from `ip`; Err with the time until its window ends when its client
    /// or its network is over its limit (nothing is counted then).
    fn admit(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let client = Counted::Client(client_of(ip));
        let network = Counted::Network(network_of(ip));
        let mut table = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(wait) = table.used(client, now).or(table.used(network, now)) {
            return Err(wait);
        }
        let client_slot = table.index.get(&client).copied();
        let kept = table.count(network, now, client_slot);
        table.count(client, now, Some(kept));
        Ok(())
    }

    /// Entries held (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap().windows.len()
    }
}

/// The client an address counts as: an IPv4 address itself, an IPv6 address by its /64 (one
/// subscriber's network, which holds more addresses than a map could).
fn client_of(ip: IpAddr) -> IpAddr {
    masked(ip, 32, 64)
}

/// The network an address counts in: an IPv4 /24, an IPv6 /48 (one site's allocation, which
/// holds 65,536 /64s).
fn network_of(ip: IpAddr) -> IpAddr {
    masked(ip, 24, 48)
}

/// `ip` (IPv4-mapped IPv6 as IPv4) with only its first `v4` or `v6` bits kept.
fn masked(ip: IpAddr, v4: u32, v6: u32) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(a) => IpAddr::V6((u128::from(a) & (u128::MAX << (128 - v6))).into()),
        IpAddr::V4(a) => IpAddr::V4((u32::from(a) & (u32::MAX << (32 - v4))).into()),
    }
}

/// Answers a request to the usage path: 405 for a method other than GET or HEAD, 429 past
/// the endpoint's own rate, 503 when the shared store cannot be read (those three rendered by
/// `answers` in `form`), otherwise the caller's usage as JSON.
pub async fn answer(
    stage: &LimitStage,
    request: &Parts,
    peer: IpAddr,
    own: &OwnRate,
    form: Form,
) -> Response<ProxyBody> {
    let head = request.method == Method::HEAD;
    if request.method != Method::GET && !head {
        return Answer::UsageMethod.render(form).1;
    }
    let throttle = stage.config();
    let mut caller = caller::identify(request, peer, &throttle.trusted_proxies);
    if let Err(wait) = own.admit(caller.ip, Instant::now()) {
        let busy = Answer::UsageBusy {
            limit: OWN_LIMIT,
            window_secs: OWN_WINDOW.as_secs(),
            retry_secs: limit_headers::retry_after_secs(wait.as_micros() as i64),
        };
        return busy.render(form).1;
    }
    let routes = match usage(stage, &mut caller).await {
        Ok(routes) => routes,
        Err(error) => {
            // The store's own failures are logged where they happen; this is one more reader.
            tracing::debug!(%error, "the usage endpoint could not read the store");
            return Answer::UsageUnreadable.render(form).1;
        }
    };
    let body = serde_json::to_vec(&json!({ "routes": routes })).expect("JSON values serialize");
    let body = if head {
        body::empty()
    } else {
        body::full(body)
    };
    answer_json(body)
}

/// The caller's usage: never cached (it is one caller's state at one moment).
fn answer_json(body: ProxyBody) -> Response<ProxyBody> {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Why the usage could not be read.
#[derive(Debug, thiserror::Error)]
enum Unreadable {
    #[error("the store is not connected or not answering")]
    NotReady,
    #[error("the store took longer than {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Per route, in route order, what applies to `caller` and what is left of it.
async fn usage(stage: &LimitStage, caller: &mut Caller<'_>) -> Result<Vec<Value>, Unreadable> {
    let throttle = stage.config();
    let mut routes = Vec::with_capacity(throttle.routes.len());
    for route in &throttle.routes {
        let (set, tier, keys, identity) = match tiers::applied(throttle, route, caller) {
            Applied::Exempt => {
                routes.push(json!({ "route": route.name, "exempt": true }));
                continue;
            }
            Applied::Keyed {
                set,
                tier,
                keys,
                identity,
            } => (set, tier, keys, identity),
        };
        let mut entry = Map::new();
        entry.insert("route".into(), route.name.clone().into());
        entry.insert("tier".into(), tier.map(|t| t.name.clone()).into());
        if by_path_segment(set) {
            entry.insert("identity".into(), "path_segment".into());
            entry.insert(
                "unknown".into(),
                "this route's key takes a segment of the request's path, which a request to the usage path does not carry".into(),
            );
            routes.push(Value::Object(entry));
            continue;
        }
        entry.insert("identity".into(), identity.into());
        route_usage(stage, set, keys, &mut entry).await?;
        routes.push(Value::Object(entry));
    }
    Ok(routes)
}

/// One route's limits for the caller whose keys are `keys` (one per limit of `set`), as the
/// limit stage would decide its next request: under a temporary override in force, on the
/// override's keys with its limits.
async fn route_usage(
    stage: &LimitStage,
    set: &LimitSet,
    mut keys: Vec<String>,
    entry: &mut Map<String, Value>,
) -> Result<(), Unreadable> {
    let throttle = stage.config();
    let overrides = stage.overrides();
    let in_force = overrides.in_force(&keys);
    if in_force.is_some() {
        overrides.rekey(&mut keys);
    }
    let mut checks: Vec<Check<'_>> = set
        .iter()
        .zip(&keys)
        .map(|(limit, key)| at_no_cost(limit, key))
        .collect();
    if in_force.is_some() {
        overrides.apply(&mut checks);
    }
    // Each limit is read twice in the one round trip: as it stands (what is left now) and at
    // the limit's cost (what the next request would be answered). A refusal is reported as the
    // refused request's own verdict, so `retry_after_seconds`, the RateLimit `t` and the next
    // 429's `Retry-After` are one computation.
    let next: Vec<Check<'_>> = set
        .iter()
        .zip(&checks)
        .map(|(limit, check)| Check {
            params: Params {
                cost: limit.params.cost,
                ..check.params
            },
            ..*check
        })
        .collect();
    let limits_read: Vec<&Limit> = set.iter().chain(set.iter()).collect();
    let both: Vec<Check<'_>> = checks.iter().chain(&next).copied().collect();
    let (read, at) = peek(throttle, stage.stores(), &limits_read, &both).await?;
    let (now, then) = read.split_at(set.len());
    let verdicts: Vec<Verdict> = now
        .iter()
        .zip(then)
        .zip(&next)
        .map(|((now, then), check)| as_next_answered(*now, *then, check.block_us, at))
        .collect();
    let limits: Vec<Value> = set
        .iter()
        .zip(&checks)
        .zip(&verdicts)
        .map(|((limit, check), verdict)| limit_json(limit, &check.params, verdict, at))
        .collect();
    entry.insert(
        "override".into(),
        in_force.map_or(Value::Null, override_json),
    );
    entry.insert("limits".into(), limits.into());
    let policy = in_force.map(|_| limit_headers::policy_for(set, &checks));
    let mut fields = HeaderMap::new();
    limit_headers::add_fields_with(
        &mut fields,
        &throttle.response,
        set,
        policy.as_ref(),
        &verdicts,
        true,
    );
    let fields: Map<String, Value> = fields
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes())
                    .into_owned()
                    .into(),
            )
        })
        .collect();
    entry.insert("headers".into(), fields.into());
    Ok(())
}

/// A temporary override in force, as the caller reads it: the limit it sets or the factor it
/// multiplies by, and when it ends.
fn override_json((adjust, until_ms): (Adjust, u64)) -> Value {
    let mut shown = Map::new();
    match adjust {
        Adjust::Limit(n) => shown.insert("limit".into(), n.into()),
        Adjust::Multiply(f) => shown.insert("multiply".into(), f.into()),
    };
    // To the millisecond, as the operators' endpoints show an override's end.
    let expires_at = UNIX_EPOCH + Duration::from_millis(until_ms);
    shown.insert(
        "expires_at".into(),
        humantime::format_rfc3339_millis(expires_at)
            .to_string()
            .into(),
    );
    let left_ms = until_ms.saturating_sub(crate::throttle::overrides::now_ms());
    shown.insert(
        "expires_in_seconds".into(),
        (left_ms as f64 / 1000.0).into(),
    );
    Value::Object(shown)
}

/// Whether any of the set's keys takes a path segment (then the usage path cannot stand in
/// for the route's own requests).
fn by_path_segment(set: &LimitSet) -> bool {
    set.iter().any(|l| {
        l.key.iter().any(|i| {
            i.sources
                .iter()
                .any(|s| matches!(s, Source::PathSegment(_)))
        })
    })
}

/// The verdicts of `checks` (one per limit of `set`) as they stand (nothing consumed), and
/// the time the store read them at (Unix microseconds, the store's clock). Each store is read
/// once: local limits (and every limit without a shared store) in memory, the others in the
/// shared store, bounded by its timeout.
async fn peek(
    throttle: &Throttle,
    stores: &Stores,
    set: &[&Limit],
    all: &[Check<'_>],
) -> Result<(Vec<Verdict>, i64), Unreadable> {
    let shared = |limit: &Limit| stores.holder(limit).is_shared();
    let mut verdicts: Vec<Option<Verdict>> = vec![None; set.len()];
    let mut at = 0;
    let local: Vec<usize> = (0..set.len()).filter(|&i| !shared(set[i])).collect();
    if !local.is_empty() {
        let checks: Vec<Check<'_>> = local.iter().map(|&i| all[i]).collect();
        let Store::Memory(memory) = stores.memory() else {
            unreachable!("the memory store is always in memory");
        };
        let decision = memory.peek(&checks);
        place(&mut verdicts, &local, &decision);
        at = decision.at;
    }
    let global: Vec<usize> = (0..set.len()).filter(|&i| shared(set[i])).collect();
    if !global.is_empty() {
        let (Some(store), true) = (stores.shared(), stores.ready()) else {
            return Err(Unreadable::NotReady);
        };
        let checks: Vec<Check<'_>> = global.iter().map(|&i| all[i]).collect();
        let timeout = match &throttle.store {
            StoreConfig::Redis(redis) => redis.timeout,
            // A shared store is configured as Redis.
            StoreConfig::Memory => return Err(Unreadable::NotReady),
        };
        let read = async {
            match store {
                Store::Memory(memory) => Ok(memory.peek(&checks)),
                Store::Redis(redis) => redis.peek(&checks).await,
            }
        };
        let decision = tokio::time::timeout(timeout, read)
            .await
            .map_err(|_| Unreadable::Timeout(timeout))??;
        place(&mut verdicts, &global, &decision);
        at = decision.at;
    }
    let verdicts = verdicts
        .into_iter()
        .map(|v| v.expect("every limit is read from one store"))
        .collect();
    Ok((verdicts, at))
}

/// One limit as its next request would find it, from its state read at no cost (`now`) and at
/// the limit's cost (`then`), both at `at`: while the next request would pass, the state as it
/// stands (what is left now); once it would be refused, the verdict that refusal carries,
/// including the block (`block_for`) it would start, as the limit stage answers it.
fn as_next_answered(now: Verdict, then: Verdict, block_us: i64, at: i64) -> Verdict {
    if then.allowed || !now.allowed {
        // Passing, or refused already by a running block (which the peek at no cost shows).
        return if now.allowed { now } else { then };
    }
    crate::limit::algorithm::penalty_box(then, None, block_us, at).0
}

/// The check of `limit` under `key` at no cost: the state as it is, not as one more request
/// would leave it.
fn at_no_cost<'k>(limit: &Limit, key: &'k str) -> Check<'k> {
    Check {
        params: crate::limit::algorithm::Params {
            cost: 0,
            ..limit.params
        },
        ..limit.check(key)
    }
}

/// Puts `decision`'s verdicts (for the limits at `indices`) in their places.
fn place(verdicts: &mut [Option<Verdict>], indices: &[usize], decision: &Decision) {
    for (&i, verdict) in indices.iter().zip(&decision.verdicts) {
        verdicts[i] = Some(*verdict);
    }
}

/// One limit as the caller reads it, with the parameters that decide it (`params`: the
/// limit's own, or a temporary override's). `at` is when the store read it (Unix
/// microseconds).
fn limit_json(limit: &Limit, params: &Params, verdict: &Verdict, at: i64) -> Value {
    let concurrency = limit.params.algorithm == Algorithm::Concurrency;
    // Seconds until the state is full again, rounded up as every seconds field tollgate sends.
    let reset_seconds = limit_headers::ceil_secs(verdict.reset_after_us);
    let resets_at = (!concurrency).then(|| {
        let at_seconds = limit_headers::ceil_secs(at + verdict.reset_after_us.max(0));
        humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(at_seconds)).to_string()
    });
    let blocked = !verdict.allowed;
    let t = if blocked {
        if verdict.retry_after_us < 0 {
            0
        } else {
            limit_headers::retry_after_secs(verdict.retry_after_us)
        }
    } else {
        reset_seconds
    };
    let ratelimit = format!("\"{}\";r={};t={t}", limit.name, verdict.remaining);
    let policy = limit_headers::policy_of(std::iter::once((limit.name.as_str(), params)));
    json!({
        "name": limit.name,
        "algorithm": limit.params.algorithm.name(),
        "scope": limit.scope.as_str(),
        "shared_by_everyone": shared_by_everyone(limit),
        "shadow": limit.shadow,
        "limit": verdict.limit,
        "remaining": verdict.remaining,
        "cost": limit.params.cost,
        // Whether one more request of the limit's cost would pass now.
        "would_pass": verdict.allowed,
        "resets_at": resets_at,
        "reset_after_seconds": reset_seconds,
        "retry_after_seconds": blocked.then_some(t),
        "policy": String::from_utf8_lossy(policy.as_bytes()),
        "ratelimit": ratelimit,
    })
}

/// Whether a limit's key is one counter for every caller (`key: global`).
fn shared_by_everyone(limit: &Limit) -> bool {
    limit
        .key
        .iter()
        .all(|i| i.sources.iter().all(|s| matches!(s, Source::Global)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_rate_admits_its_limit_per_window_per_client() {
        let own = OwnRate::default();
        let start = Instant::now();
        let alice: IpAddr = "192.0.2.1".parse().unwrap();
        let bob: IpAddr = "192.0.2.2".parse().unwrap();
        for _ in 0..OWN_LIMIT {
            assert!(own.admit(alice, start).is_ok());
        }
        let later = start + Duration::from_secs(4);
        assert_eq!(
            own.admit(alice, later),
            Err(OWN_WINDOW - Duration::from_secs(4))
        );
        // Another client has a window of its own.
        assert!(own.admit(bob, later).is_ok());
        // A new window starts once the old one has ended.
        assert!(own.admit(alice, start + OWN_WINDOW).is_ok());
    }

    #[test]
    fn an_ipv6_client_counts_by_its_64() {
        let own = OwnRate::default();
        let now = Instant::now();
        for i in 0..OWN_LIMIT {
            let ip: IpAddr = format!("2001:db8::{i:x}").parse().unwrap();
            assert!(own.admit(ip, now).is_ok());
        }
        let same_network: IpAddr = "2001:db8::ffff:1".parse().unwrap();
        assert!(own.admit(same_network, now).is_err());
        let other_network: IpAddr = "2001:db8:0:1::1".parse().unwrap();
        assert!(own.admit(other_network, now).is_ok());
        // An IPv4-mapped address is the IPv4 client.
        let v4: IpAddr = "192.0.2.9".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.9".parse().unwrap();
        for _ in 0..OWN_LIMIT {
            assert!(own.admit(v4, now).is_ok());
        }
        assert!(own.admit(mapped, now).is_err());
    }

    /// Issue 38: a flood with a new address for every request (each from a network of its
    /// own) fills the table; a caller not seen before is still answered, and a caller limited
    /// before the flood is still limited.
    #[test]
    fn a_flood_of_new_addresses_never_locks_out_a_newcomer() {
        let own = OwnRate::with_capacity(256);
        let now = Instant::now();
        let limited: IpAddr = "198.51.100.7".parse().unwrap();
        for _ in 0..OWN_LIMIT {
            assert!(own.admit(limited, now).is_ok());
        }
        for i in 0..10_000u32 {
            let ip = IpAddr::V4(((10 << 24) | (i << 8) | 1).into());
            assert!(own.admit(ip, now).is_ok(), "flood request {i}");
            assert!(own.admit(limited, now).is_err(), "after flood request {i}");
        }
        assert_eq!(own.len(), 256);
        for newcomer in ["192.0.2.200", "2001:db8:1::1"] {
            assert!(
                own.admit(newcomer.parse().unwrap(), now).is_ok(),
                "{newcomer}"
            );
        }
        // Windows end: the limited caller is answered again.
        assert!(own.admit(limited, now + OWN_WINDOW).is_ok());
    }

    /// The flood: every /64 of one IPv6 /48 (65,536 of them) once. The network is
    /// limited as one; other networks are not touched.
    #[test]
    fn a_flood_from_one_network_is_limited_as_that_network() {
        let own = OwnRate::default();
        let now = Instant::now();
        let mut admitted = 0;
        for i in 0..65_536u128 {
            let ip = std::net::Ipv6Addr::from((0x2001_0db8_0000u128 << 80) | (i << 64) | 1);
            admitted += u32::from(own.admit(IpAddr::V6(ip), now).is_ok());
        }
        assert_eq!(admitted, NETWORK_LIMIT);
        assert_eq!(own.len(), 1 + NETWORK_LIMIT as usize);
        assert!(own.admit("2001:db8:1::1".parse().unwrap(), now).is_ok());
        assert!(own.admit("192.0.2.1".parse().unwrap(), now).is_ok());
        // An IPv4 /24 likewise.
        let mut admitted = 0;
        for i in 0..=255u32 {
            let ip = IpAddr::V4(((203 << 24) | (113 << 8) | i).into());
            admitted += u32::from(own.admit(ip, now).is_ok());
        }
        assert_eq!(admitted, NETWORK_LIMIT);
    }
}

//! Redis-backed limit store: quotas shared by every proxy instance using the same Redis.
//!
//! A decision is ONE `EVALSHA` of `decide.lua`, which mirrors [`super::algorithm`] inside
//! Redis so that all limits of a request are checked and consumed atomically, on Redis's own
//! clock (proxy clocks may disagree). One multiplexed, auto-reconnecting connection
//! ([`ConnectionManager`]) is shared by all requests, and every call is bounded by the
//! configured timeout so a stuck Redis surfaces as [`StoreError::Timeout`] instead of stalling
//! the proxy.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

use super::algorithm::{Algorithm, Micros, Verdict};
use super::{new_lease_id, Check, Decision, Lease, StoreError};

const DECIDE_LUA: &str = include_str!("decide.lua");
const RELEASE_LUA: &str = include_str!("release.lua");
const REFRESH_LUA: &str = include_str!("refresh.lua");

/// Reconnection backoff bounds (before jitter): limiting resumes well within a second of
/// Redis coming back.
const RECONNECT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_millis(300));
/// Commands buffered towards Redis before callers wait (inside their timeout): bounded, so a
/// stalled Redis cannot make memory grow.
const PIPELINE_BUFFER: usize = 256;

/// The line of each clocked script that [`ScriptClock`] switches.
const CLOCK_LINE: &str = "local CLOCK = 'redis' -- @clock";

/// Where a script takes the time from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScriptClock {
    /// `redis.call('TIME')`: the only choice for production.
    Redis,
    /// The first ARGV (microseconds), so tests can drive the script on a fake clock. Keys then
    /// get an hour of extra expiry, since Redis still expires them on its real clock.
    Argv,
}

fn with_clock(src: &str, clock: ScriptClock) -> String {
    assert!(src.contains(CLOCK_LINE), "script lost its clock marker");
    match clock {
        ScriptClock::Redis => src.to_string(),
        ScriptClock::Argv => src.replacen(CLOCK_LINE, "local CLOCK = 'argv' -- @clock", 1),
    }
}

/// `decide.lua` with the given clock (both variants share every other line).
pub fn decide_script_source(clock: ScriptClock) -> String {
    with_clock(DECIDE_LUA, clock)
}

/// `refresh.lua` with the given clock.
pub fn refresh_script_source(clock: ScriptClock) -> String {
    with_clock(REFRESH_LUA, clock)
}

/// `release.lua` (it needs no clock).
pub fn release_script_source() -> String {
    RELEASE_LUA.to_string()
}

struct Scripts {
    decide: Script,
    release: Script,
    refresh: Script,
}

/// Limit states in Redis. Clone is cheap: clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    timeout: Duration,
    clock: ScriptClock,
    scripts: Arc<Scripts>,
    description: String,
}

impl RedisStore {
    /// Connects to `url` (`redis://` or `rediss://`); `timeout` bounds connecting and every
    /// later call.
    pub async fn connect(url: &str, timeout: Duration) -> Result<RedisStore, StoreError> {
        RedisStore::connect_with_clock(url, timeout, ScriptClock::Redis).await
    }

    /// Like [`RedisStore::connect`] with a chosen script clock: [`ScriptClock::Argv`] is for
    /// tests only, and such a store decides only through [`RedisStore::decide_at`].
    pub async fn connect_with_clock(
        url: &str,
        timeout: Duration,
        clock: ScriptClock,
    ) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url)?;
        // Reconnection backoff is capped low: callers never wait on it (every call is bounded
        // by `timeout` and the breaker stops calls while Redis is away), and a long sleep
        // between attempts would delay limiting by that much after Redis returns.
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(timeout))
            .set_min_delay(RECONNECT_BACKOFF.0)
            .set_max_delay(RECONNECT_BACKOFF.1)
            .set_pipeline_buffer_size(PIPELINE_BUFFER);
        let conn =
            tokio::time::timeout(timeout, ConnectionManager::new_with_config(client, config))
                .await
                .map_err(|_| StoreError::Timeout(timeout))?
                .map_err(|e| map_err(e, timeout))?;
        Ok(RedisStore {
            conn,
            timeout,
            clock,
            scripts: Arc::new(Scripts {
                decide: Script::new(&decide_script_source(clock)),
                release: Script::new(&release_script_source()),
                refresh: Script::new(&refresh_script_source(clock)),
            }),
            description: format!("redis {}", redact(url)),
        })
    }

    /// See [`super::Store::decide`]: one round trip, time read inside Redis.
    pub async fn decide(&self, checks: &[Check<'_>]) -> Result<Decision, StoreError> {
        self.run_decide(checks, None).await
    }

    /// [`RedisStore::decide`] at a given time, for stores connected with [`ScriptClock::Argv`].
    pub async fn decide_at(
        &self,
        checks: &[Check<'_>],
        now: Micros,
    ) -> Result<Decision, StoreError> {
        self.run_decide(checks, Some(now)).await
    }

    fn check_clock(&self, now: Option<Micros>) -> Result<(), StoreError> {
        match (self.clock, now) {
            (ScriptClock::Redis, None) | (ScriptClock::Argv, Some(_)) => Ok(()),
            _ => Err(StoreError::Protocol(format!(
                "a store with the {:?} script clock was called {} a time",
                self.clock,
                if now.is_some() { "with" } else { "without" }
            ))),
        }
    }

    async fn run_decide(
        &self,
        checks: &[Check<'_>],
        now: Option<Micros>,
    ) -> Result<Decision, StoreError> {
        self.check_clock(now)?;
        if checks.is_empty() {
            return Ok(Decision {
                allowed: true,
                verdicts: Vec::new(),
                leases: Vec::new(),
            });
        }
        let lease_ids: Vec<u64> = checks
            .iter()
            .map(|c| {
                if c.params.algorithm == Algorithm::Concurrency {
                    new_lease_id()
                } else {
                    0
                }
            })
            .collect();
        let mut invocation = self.scripts.decide.prepare_invoke();
        if let Some(now) = now {
            invocation.arg(now);
        }
        for (c, lease) in checks.iter().zip(&lease_ids) {
            let p = &c.params;
            invocation
                .key(c.key)
                .arg(p.algorithm.code())
                .arg(p.limit)
                .arg(p.period_us)
                .arg(p.burst)
                .arg(p.cost)
                .arg(u8::from(c.shadow))
                .arg(*lease);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = self.bounded(invocation.invoke_async(&mut conn)).await?;
        parse_decision(checks, &lease_ids, &reply)
    }

    /// See [`super::Store::release`].
    pub async fn release(&self, leases: &[Lease]) -> Result<(), StoreError> {
        if leases.is_empty() {
            return Ok(());
        }
        let mut invocation = self.scripts.release.prepare_invoke();
        for lease in leases {
            invocation.key(&lease.key).arg(lease.id);
        }
        let mut conn = self.conn.clone();
        let _removed: i64 = self.bounded(invocation.invoke_async(&mut conn)).await?;
        Ok(())
    }

    /// See [`super::Store::refresh`].
    pub async fn refresh(&self, leases: &[Lease]) -> Result<Vec<bool>, StoreError> {
        self.run_refresh(leases, None).await
    }

    /// [`RedisStore::refresh`] at a given time, for stores connected with
    /// [`ScriptClock::Argv`].
    pub async fn refresh_at(&self, leases: &[Lease], now: Micros) -> Result<Vec<bool>, StoreError> {
        self.run_refresh(leases, Some(now)).await
    }

    async fn run_refresh(
        &self,
        leases: &[Lease],
        now: Option<Micros>,
    ) -> Result<Vec<bool>, StoreError> {
        self.check_clock(now)?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = self.scripts.refresh.prepare_invoke();
        if let Some(now) = now {
            invocation.arg(now);
        }
        for lease in leases {
            invocation
                .key(&lease.key)
                .arg(lease.params.period_us)
                .arg(lease.id);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = self.bounded(invocation.invoke_async(&mut conn)).await?;
        if reply.len() != leases.len() {
            return Err(StoreError::Protocol(format!(
                "refresh replied {} values for {} leases",
                reply.len(),
                leases.len()
            )));
        }
        Ok(reply.into_iter().map(|r| r == 1).collect())
    }

    /// `"redis redis://host:port/db"`, with any user/password left out.
    pub fn describe(&self) -> String {
        self.description.clone()
    }

    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map_err(|e| map_err(e, self.timeout)),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

/// The connection's own response timeout may fire first: it is the same timeout.
fn map_err(e: redis::RedisError, timeout: Duration) -> StoreError {
    if e.is_timeout() {
        StoreError::Timeout(timeout)
    } else {
        StoreError::Redis(e)
    }
}

/// The URL without its user/password (logs and admin pages must never show them).
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(unparsable url)".to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{} (user/password hidden)", &rest[at + 1..]),
        None => format!("{scheme}://{rest}"),
    }
}

fn parse_decision(
    checks: &[Check<'_>],
    lease_ids: &[u64],
    reply: &[i64],
) -> Result<Decision, StoreError> {
    if reply.len() != 1 + 5 * checks.len() {
        return Err(StoreError::Protocol(format!(
            "decide replied {} values for {} checks",
            reply.len(),
            checks.len()
        )));
    }
    let flag = |v: i64| match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(StoreError::Protocol(format!("expected 0 or 1, got {v}"))),
    };
    let count =
        |v: i64| u64::try_from(v).map_err(|_| StoreError::Protocol(format!("negative count {v}")));
    let allowed = flag(reply[0])?;
    let mut verdicts = Vec::with_capacity(checks.len());
    let mut leases = Vec::new();
    for (i, (c, id)) in checks.iter().zip(lease_ids).enumerate() {
        let r = &reply[1 + 5 * i..6 + 5 * i];
        let verdict = Verdict {
            allowed: flag(r[0])?,
            limit: count(r[1])?,
            remaining: count(r[2])?,
            reset_after_us: r[3],
            retry_after_us: r[4],
        };
        if allowed && verdict.allowed && c.params.algorithm == Algorithm::Concurrency {
            leases.push(Lease {
                key: c.key.to_string(),
                id: *id,
                params: c.params,
            });
        }
        verdicts.push(verdict);
    }
    Ok(Decision {
        allowed,
        verdicts,
        leases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_credentials() {
        assert_eq!(
            redact("redis://user:secret@cache:6380/2"),
            "redis://cache:6380/2 (user/password hidden)"
        );
        assert_eq!(
            redact("rediss://:p%40ss@h:1"),
            "rediss://h:1 (user/password hidden)"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }

    #[test]
    fn clock_variants_differ_only_in_the_clock_line() {
        let redis = decide_script_source(ScriptClock::Redis);
        let argv = decide_script_source(ScriptClock::Argv);
        let diff: Vec<_> = redis
            .lines()
            .zip(argv.lines())
            .filter(|(a, b)| a != b)
            .collect();
        assert_eq!(diff.len(), 1);
        assert_eq!(
            refresh_script_source(ScriptClock::Argv)
                .matches("'argv'")
                .count(),
            3
        );
    }
}

//! Redis-backed limit store: quotas shared by every proxy instance using the same Redis.
//!
//! A decision is ONE `EVALSHA` of `decide.lua`, which mirrors [`super::algorithm`] inside
//! Redis so that all limits of a request are checked and consumed atomically, on Redis's own
//! clock (proxy clocks may disagree). The same store type runs over one server
//! ([`ConnectionManager`]), a Redis Cluster (redis-rs's async cluster client, which routes by
//! the keys' hash slot and follows MOVED/ASK and failovers) or a Sentinel-managed master
//! ([`super::sentinel`]); each keeps one multiplexed connection per node shared by all
//! requests. Every call is bounded by the configured timeout so a stuck Redis surfaces as
//! [`StoreError::Timeout`] instead of stalling the proxy.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{
    ClientTlsConfig, ConnectionInfo, ErrorKind, FromRedisValue, IntoConnectionInfo, RedisError,
    RedisResult, Script, ServerErrorKind, TlsCertificates,
};

use super::coalesce::{Coalescer, Pending};
use super::sentinel::SentinelMaster;
use crate::config::{RedisConfig, RedisMode};

use super::algorithm::{Algorithm, Micros, Verdict};
use super::{new_lease_id, Check, Decision, Lease, StoreError};

const PRELUDE_LUA: &str = include_str!("prelude.lua");
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

/// `src` behind the shared prelude (clock and number helpers), on the given clock.
fn with_clock(src: &str, clock: ScriptClock) -> String {
    let source = format!("{PRELUDE_LUA}\n{src}");
    assert!(
        source.contains(CLOCK_LINE),
        "the prelude lost its clock marker"
    );
    match clock {
        ScriptClock::Redis => source,
        ScriptClock::Argv => source.replacen(CLOCK_LINE, "local CLOCK = 'argv' -- @clock", 1),
    }
}

/// `decide.lua` with the given clock (both variants share every other line).
pub fn decide_script_source(clock: ScriptClock) -> String {
    with_clock(DECIDE_LUA, clock)
}

/// The line of `decide.lua` that switches it to its batch form.
const BATCH_LINE: &str = "local BATCH = false -- @batch";

/// `decide.lua` in its batch form: several decisions, each all-or-nothing over its own checks,
/// one after another in one call. ARGV (after the injected time, if any): the number of
/// decisions, then per decision its number of checks and the seven values per check of the
/// single form; KEYS: every decision's keys in order. The reply is the single form's replies,
/// one after another.
pub fn decide_batch_script_source(clock: ScriptClock) -> String {
    let decide = decide_script_source(clock);
    assert!(
        decide.contains(BATCH_LINE),
        "decide.lua lost its batch marker"
    );
    decide.replacen(BATCH_LINE, "local BATCH = true -- @batch", 1)
}

/// The line of `decide.lua` that a peek switches off.
const COMMIT_LINE: &str = "local COMMIT = true -- @commit";

/// `decide.lua` that only reports: the same verdicts, nothing written (for `explain --live`).
pub fn peek_script_source() -> String {
    let decide = decide_script_source(ScriptClock::Redis);
    assert!(
        decide.contains(COMMIT_LINE),
        "decide.lua lost its commit marker"
    );
    decide.replacen(COMMIT_LINE, "local COMMIT = false -- @commit", 1)
}

/// `refresh.lua` with the given clock.
pub fn refresh_script_source(clock: ScriptClock) -> String {
    with_clock(REFRESH_LUA, clock)
}

/// `release.lua` (it needs no clock).
pub fn release_script_source() -> String {
    RELEASE_LUA.to_string()
}

/// A Lua script, run by hash (`EVALSHA`) and, on a node that has not cached it yet, by source.
struct LuaScript {
    hash: String,
    source: String,
}

impl LuaScript {
    fn new(source: String) -> LuaScript {
        LuaScript {
            hash: Script::new(&source).get_hash().to_string(),
            source,
        }
    }
}

struct Scripts {
    decide: LuaScript,
    /// `decide.lua` in its batch form (several requests' decisions in one call).
    decide_batch: LuaScript,
    peek: LuaScript,
    release: LuaScript,
    refresh: LuaScript,
}

/// The connection(s), by deployment. Each holds one multiplexed connection per node that all
/// requests share: concurrent decisions pipeline on it instead of waiting for a pool slot.
#[derive(Clone)]
enum Conn {
    /// One server; reconnects by itself.
    Standalone(ConnectionManager),
    /// Redis Cluster: routes each script by its keys' slot, follows MOVED/ASK and refreshes the
    /// slot map when a node fails or a replica is promoted.
    Cluster(ClusterConnection),
    /// The master named by the Sentinels, rediscovered after connection loss or `READONLY`.
    Sentinel(Arc<SentinelMaster>),
}

/// Limit states in Redis. Clone is cheap: clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    timeout: Duration,
    clock: ScriptClock,
    scripts: Arc<Scripts>,
    description: String,
    /// Set with `coalesce: true`: decisions go through its queue.
    coalescer: Option<Arc<Coalescer>>,
}

impl RedisStore {
    /// Connects to one server at `url` (`redis://` or `rediss://`); `timeout` bounds
    /// connecting and every later call.
    pub async fn connect(url: &str, timeout: Duration) -> Result<RedisStore, StoreError> {
        RedisStore::open(&RedisConfig::standalone(url, timeout)).await
    }

    /// Like [`RedisStore::connect`] with a chosen script clock: [`ScriptClock::Argv`] is for
    /// tests only, and such a store decides only through [`RedisStore::decide_at`].
    pub async fn connect_with_clock(
        url: &str,
        timeout: Duration,
        clock: ScriptClock,
    ) -> Result<RedisStore, StoreError> {
        RedisStore::open_with_clock(&RedisConfig::standalone(url, timeout), clock).await
    }

    /// Connects to the deployment `config` describes (one server, a Cluster or a Sentinel
    /// master) and makes the scripts available on its nodes.
    pub async fn open(config: &RedisConfig) -> Result<RedisStore, StoreError> {
        RedisStore::open_with_clock(config, ScriptClock::Redis).await
    }

    /// [`RedisStore::open`] with a chosen script clock (tests only).
    pub async fn open_with_clock(
        config: &RedisConfig,
        clock: ScriptClock,
    ) -> Result<RedisStore, StoreError> {
        // rediss:// needs the process-wide rustls provider (ring), as the listeners do.
        crate::tls::install_crypto_provider();
        let timeout = config.timeout;
        let scripts = Arc::new(Scripts {
            decide: LuaScript::new(decide_script_source(clock)),
            decide_batch: LuaScript::new(decide_batch_script_source(clock)),
            peek: LuaScript::new(peek_script_source()),
            release: LuaScript::new(release_script_source()),
            refresh: LuaScript::new(refresh_script_source(clock)),
        });
        let connecting = async {
            Ok::<_, RedisError>(match &config.mode {
                RedisMode::Standalone(url) => {
                    let client = standalone_client(url, config)?;
                    // Reconnection backoff is capped low: callers never wait on it (every call
                    // is bounded by `timeout` and the breaker stops calls while Redis is away),
                    // and a long sleep between attempts would delay limiting by that much
                    // after Redis returns.
                    let manager = ConnectionManagerConfig::new()
                        .set_response_timeout(Some(timeout))
                        .set_connection_timeout(Some(timeout))
                        .set_min_delay(RECONNECT_BACKOFF.0)
                        .set_max_delay(RECONNECT_BACKOFF.1)
                        .set_pipeline_buffer_size(PIPELINE_BUFFER);
                    Conn::Standalone(ConnectionManager::new_with_config(client, manager).await?)
                }
                RedisMode::Cluster(nodes) => {
                    let client = cluster_client(nodes, config)?;
                    Conn::Cluster(client.get_async_connection().await?)
                }
                RedisMode::Sentinel { master, nodes } => {
                    Conn::Sentinel(SentinelMaster::connect(master, nodes, config).await?)
                }
            })
        };
        let conn = tokio::time::timeout(timeout, connecting)
            .await
            .map_err(|_| StoreError::Timeout(timeout))?
            .map_err(|e| map_err(e, timeout))?;
        let mut store = RedisStore {
            conn,
            timeout,
            clock,
            scripts,
            description: describe(config),
            coalescer: None,
        };
        store.load_scripts(config.coalesce).await;
        // Only decisions on Redis's clock are coalesced: an injected clock is per call.
        if config.coalesce && clock == ScriptClock::Redis {
            store.coalescer = Some(Arc::new(Coalescer::start(store.clone())));
        }
        Ok(store)
    }

    /// `SCRIPT LOAD` on every node (every primary at least), so the first decisions need no
    /// fallback. Best effort: a node that missed it (down now, added or restarted later)
    /// answers `NOSCRIPT` once and gets the script through `EVAL` then.
    async fn load_scripts(&self, coalesce: bool) {
        let mut scripts = vec![
            &self.scripts.decide,
            &self.scripts.release,
            &self.scripts.refresh,
        ];
        if coalesce {
            scripts.push(&self.scripts.decide_batch);
        }
        for script in scripts {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(&script.source);
            let loaded = match &self.conn {
                Conn::Cluster(cluster) => {
                    let mut cluster = cluster.clone();
                    let everywhere = RoutingInfo::MultiNode((
                        MultipleNodeRoutingInfo::AllNodes,
                        Some(ResponsePolicy::AllSucceeded),
                    ));
                    let primaries = RoutingInfo::MultiNode((
                        MultipleNodeRoutingInfo::AllMasters,
                        Some(ResponsePolicy::AllSucceeded),
                    ));
                    match self
                        .bounded(cluster.route_command(load.clone(), everywhere))
                        .await
                    {
                        Ok(_) => Ok(()),
                        Err(_) => self
                            .bounded(cluster.route_command(load, primaries))
                            .await
                            .map(drop),
                    }
                }
                _ => self.query::<String>(&load).await.map(drop),
            };
            if let Err(e) = loaded {
                tracing::warn!(cause = %e, "could not preload a Lua script; nodes without it get it on first use");
            }
        }
    }

    /// See [`super::Store::decide`]: one round trip, time read inside Redis.
    pub async fn decide(&self, checks: &[Check<'_>]) -> Result<Decision, StoreError> {
        self.run_decide(&self.scripts.decide, checks, None).await
    }

    /// What [`RedisStore::decide`] would answer now, without consuming anything (leases in
    /// the answer are not held).
    pub async fn peek(&self, checks: &[Check<'_>]) -> Result<Decision, StoreError> {
        self.run_decide(&self.scripts.peek, checks, None).await
    }

    /// [`RedisStore::decide`] at a given time, for stores connected with [`ScriptClock::Argv`].
    pub async fn decide_at(
        &self,
        checks: &[Check<'_>],
        now: Micros,
    ) -> Result<Decision, StoreError> {
        self.run_decide(&self.scripts.decide, checks, Some(now))
            .await
    }

    /// Several decisions in ONE call of the batch form, at a given time, for stores connected
    /// with [`ScriptClock::Argv`]: what coalescing sends, driven by tests to hold the batch
    /// form equal to the same decisions made one by one.
    pub async fn decide_batch_at(
        &self,
        decisions: &[Vec<Check<'_>>],
        now: Micros,
    ) -> Result<Vec<Decision>, StoreError> {
        self.check_clock(Some(now))?;
        let lease_ids: Vec<Vec<u64>> = decisions.iter().map(|c| lease_ids(c)).collect();
        let keys: Vec<&str> = decisions.iter().flatten().map(|c| c.key).collect();
        let args = |command: &mut redis::Cmd| {
            command.arg(now).arg(decisions.len());
            for (checks, leases) in decisions.iter().zip(&lease_ids) {
                command.arg(checks.len());
                for (c, lease) in checks.iter().zip(leases) {
                    for value in check_args(c, *lease) {
                        command.arg(value);
                    }
                }
            }
        };
        let flat: Vec<i64> = self.eval(&self.scripts.decide_batch, &keys, args).await?;
        let replies = split_batch_reply(decisions.iter().map(Vec::len), &flat)?;
        decisions
            .iter()
            .zip(&lease_ids)
            .zip(replies)
            .map(|((checks, leases), reply)| parse_decision(checks, leases, reply))
            .collect()
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
        script: &LuaScript,
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
        let lease_ids = lease_ids(checks);
        if let (Some(coalescer), None, true) = (
            &self.coalescer,
            now,
            std::ptr::eq(script, &self.scripts.decide),
        ) {
            let keys = checks.iter().map(|c| c.key.to_string()).collect();
            let mut values = Vec::with_capacity(7 * checks.len());
            for (c, lease) in checks.iter().zip(&lease_ids) {
                values.extend(check_args(c, *lease));
            }
            let reply = tokio::time::timeout(self.timeout, coalescer.decide(keys, values))
                .await
                .map_err(|_| StoreError::Timeout(self.timeout))??;
            return parse_decision(checks, &lease_ids, &reply);
        }
        let keys: Vec<&str> = checks.iter().map(|c| c.key).collect();
        // Numbers go straight into the command buffer (no string per argument).
        let args = |command: &mut redis::Cmd| {
            if let Some(now) = now {
                command.arg(now);
            }
            for (c, lease) in checks.iter().zip(&lease_ids) {
                for value in check_args(c, *lease) {
                    command.arg(value);
                }
            }
        };
        let reply: Vec<i64> = self.eval(script, &keys, args).await?;
        parse_decision(checks, &lease_ids, &reply)
    }

    /// Sends the queued decisions of `batch` in one call and answers each of them (see
    /// `coalesce`): alone with the ordinary script, several with the batch form.
    pub(super) async fn send_batch(&self, batch: Vec<Pending>) {
        let replies = if let [one] = batch.as_slice() {
            let keys: Vec<&str> = one.keys.iter().map(String::as_str).collect();
            let args = |command: &mut redis::Cmd| {
                for value in &one.args {
                    command.arg(*value);
                }
            };
            self.eval::<Vec<i64>>(&self.scripts.decide, &keys, args)
                .await
                .map(|reply| vec![reply])
        } else {
            let keys: Vec<&str> = batch
                .iter()
                .flat_map(|p| p.keys.iter().map(String::as_str))
                .collect();
            let args = |command: &mut redis::Cmd| {
                command.arg(batch.len());
                for p in &batch {
                    command.arg(p.keys.len());
                    for value in &p.args {
                        command.arg(*value);
                    }
                }
            };
            self.eval::<Vec<i64>>(&self.scripts.decide_batch, &keys, args)
                .await
                .and_then(|flat| {
                    split_batch_reply(batch.iter().map(|p| p.keys.len()), &flat)
                        .map(|replies| replies.into_iter().map(<[i64]>::to_vec).collect())
                })
        };
        match replies {
            Ok(replies) => {
                for (p, reply) in batch.into_iter().zip(replies) {
                    let _ = p.reply.send(Ok(reply));
                }
            }
            Err(e) => {
                for p in batch {
                    let _ = p.reply.send(Err(e.clone()));
                }
            }
        }
    }

    /// See [`super::Store::release`].
    pub async fn release(&self, leases: &[Lease]) -> Result<(), StoreError> {
        if leases.is_empty() {
            return Ok(());
        }
        let keys: Vec<&str> = leases.iter().map(|l| l.key.as_str()).collect();
        let args = |command: &mut redis::Cmd| {
            for lease in leases {
                command.arg(lease.id);
            }
        };
        let _removed: i64 = self.eval(&self.scripts.release, &keys, args).await?;
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
        let keys: Vec<&str> = leases.iter().map(|l| l.key.as_str()).collect();
        let args = |command: &mut redis::Cmd| {
            if let Some(now) = now {
                command.arg(now);
            }
            for lease in leases {
                command.arg(lease.params.period_us).arg(lease.id);
            }
        };
        let reply: Vec<i64> = self.eval(&self.scripts.refresh, &keys, args).await?;
        if reply.len() != leases.len() {
            return Err(StoreError::Protocol(format!(
                "refresh replied {} values for {} leases",
                reply.len(),
                leases.len()
            )));
        }
        Ok(reply.into_iter().map(|r| r == 1).collect())
    }

    /// `"redis redis://host:port/db"` (or the cluster's seeds, or the Sentinel master), with
    /// any user/password left out.
    pub fn describe(&self) -> String {
        self.description.clone()
    }

    /// Runs `script` in ONE round trip: `EVALSHA`, and only if this node does not have the
    /// script cached (`NOSCRIPT`: a restarted node, a promoted replica, a node added later),
    /// one `EVAL` with the source, which also caches it there. The fallback is done here
    /// rather than by `Script::invoke_async` because that one sends `SCRIPT LOAD`, which a
    /// cluster connection fans out to every node and which then fails while any node is down.
    /// The whole call, fallback included, is bounded by the timeout.
    async fn eval<T: FromRedisValue>(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: impl Fn(&mut redis::Cmd),
    ) -> Result<T, StoreError> {
        // Sized for the decide script (up to 8 arguments per key) so building it reallocates
        // nothing.
        let data = 64 + keys.iter().map(|k| k.len() + 64).sum::<usize>();
        let command = |name: &str, first: &str| {
            let mut c = redis::Cmd::with_capacity(3 + 9 * keys.len(), data + first.len());
            c.arg(name).arg(first).arg(keys.len()).arg(keys);
            args(&mut c);
            c
        };
        let call = async {
            match self.query_raw(&command("EVALSHA", &script.hash)).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    self.query_raw(&command("EVAL", &script.source)).await
                }
                other => other,
            }
        };
        self.bounded(call).await
    }

    /// One `PING`, bounded by the timeout: how readiness learns that Redis is back while no
    /// request is asking.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.query::<String>(&redis::cmd("PING")).await.map(drop)
    }

    async fn query<T: FromRedisValue>(&self, command: &redis::Cmd) -> Result<T, StoreError> {
        self.bounded(self.query_raw(command)).await
    }

    async fn query_raw<T: FromRedisValue>(&self, command: &redis::Cmd) -> RedisResult<T> {
        match &self.conn {
            Conn::Standalone(c) => command.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => command.query_async(&mut c.clone()).await,
            Conn::Sentinel(s) => s.query(command).await,
        }
    }

    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map_err(|e| map_err(e, self.timeout)),
            Err(_) => {
                // A master that stopped answering (frozen, partitioned) never errors by itself:
                // ask the Sentinels whether it was replaced.
                if let Conn::Sentinel(s) = &self.conn {
                    s.rediscover_from(s.generation());
                }
                Err(StoreError::Timeout(self.timeout))
            }
        }
    }
}

/// TLS certificates for redis-rs, if `store.redis.tls` named any.
fn certificates(config: &RedisConfig) -> Option<TlsCertificates> {
    config.tls.as_ref().map(|tls| TlsCertificates {
        client_tls: tls.client.as_ref().map(|(cert, key)| ClientTlsConfig {
            client_cert: cert.clone(),
            client_key: key.clone(),
        }),
        root_cert: tls.ca.clone(),
    })
}

/// `url`'s connection info with the configured ACL user/password put in.
fn connection_info(url: &str, config: &RedisConfig) -> RedisResult<ConnectionInfo> {
    let info = url.into_connection_info()?;
    let mut settings = info.redis_settings().clone();
    if let Some(user) = &config.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &config.password {
        settings = settings.set_password(&password.0);
    }
    Ok(info.set_redis_settings(settings))
}

fn standalone_client(url: &str, config: &RedisConfig) -> RedisResult<redis::Client> {
    let info = connection_info(url, config)?;
    match certificates(config) {
        Some(certs) => redis::Client::build_with_tls(info, certs),
        None => redis::Client::open(info),
    }
}

fn cluster_client(nodes: &[String], config: &RedisConfig) -> RedisResult<ClusterClient> {
    let infos = nodes
        .iter()
        .map(|n| connection_info(n, config))
        .collect::<RedisResult<Vec<_>>>()?;
    let mut builder = ClusterClientBuilder::new(infos)
        .connection_timeout(config.timeout)
        .response_timeout(config.timeout);
    if let Some(certs) = certificates(config) {
        builder = builder.certs(certs);
    }
    builder.build()
}

fn describe(config: &RedisConfig) -> String {
    match &config.mode {
        RedisMode::Standalone(url) => format!("redis {}", redact(url)),
        RedisMode::Cluster(nodes) => format!(
            "redis cluster (seeds {})",
            nodes
                .iter()
                .map(|n| redact(n))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        RedisMode::Sentinel { master, nodes } => format!(
            "redis master `{master}` via sentinels {}",
            nodes
                .iter()
                .map(|n| redact(n))
                .collect::<Vec<_>>()
                .join(", ")
        ),
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

/// A fresh lease id for each concurrency check, 0 for the others.
fn lease_ids(checks: &[Check<'_>]) -> Vec<u64> {
    checks
        .iter()
        .map(|c| match c.params.algorithm {
            Algorithm::Concurrency => new_lease_id(),
            _ => 0,
        })
        .collect()
}

/// The seven script arguments of one check, in `decide.lua`'s order.
fn check_args(c: &Check<'_>, lease: u64) -> [u64; 7] {
    let p = &c.params;
    [
        u64::from(p.algorithm.code()),
        p.limit,
        // Validated positive.
        p.period_us.max(0) as u64,
        p.burst,
        p.cost,
        u64::from(c.shadow),
        lease,
    ]
}

/// The batch script's flat reply cut into each decision's reply (1 + 5 values per check),
/// given each decision's number of checks.
fn split_batch_reply(
    checks: impl Iterator<Item = usize> + Clone,
    flat: &[i64],
) -> Result<Vec<&[i64]>, StoreError> {
    let expected: usize = checks.clone().map(|n| 1 + 5 * n).sum();
    if flat.len() != expected {
        return Err(StoreError::Protocol(format!(
            "the batch decision replied {} values, expected {expected}",
            flat.len()
        )));
    }
    let mut rest = flat;
    Ok(checks
        .map(|n| {
            let (one, tail) = rest.split_at(1 + 5 * n);
            rest = tail;
            one
        })
        .collect())
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

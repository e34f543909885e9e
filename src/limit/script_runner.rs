//! Runs the Lua scripts on Redis: the connection (one server, a Redis Cluster or a
//! Sentinel-managed master), the scripts loaded for it, the timeout bounding every call, and
//! `EVALSHA` with its `NOSCRIPT` fallback to `EVAL`.
//!
//! The store and the coalescer both send script calls through one shared runner: the store
//! owns the runner (and the coalescer, if any), the coalescer holds only a handle to the
//! runner. Neither owns the other, so dropping the store closes the coalescer's queue and ends
//! its task, whatever the order they were made in.
//!
//! Each deployment keeps one multiplexed connection per node shared by all requests: concurrent
//! calls pipeline on it instead of waiting for a pool slot. On one server, each serving thread
//! (`crate::workers`) also opens a connection of its own on its first call: its calls are
//! then written and their replies read on the thread that waits for them, instead of waking
//! another thread twice per call. Every call is bounded by the
//! configured timeout so a stuck Redis surfaces as [`StoreError::Timeout`] instead of stalling
//! the proxy.

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

use super::decision::StoreError;
use super::lua::{
    decide_batch_script_source, decide_script_source, heartbeat_script_source, peek_script_source,
    refresh_script_source, release_script_source, settle_script_source, sync_script_source,
    ScriptClock,
};
use super::redis_settings::{RedisMode, RedisSettings};
use super::sentinel::SentinelMaster;

/// Reconnection backoff bounds (before jitter): limiting resumes well within a second of
/// Redis coming back.
const RECONNECT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_millis(300));
/// Commands buffered towards Redis before callers wait (inside their timeout): bounded, so a
/// stalled Redis cannot make memory grow.
const PIPELINE_BUFFER: usize = 256;

/// How long the reply of a decision is awaited after its caller's timeout passed: the
/// decision may still run in Redis and take units, which are then given back (see
/// `redis_store`'s orphaned decisions). Past this, what it took stays taken (a Redis that slow
/// has failed the callers anyway, and the windows end).
pub const ORPHAN_WAIT: Duration = Duration::from_secs(30);

/// A Lua script, run by hash (`EVALSHA`) and, on a node that has not cached it yet, by source.
pub struct LuaScript {
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

/// The scripts the store runs, each in the variant for the store's clock.
pub struct Scripts {
    pub decide: LuaScript,
    /// `decide.lua` in its batch form (several requests' decisions in one call).
    pub decide_batch: LuaScript,
    pub peek: LuaScript,
    pub release: LuaScript,
    pub refresh: LuaScript,
    /// `settle.lua`: refunds and charges after the response.
    pub settle: LuaScript,
    /// `sync.lua`: one round of local-first limits.
    pub sync: LuaScript,
    /// `heartbeat.lua`: the replicas alive, for local-first limits.
    pub heartbeat: LuaScript,
}

impl Scripts {
    fn new(clock: ScriptClock) -> Scripts {
        Scripts {
            decide: LuaScript::new(decide_script_source(clock)),
            decide_batch: LuaScript::new(decide_batch_script_source(clock)),
            peek: LuaScript::new(peek_script_source()),
            release: LuaScript::new(release_script_source()),
            refresh: LuaScript::new(refresh_script_source(clock)),
            settle: LuaScript::new(settle_script_source(clock)),
            sync: LuaScript::new(sync_script_source(clock)),
            heartbeat: LuaScript::new(heartbeat_script_source()),
        }
    }
}

/// The connection(s), by deployment. Each holds one multiplexed connection per node that all
/// requests share: concurrent decisions pipeline on it instead of waiting for a pool slot.
enum Conn {
    /// One server; reconnects by itself.
    Standalone(Box<Standalone>),
    /// Redis Cluster: routes each script by its keys' slot, follows MOVED/ASK and refreshes the
    /// slot map when a node fails or a replica is promoted. With a client per seed node, for
    /// subscriptions (a Cluster delivers a `PUBLISH` on every node).
    Cluster(ClusterConnection, Box<[redis::Client]>),
    /// The master named by the Sentinels, rediscovered after connection loss or `READONLY`.
    Sentinel(Arc<SentinelMaster>),
}

/// One server: the connection every thread may use, and one per serving thread, opened on that
/// thread by its first call (so that the connection's task runs there).
struct Standalone {
    shared: ConnectionManager,
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// Indexed by `workers::serving_thread()`; a thread past the end uses `shared`.
    per_thread: Arc<[PerThread]>,
}

#[derive(Default)]
struct PerThread {
    connection: std::sync::OnceLock<ConnectionManager>,
    /// The serving thread's runtime, set with `connection`: the health probe checks the
    /// connection there, so a replacement it causes runs its task on that thread too.
    runtime: std::sync::OnceLock<tokio::runtime::Handle>,
    opening: std::sync::atomic::AtomicBool,
}

impl Standalone {
    fn new(
        shared: ConnectionManager,
        client: redis::Client,
        config: ConnectionManagerConfig,
    ) -> Self {
        Standalone {
            shared,
            client,
            config,
            per_thread: (0..crate::workers::MAX_THREADS)
                .map(|_| PerThread::default())
                .collect(),
        }
    }

    /// The connection for a call made on this thread: its own once opened, the shared one
    /// until then (and on any thread that is not a serving thread).
    fn connection(&self) -> &ConnectionManager {
        let Some(index) = crate::workers::serving_thread() else {
            return &self.shared;
        };
        let Some(slot) = self.per_thread.get(index) else {
            return &self.shared;
        };
        if let Some(own) = slot.connection.get() {
            return own;
        }
        if !slot
            .opening
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            // Opened in a task of this thread's runtime, which then also runs the
            // connection's own task. A failure leaves `opening` set: this thread keeps the
            // shared connection, which reconnects by itself.
            let (client, config) = (self.client.clone(), self.config.clone());
            let per_thread = self.per_thread.clone();
            tokio::spawn(async move {
                match ConnectionManager::new_with_config(client, config).await {
                    Ok(own) => {
                        let slot = &per_thread[index];
                        let _ = slot.runtime.set(tokio::runtime::Handle::current());
                        let _ = slot.connection.set(own);
                    }
                    Err(e) => {
                        tracing::debug!(cause = %crate::error::chain(&e), "a serving thread keeps the shared Redis connection")
                    }
                }
            });
        }
        &self.shared
    }
}

/// The connection, the scripts and the timeout: what every script call needs.
pub struct ScriptRunner {
    conn: Conn,
    timeout: Duration,
    scripts: Scripts,
    /// Timed-out decisions whose replies are still awaited (`redis_store`'s orphaned
    /// decisions): counted to bound them.
    pub orphans: std::sync::atomic::AtomicUsize,
}

impl ScriptRunner {
    /// Connects to the deployment `settings` describes, with the scripts in their variant for
    /// `clock`. Connecting is bounded by the timeout; the scripts are not loaded yet (see
    /// [`ScriptRunner::preload`]).
    pub async fn connect(
        settings: &RedisSettings,
        clock: ScriptClock,
    ) -> Result<ScriptRunner, StoreError> {
        // rediss:// needs the process-wide rustls provider (ring), as the listeners do.
        crate::tls::install_crypto_provider();
        let timeout = settings.timeout;
        let connecting = async {
            Ok::<_, RedisError>(match &settings.mode {
                RedisMode::Standalone(url) => {
                    let client = standalone_client(url, settings)?;
                    // Reconnection backoff is capped low: callers never wait on it (every call
                    // is bounded by `timeout` and the breaker stops calls while Redis is away),
                    // and a long sleep between attempts would delay limiting by that much
                    // after Redis returns. No response timeout inside redis-rs: every call is
                    // already bounded by `timeout` (`bounded`), and a second timer per call
                    // would be a timer registration on every decision for nothing.
                    let manager = ConnectionManagerConfig::new()
                        .set_response_timeout(None)
                        .set_connection_timeout(Some(timeout))
                        .set_min_delay(RECONNECT_BACKOFF.0)
                        .set_max_delay(RECONNECT_BACKOFF.1)
                        .set_pipeline_buffer_size(PIPELINE_BUFFER);
                    let shared =
                        ConnectionManager::new_with_config(client.clone(), manager.clone()).await?;
                    Conn::Standalone(Box::new(Standalone::new(shared, client, manager)))
                }
                RedisMode::Cluster(nodes) => {
                    let client = cluster_client(nodes, settings)?;
                    let seeds = nodes
                        .iter()
                        .map(|n| standalone_client(n, settings))
                        .collect::<RedisResult<Box<[_]>>>()?;
                    Conn::Cluster(client.get_async_connection().await?, seeds)
                }
                RedisMode::Sentinel { master, nodes } => {
                    Conn::Sentinel(SentinelMaster::connect(master, nodes, settings).await?)
                }
            })
        };
        let conn = match tokio::time::timeout(timeout, connecting).await {
            Ok(connected) => connected.map_err(|e| map_err(e, timeout))?,
            Err(_) => return Err(diagnose_connect(settings).await),
        };
        Ok(ScriptRunner {
            conn,
            timeout,
            scripts: Scripts::new(clock),
            orphans: Default::default(),
        })
    }

    /// True on a Redis Cluster, where one script call takes keys of one slot only.
    pub fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(..))
    }

    /// The scripts, each in the variant for the clock connected with.
    pub fn scripts(&self) -> &Scripts {
        &self.scripts
    }

    /// The bound on every call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `SCRIPT LOAD` of `scripts` on every node (every primary at least), so the first calls
    /// need no fallback: all at once (pipelined on the connection, one round trip's wait),
    /// together bounded by the timeout. Best effort: a node that missed it (down now, added or
    /// restarted later) answers `NOSCRIPT` once and gets the script through `EVAL` then.
    pub async fn preload(&self, scripts: &[&LuaScript]) {
        let loads = futures_util::future::join_all(scripts.iter().map(|s| self.load(s)));
        let Ok(loaded) = tokio::time::timeout(self.timeout, loads).await else {
            tracing::warn!(timeout = ?self.timeout, "could not preload the Lua scripts in time; nodes without them get them on first use");
            return;
        };
        for loaded in loaded {
            if let Err(e) = loaded {
                tracing::warn!(cause = %crate::error::chain(&e), "could not preload a Lua script; nodes without it get it on first use");
            }
        }
    }

    /// `SCRIPT LOAD` of one script (see [`ScriptRunner::preload`]).
    async fn load(&self, script: &LuaScript) -> Result<(), StoreError> {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(&script.source);
        match &self.conn {
            Conn::Cluster(cluster, _) => {
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
        }
    }

    /// Runs `script` in ONE round trip: `EVALSHA`, and only if this node does not have the
    /// script cached (`NOSCRIPT`: a restarted node, a promoted replica, a node added later),
    /// one `EVAL` with the source, which also caches it there. The fallback is done here
    /// rather than by `Script::invoke_async` because that one sends `SCRIPT LOAD`, which a
    /// cluster connection fans out to every node and which then fails while any node is down.
    /// The whole call, fallback included, is bounded by the timeout.
    pub async fn eval<T: FromRedisValue>(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: impl Fn(&mut redis::Cmd),
    ) -> Result<T, StoreError> {
        let command = |name: &str, first: &str| script_command(name, first, keys, &args);
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

    /// [`ScriptRunner::eval`] as a future that owns what it needs and has no timeout: the
    /// caller bounds its own wait, and may hand the rest of the call to a task instead of
    /// dropping it, so that the reply of a call Redis still runs is not lost with the wait
    /// (see `redis_store`'s orphaned decisions). Errors as redis-rs reports them; map them
    /// with [`ScriptRunner::reply_error`].
    pub fn eval_owned<T: FromRedisValue + Send + 'static>(
        self: &Arc<Self>,
        script: fn(&Scripts) -> &LuaScript,
        keys: &[&str],
        args: &dyn Fn(&mut redis::Cmd),
    ) -> impl std::future::Future<Output = RedisResult<T>> + Send + 'static + use<T> {
        let by_hash = script_command("EVALSHA", &script(&self.scripts).hash, keys, &args);
        let runner = self.clone();
        async move {
            match runner.query_raw(&by_hash).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    let source = &script(&runner.scripts).source;
                    runner.query_raw(&by_source(&by_hash, source)).await
                }
                other => other,
            }
        }
    }

    /// A redis-rs error of a call as the store reports it.
    pub fn reply_error(&self, e: RedisError) -> StoreError {
        map_err(e, self.timeout)
    }

    /// One command, bounded by the timeout.
    pub async fn query<T: FromRedisValue>(&self, command: &redis::Cmd) -> Result<T, StoreError> {
        self.bounded(self.query_raw(command)).await
    }

    /// One command bounded by `timeout` (at least the store's), for background work whose
    /// commands are larger than a request's and need not be fast (the suggest record's).
    pub async fn query_within<T: FromRedisValue>(
        &self,
        command: &redis::Cmd,
        timeout: Duration,
    ) -> Result<T, StoreError> {
        let timeout = timeout.max(self.timeout);
        match tokio::time::timeout(timeout, self.query_raw(command)).await {
            Ok(result) => result.map_err(|e| map_err(e, timeout)),
            Err(_) => Err(self.timed_out()),
        }
    }

    /// One command; sent a second time only when the first attempt provably never reached
    /// Redis (see [`never_sent`]), so a call that may have been applied is never repeated.
    async fn query_raw<T: FromRedisValue>(&self, command: &redis::Cmd) -> RedisResult<T> {
        match self.send(command).await {
            Err(e) if never_sent(&e) => self.send(command).await,
            other => other,
        }
    }

    async fn send<T: FromRedisValue>(&self, command: &redis::Cmd) -> RedisResult<T> {
        match &self.conn {
            Conn::Standalone(c) => command.query_async(&mut c.connection().clone()).await,
            Conn::Cluster(c, _) => command.query_async(&mut c.clone()).await,
            Conn::Sentinel(s) => s.query(command).await,
        }
    }

    /// What the health probe runs: a `PING` through every connection requests use (on one
    /// server: the shared one and each serving thread's, each on its own thread), each bounded
    /// by the timeout. A connection found broken (Redis restarted while it was idle) is
    /// replaced by redis-rs on that error, and pinged again through its replacement, so once
    /// this succeeds no request meets a connection broken before the check. Ok(true): a
    /// connection was replaced (Redis restarted, or a connection was cut, since the last check).
    pub async fn check_connections(&self) -> Result<bool, StoreError> {
        let timeout = self.timeout;
        match &self.conn {
            Conn::Standalone(c) => {
                let threads: Vec<_> = c
                    .per_thread
                    .iter()
                    .filter_map(|slot| {
                        let conn = slot.connection.get()?.clone();
                        let runtime = slot.runtime.get()?;
                        Some(runtime.spawn(tokio::time::timeout(timeout, ping_fresh(conn))))
                    })
                    .collect();
                let mut result = self.bounded(ping_fresh(c.shared.clone())).await;
                for thread in threads {
                    // A thread whose runtime has stopped serves nothing: nothing to check.
                    let Ok(checked) = thread.await else { continue };
                    let checked = match checked {
                        Ok(pinged) => pinged.map_err(|e| map_err(e, timeout)),
                        Err(_) => Err(StoreError::Timeout(timeout)),
                    };
                    result = match (result, checked) {
                        (Ok(a), Ok(b)) => Ok(a || b),
                        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
                    };
                }
                result
            }
            _ => {
                let ping = redis::cmd("PING");
                let call = async {
                    match self.send::<String>(&ping).await {
                        // PING is safe to repeat: the second one goes through the replacement
                        // the error started (a Cluster reconnects the node; a Sentinel
                        // master's rediscovery may still be running, then the next check).
                        Err(e) if e.is_io_error() || e.is_unrecoverable_error() => {
                            self.send::<String>(&ping).await.map(|_| true)
                        }
                        other => other.map(|_| false),
                    }
                };
                self.bounded(call).await
            }
        }
    }

    /// A connection of its own subscribed to `channel` (a subscribed connection can send
    /// nothing else): to the server, to the first seed node of a Cluster that answers (a
    /// Cluster delivers `PUBLISH` to every node's subscribers), or to the master the Sentinels
    /// name now. Connecting and subscribing are bounded by the timeout.
    pub async fn subscribe(&self, channel: &str) -> Result<redis::aio::PubSub, StoreError> {
        let subscribe = |client: redis::Client| async move {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(channel).await?;
            Ok::<_, RedisError>(pubsub)
        };
        let call = async {
            match &self.conn {
                Conn::Standalone(c) => subscribe(c.client.clone()).await,
                Conn::Cluster(_, seeds) => {
                    let mut last = None;
                    for seed in seeds.iter() {
                        match tokio::time::timeout(self.timeout, subscribe(seed.clone())).await {
                            Ok(Ok(pubsub)) => return Ok(pubsub),
                            Ok(Err(e)) => last = Some(e),
                            Err(_) => {}
                        }
                    }
                    Err(last.unwrap_or_else(|| {
                        RedisError::from((ErrorKind::Io, "no seed node answered"))
                    }))
                }
                Conn::Sentinel(s) => subscribe(s.client().await?).await,
            }
        };
        // A Cluster tries each seed within the timeout.
        let bound = match &self.conn {
            Conn::Cluster(_, seeds) => self.timeout * seeds.len().max(1) as u32,
            _ => self.timeout,
        };
        match tokio::time::timeout(bound, call).await {
            Ok(result) => result.map_err(|e| map_err(e, self.timeout)),
            Err(_) => Err(StoreError::Timeout(bound)),
        }
    }

    /// Why a call failed, named as precisely as can be found out. A timeout may hide the real
    /// cause: while Redis refuses connections (or the password is wrong) the connection
    /// manager keeps retrying with backoff, and every call waiting on it times out. So on one
    /// server a timeout is checked with one fresh connection and a `PING`, bounded by the
    /// timeout: its error (refused, authentication failed, ...) is the cause; a fresh
    /// connection that answers, or that times out too, leaves the timeout standing. Called
    /// where a failure is reported (the health probe, the first failure of a request), never
    /// on every request.
    pub async fn diagnose(&self, error: StoreError) -> StoreError {
        match (&error, &self.conn) {
            (StoreError::Timeout(_), Conn::Standalone(c)) => fresh_attempt(&c.client, self.timeout)
                .await
                .unwrap_or(error),
            _ => error,
        }
    }

    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map_err(|e| map_err(e, self.timeout)),
            Err(_) => Err(self.timed_out()),
        }
    }

    /// The error of a call not answered within the timeout.
    pub fn timed_out(&self) -> StoreError {
        // A master that stopped answering (frozen, partitioned) never errors by itself: ask
        // the Sentinels whether it was replaced.
        if let Conn::Sentinel(s) = &self.conn {
            s.rediscover_from(s.generation());
        }
        StoreError::Timeout(self.timeout)
    }
}

/// Whether `e` proves the command never reached Redis, so sending it again cannot apply it
/// twice. Only a refused connection does: the connection it was to be written on was never
/// made (a `ConnectionManager` returns the failed reconnection's error without writing, and
/// starts another one, which the second attempt waits for). A broken pipe or reset does
/// not: redis-rs reports the loss of a reply to a command already written with the same
/// error as a write into a connection that had already closed.
fn never_sent(e: &RedisError) -> bool {
    e.is_connection_refusal()
}

/// `PING` through `conn`, and once more if that failed on the connection itself: the
/// `ConnectionManager` replaces its connection on such an error, and the second `PING` waits
/// for the replacement. Ok(true) when it was replaced.
async fn ping_fresh(mut conn: ConnectionManager) -> RedisResult<bool> {
    let ping = redis::cmd("PING");
    match ping.query_async::<String>(&mut conn).await {
        Err(e) if e.is_io_error() || e.is_unrecoverable_error() => {
            ping.query_async::<String>(&mut conn).await.map(|_| true)
        }
        other => other.map(|_| false),
    }
}

/// One connection made afresh to `client`'s server (no retries) and a `PING`, bounded by
/// `timeout`: the error it met, unless it answered or timed out (then nothing more is known).
async fn fresh_attempt(client: &redis::Client, timeout: Duration) -> Option<StoreError> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let attempt = async {
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Err(e)) if !e.is_timeout() => Some(StoreError::Redis(e)),
        _ => None,
    }
}

/// A first connection that timed out, diagnosed as [`ScriptRunner::diagnose`] does (one
/// server only: a Cluster or Sentinel connection reports its own errors).
async fn diagnose_connect(settings: &RedisSettings) -> StoreError {
    let timeout = StoreError::Timeout(settings.timeout);
    let RedisMode::Standalone(url) = &settings.mode else {
        return timeout;
    };
    match standalone_client(url, settings) {
        Ok(client) => fresh_attempt(&client, settings.timeout)
            .await
            .unwrap_or(timeout),
        Err(e) => StoreError::Redis(e),
    }
}

/// TLS certificates for redis-rs, if `store.redis.tls` named any.
fn certificates(settings: &RedisSettings) -> Option<TlsCertificates> {
    settings.tls.as_ref().map(|tls| TlsCertificates {
        client_tls: tls.client.as_ref().map(|(cert, key)| ClientTlsConfig {
            client_cert: cert.clone(),
            client_key: key.clone(),
        }),
        root_cert: tls.ca.clone(),
    })
}

/// `url`'s connection info with the configured ACL user/password put in.
fn connection_info(url: &str, settings: &RedisSettings) -> RedisResult<ConnectionInfo> {
    let info = url.into_connection_info()?;
    let mut redis = info.redis_settings().clone();
    if let Some(user) = &settings.username {
        redis = redis.set_username(user);
    }
    if let Some(password) = &settings.password {
        redis = redis.set_password(&password.0);
    }
    Ok(info.set_redis_settings(redis))
}

/// `name first numkeys keys... args...`: an `EVALSHA` (first: the hash) or `EVAL` (first: the
/// source) of a script.
fn script_command(
    name: &str,
    first: &str,
    keys: &[&str],
    args: &impl Fn(&mut redis::Cmd),
) -> redis::Cmd {
    // Sized for the decide script (one argument per key, usually a few dozen bytes; up to 167
    // with a concurrency lease id and 20-digit limits) and settle.lua's seven numbers per key,
    // so building it rarely reallocates.
    let data = 64 + first.len() + keys.iter().map(|k| k.len() + 64).sum::<usize>();
    let mut c = redis::Cmd::with_capacity(3 + 9 * keys.len(), data);
    c.arg(name).arg(first).arg(keys.len()).arg(keys);
    args(&mut c);
    c
}

/// The `EVAL` of the script that `by_hash` (an `EVALSHA`) calls, with the same keys and
/// arguments: for a node that answered `NOSCRIPT`.
fn by_source(by_hash: &redis::Cmd, source: &str) -> redis::Cmd {
    let mut c = redis::Cmd::new();
    c.arg("EVAL").arg(source);
    for arg in by_hash.args_iter().skip(2) {
        if let redis::Arg::Simple(bytes) = arg {
            c.arg(bytes);
        }
    }
    c
}

fn standalone_client(url: &str, settings: &RedisSettings) -> RedisResult<redis::Client> {
    let info = connection_info(url, settings)?;
    match certificates(settings) {
        Some(certs) => redis::Client::build_with_tls(info, certs),
        None => redis::Client::open(info),
    }
}

fn cluster_client(nodes: &[String], settings: &RedisSettings) -> RedisResult<ClusterClient> {
    let infos = nodes
        .iter()
        .map(|n| connection_info(n, settings))
        .collect::<RedisResult<Vec<_>>>()?;
    let mut builder = ClusterClientBuilder::new(infos)
        .connection_timeout(settings.timeout)
        .response_timeout(settings.timeout);
    if let Some(certs) = certificates(settings) {
        builder = builder.certs(certs);
    }
    builder.build()
}

/// The connection's own response timeout may fire first: it is the same timeout.
fn map_err(e: redis::RedisError, timeout: Duration) -> StoreError {
    if e.is_timeout() {
        StoreError::Timeout(timeout)
    } else {
        StoreError::Redis(e)
    }
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind::{
        BrokenPipe, ConnectionRefused, ConnectionReset, TimedOut, UnexpectedEof,
    };

    use super::*;

    fn io(kind: std::io::ErrorKind) -> RedisError {
        RedisError::from(std::io::Error::from(kind))
    }

    /// Only a refused connection proves a command never reached Redis; a broken pipe or reset
    /// may be the loss of a reply to a command already written, so it is not sent again.
    #[test]
    fn only_a_refused_connection_is_sent_again() {
        assert!(never_sent(&io(ConnectionRefused)));
        for kind in [BrokenPipe, ConnectionReset, UnexpectedEof, TimedOut] {
            assert!(!never_sent(&io(kind)), "{kind:?}");
        }
        assert!(!never_sent(&RedisError::from((ErrorKind::Io, "closed"))));
    }
}

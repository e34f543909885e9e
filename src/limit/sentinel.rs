//! The Redis master named by Redis Sentinel, followed through failovers.
//!
//! redis-rs finds the master through the Sentinels (and checks it really is a master) but
//! hands back a plain connection that stays bound to that server. This keeps one multiplexed
//! connection to the current master, shared by all requests, and replaces it when the master
//! is lost: a connection error, a timeout, or `READONLY` (the old master came back as a
//! replica). Rediscovery runs in one background task, never on a request's path: requests
//! meanwhile fail fast and follow `on_error`, then go to the promoted replica.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ErrorKind, FromRedisValue, IntoConnectionInfo, RedisError, RedisResult,
    ServerErrorKind, TlsCertificates, TlsMode,
};
use tokio::sync::Mutex;

use super::redis_settings::RedisSettings;

/// Pause between rediscovery attempts while no Sentinel names a reachable master.
const RETRY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(1));

pub(crate) struct SentinelMaster {
    sentinels: Mutex<SentinelClient>,
    current: RwLock<Option<MultiplexedConnection>>,
    /// Bumped on every replacement, so failures seen on an old connection do not trigger
    /// another rediscovery after the new one is in place.
    generation: AtomicU64,
    rediscovering: AtomicBool,
    timeout: Duration,
}

impl SentinelMaster {
    pub(crate) async fn connect(
        master: &str,
        nodes: &[String],
        config: &RedisSettings,
    ) -> RedisResult<Arc<SentinelMaster>> {
        let mut addrs = Vec::new();
        let mut sentinel_auth = None;
        for node in nodes {
            let info = node.as_str().into_connection_info()?;
            let redis = info.redis_settings();
            if sentinel_auth.is_none() && redis.password().is_some() {
                sentinel_auth = Some((
                    redis.username().map(str::to_string),
                    redis.password().unwrap_or_default().to_string(),
                ));
            }
            addrs.push(info.addr().clone());
        }
        let tls = nodes.iter().any(|n| n.starts_with("rediss://"));
        let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)?;
        if let Some((user, password)) = sentinel_auth {
            if let Some(user) = user {
                builder = builder.set_client_to_sentinel_username(user);
            }
            builder = builder.set_client_to_sentinel_password(password);
        }
        if let Some(user) = &config.username {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = &config.password {
            builder = builder.set_client_to_redis_password(&password.0);
        }
        if tls {
            builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
        }
        if let Some(tls) = &config.tls {
            let certs = || TlsCertificates {
                client_tls: tls
                    .client
                    .as_ref()
                    .map(|(cert, key)| redis::ClientTlsConfig {
                        client_cert: cert.clone(),
                        client_key: key.clone(),
                    }),
                root_cert: tls.ca.clone(),
            };
            builder = builder
                .set_client_to_redis_certificates(certs())
                .set_client_to_sentinel_certificates(certs());
        }
        let master = Arc::new(SentinelMaster {
            sentinels: Mutex::new(builder.build()?),
            current: RwLock::new(None),
            generation: AtomicU64::new(0),
            rediscovering: AtomicBool::new(false),
            timeout: config.timeout,
        });
        let conn = master.discover().await?;
        master.install(conn);
        Ok(master)
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Runs `command` on the current master; a failure that means "this is no longer the
    /// master" starts a rediscovery.
    pub(crate) async fn query<T: FromRedisValue>(
        self: &Arc<Self>,
        command: &redis::Cmd,
    ) -> RedisResult<T> {
        let generation = self.generation();
        let conn = self.current.read().expect("lock poisoned").clone();
        let Some(mut conn) = conn else {
            self.rediscover_from(generation);
            return Err(RedisError::from((
                ErrorKind::Io,
                "looking up the master through the Sentinels",
            )));
        };
        let result = command.query_async(&mut conn).await;
        if let Err(e) = &result {
            if master_lost(e) {
                self.rediscover_from(generation);
            }
        }
        result
    }

    /// Starts one background rediscovery, unless one runs or the connection was already
    /// replaced since `generation`.
    pub(crate) fn rediscover_from(self: &Arc<Self>, generation: u64) {
        if generation != self.generation() || self.rediscovering.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let mut pause = RETRY.0;
            loop {
                match this.discover().await {
                    Ok(conn) => {
                        this.install(conn);
                        tracing::info!("connected to the master named by the Sentinels");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(cause = %crate::error::chain(&e), "no master from the Sentinels yet; retrying");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(RETRY.1);
                    }
                }
            }
            this.rediscovering.store(false, Ordering::Release);
        });
    }

    /// A client for the master the Sentinels name now (for a connection of its own, such as
    /// a subscription).
    pub(crate) async fn client(&self) -> RedisResult<redis::Client> {
        self.sentinels.lock().await.async_get_client().await
    }

    fn install(&self, conn: MultiplexedConnection) {
        *self.current.write().expect("lock poisoned") = Some(conn);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Asks the Sentinels for the master (redis-rs checks its `ROLE`) and connects to it.
    async fn discover(&self) -> RedisResult<MultiplexedConnection> {
        let attempt = async {
            let client = self.sentinels.lock().await.async_get_client().await?;
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_response_timeout(Some(self.timeout));
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
        };
        // Sentinels, then the master: a few round trips, each bounded by the timeout.
        tokio::time::timeout(self.timeout * 4, attempt)
            .await
            .unwrap_or_else(|_| {
                Err(RedisError::from((
                    ErrorKind::Io,
                    "Sentinel master lookup timed out",
                )))
            })
    }
}

/// Errors after which this connection may no longer lead to the master.
fn master_lost(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly)
                | ErrorKind::Server(ServerErrorKind::MasterDown)
        )
}

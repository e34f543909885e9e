//! Redis-backed limit store: quotas shared by every proxy instance using the same Redis.
//!
//! A decision is ONE `EVALSHA` of `decide.lua`, which mirrors [`super::algorithm`] inside
//! Redis so that all limits of a request are checked and consumed atomically, on Redis's own
//! clock (proxy clocks may disagree). The same store type runs over one server, a Redis Cluster
//! (redis-rs's async cluster client, which routes by the keys' hash slot and follows MOVED/ASK
//! and failovers) or a Sentinel-managed master: the connection, the scripts and the timeout
//! live in the script runner ([`super::script_runner`]), which this store owns and shares with
//! its coalescer ([`super::coalesce`], with `coalesce: true`). This module turns checks into
//! script arguments and replies into decisions.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::FromRedisValue;

use super::coalesce::{Claim, Coalescer};
use super::lua::{check_arg, split_batch_reply, PackedInts};
pub use super::lua::{
    decide_batch_script_source, decide_script_source, peek_script_source, refresh_script_source,
    release_script_source, settle_script_source, ScriptClock,
};
use super::redis_settings::{RedisMode, RedisSettings};
use super::script_runner::{LuaScript, ScriptRunner, ORPHAN_WAIT};

use super::algorithm::{Algorithm, Params, Settle, State, Verdict, MAX_PRODUCT};
use super::clock::Micros;
use super::decision::{new_lease_id, Check, Decision, Lease, Settlement, StoreError};
use super::local_first::SyncItem;

/// Limit states in Redis. Clone is cheap: clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    /// Shared with the coalescer, which sends its batches through it.
    runner: Arc<ScriptRunner>,
    clock: ScriptClock,
    description: Arc<str>,
    /// Set with `coalesce: true`: decisions go through its queue.
    coalescer: Option<Arc<Coalescer>>,
}

/// A decision's call to Redis, in flight.
type PendingReply = Pin<Box<dyn Future<Output = Result<Vec<i64>, StoreError>> + Send>>;

/// Timed-out decisions awaited at once, at most.
const MAX_ORPHANS: usize = 10_000;

impl RedisStore {
    /// Connects to one server at `url` (`redis://` or `rediss://`); `timeout` bounds
    /// connecting and every later call.
    pub async fn connect(url: &str, timeout: Duration) -> Result<RedisStore, StoreError> {
        RedisStore::open(&RedisSettings::standalone(url, timeout)).await
    }

    /// Like [`RedisStore::connect`] with a chosen script clock: [`ScriptClock::Argv`] is for
    /// tests only, and such a store decides only through [`RedisStore::decide_at`].
    pub async fn connect_with_clock(
        url: &str,
        timeout: Duration,
        clock: ScriptClock,
    ) -> Result<RedisStore, StoreError> {
        RedisStore::open_with_clock(&RedisSettings::standalone(url, timeout), clock).await
    }

    /// Connects to the deployment `config` describes (one server, a Cluster or a Sentinel
    /// master) and makes the scripts available on its nodes.
    pub async fn open(config: &RedisSettings) -> Result<RedisStore, StoreError> {
        RedisStore::open_with_clock(config, ScriptClock::Redis).await
    }

    /// [`RedisStore::open`] with a chosen script clock (tests only).
    pub async fn open_with_clock(
        config: &RedisSettings,
        clock: ScriptClock,
    ) -> Result<RedisStore, StoreError> {
        let runner = Arc::new(ScriptRunner::connect(config, clock).await?);
        let scripts = runner.scripts();
        // settle.lua too: a response waits for its settlement, so its first one should not
        // need the NOSCRIPT fallback's second round trip.
        let mut preload = vec![
            &scripts.decide,
            &scripts.release,
            &scripts.refresh,
            &scripts.settle,
        ];
        if config.coalesce {
            preload.push(&scripts.decide_batch);
        }
        runner.preload(&preload).await;
        // Only decisions on Redis's clock are coalesced: an injected clock is per call.
        let coalescer = (config.coalesce && clock == ScriptClock::Redis)
            .then(|| Arc::new(Coalescer::start(runner.clone())));
        Ok(RedisStore {
            runner,
            clock,
            description: describe(config).into(),
            coalescer,
        })
    }

    /// See [`super::Store::decide`]: one round trip, time read inside Redis.
    pub async fn decide(&self, checks: &[Check<'_>]) -> Result<Decision, StoreError> {
        self.run_decide(&self.runner.scripts().decide, checks, None)
            .await
    }

    /// What [`RedisStore::decide`] would answer now, without consuming anything (leases in
    /// the answer are not held).
    pub async fn peek(&self, checks: &[Check<'_>]) -> Result<Decision, StoreError> {
        self.run_decide(&self.runner.scripts().peek, checks, None)
            .await
    }

    /// [`RedisStore::decide`] at a given time, for stores connected with [`ScriptClock::Argv`].
    pub async fn decide_at(
        &self,
        checks: &[Check<'_>],
        now: Micros,
    ) -> Result<Decision, StoreError> {
        self.run_decide(&self.runner.scripts().decide, checks, Some(now))
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
                for (i, c) in checks.iter().enumerate() {
                    command.arg(check_arg(c, lease_at(leases, i), Some(now)).as_bytes());
                }
            }
        };
        let PackedInts(flat) = self
            .runner
            .eval(&self.runner.scripts().decide_batch, &keys, args)
            .await?;
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
                at: 0,
            });
        }
        let lease_ids = lease_ids(checks);
        if let (Some(coalescer), None, true) = (
            &self.coalescer,
            now,
            std::ptr::eq(script, &self.runner.scripts().decide),
        ) {
            let keys = checks.iter().map(|c| c.key.to_string()).collect();
            let values = checks
                .iter()
                .enumerate()
                .map(|(i, c)| check_arg(c, lease_at(&lease_ids, i), None))
                .collect();
            let claim = Arc::new(Claim::default());
            let call = {
                let (coalescer, claim) = (coalescer.clone(), claim.clone());
                async move { coalescer.decide(keys, values, claim).await }
            };
            let sent = || !claim.abandon();
            let reply = self
                .answer_or_orphan(Box::pin(call), sent, checks, &lease_ids)
                .await?;
            return parse_decision(checks, &lease_ids, &reply);
        }
        // One check (the usual route) needs no vector of keys.
        let (one, many): ([&str; 1], Vec<&str>);
        let keys: &[&str] = if let [check] = checks {
            one = [check.key];
            &one
        } else {
            many = checks.iter().map(|c| c.key).collect();
            &many
        };
        // One argument per check, written on the stack (no string per argument).
        let args = |command: &mut redis::Cmd| {
            if let Some(now) = now {
                command.arg(now);
            }
            for (i, c) in checks.iter().enumerate() {
                command.arg(check_arg(c, lease_at(&lease_ids, i), now).as_bytes());
            }
        };
        if now.is_none() && std::ptr::eq(script, &self.runner.scripts().decide) {
            let call = self.runner.eval_owned(|s| &s.decide, keys, &args);
            let runner = self.runner.clone();
            let call = async move {
                call.await
                    .map(|PackedInts(reply)| reply)
                    .map_err(|e| runner.reply_error(e))
            };
            let reply = self
                .answer_or_orphan(Box::pin(call), || true, checks, &lease_ids)
                .await?;
            return parse_decision(checks, &lease_ids, &reply);
        }
        let PackedInts(reply) = self.runner.eval(script, keys, args).await?;
        parse_decision(checks, &lease_ids, &reply)
    }

    /// A decision's reply, waited for within the timeout. A decision not answered in time
    /// still runs in Redis when it gets there and takes its units, for a request that
    /// `on_error` decided without it: nobody would give them back (a fail-open admission
    /// settles nothing), so a failures-only limit would refuse a caller whose requests all
    /// succeeded until its window ended. So such a call is not dropped: a task of its own
    /// waits for its reply (at most [`ORPHAN_WAIT`]) and gives back what it took. `sent`, asked
    /// once the wait is over, says whether the call may have reached Redis (a coalesced
    /// decision still queued is given up instead).
    async fn answer_or_orphan(
        &self,
        mut call: PendingReply,
        sent: impl FnOnce() -> bool,
        checks: &[Check<'_>],
        lease_ids: &[u64],
    ) -> Result<Vec<i64>, StoreError> {
        match tokio::time::timeout(self.runner.timeout(), &mut call).await {
            Ok(reply) => reply,
            Err(_) => {
                if sent() {
                    self.adopt_orphan(call, checks, lease_ids);
                }
                Err(self.runner.timed_out())
            }
        }
    }

    /// See [`RedisStore::answer_or_orphan`]. At most [`MAX_ORPHANS`] wait at once (a frozen
    /// Redis must not grow memory without bound); past that a call is dropped as before.
    fn adopt_orphan(&self, call: PendingReply, checks: &[Check<'_>], lease_ids: &[u64]) {
        if self.runner.orphans.fetch_add(1, Ordering::Relaxed) >= MAX_ORPHANS {
            self.runner.orphans.fetch_sub(1, Ordering::Relaxed);
            tracing::debug!("a timed-out decision is dropped: too many wait for their replies");
            return;
        }
        let owned: Vec<(String, Check<'static>)> = checks
            .iter()
            .map(|c| {
                let check = Check { key: "", ..*c };
                (c.key.to_owned(), check)
            })
            .collect();
        let lease_ids = lease_ids.to_vec();
        let store = self.clone();
        tokio::spawn(async move {
            let reply = tokio::time::timeout(ORPHAN_WAIT, call).await;
            let checks: Vec<Check<'_>> = owned
                .iter()
                .map(|(key, check)| Check { key, ..*check })
                .collect();
            match reply {
                Ok(Ok(reply)) => match parse_decision(&checks, &lease_ids, &reply) {
                    Ok(decision) => store.undo(&checks, &decision).await,
                    Err(e) => {
                        tracing::debug!(cause = %e, "a timed-out decision's reply is malformed")
                    }
                },
                Ok(Err(e)) => {
                    tracing::debug!(cause = %crate::error::chain(&e), "a timed-out decision failed in the end")
                }
                Err(_) => {
                    tracing::warn!(wait = ?ORPHAN_WAIT, "a timed-out decision was not answered: what it may have taken in Redis is not given back")
                }
            }
            store.runner.orphans.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// Gives back what an admitting `decision` of `checks` took: units (a denial took none)
    /// and concurrency slots. Calendar windows keep theirs (settle.lua has no turns to pick
    /// from, see [`super::algorithm::settle`]).
    async fn undo(&self, checks: &[Check<'_>], decision: &Decision) {
        if !decision.allowed {
            return;
        }
        let refunds: Vec<Settlement> = checks
            .iter()
            .zip(&decision.verdicts)
            .filter(|(check, verdict)| {
                verdict.allowed
                    && check.params.cost > 0
                    && check.params.calendar.is_none()
                    && check.params.algorithm != Algorithm::Concurrency
            })
            .map(|(check, _)| Settlement {
                key: check.key.to_owned(),
                params: check.params,
                op: Settle::Refund {
                    amount: check.params.cost,
                    taken_at: decision.at,
                },
            })
            .collect();
        let refunded = self.settle(&refunds).await;
        let released = self.release(&decision.leases).await;
        match refunded.and(released) {
            Ok(()) => tracing::debug!(
                refunds = refunds.len(),
                leases = decision.leases.len(),
                "gave back what a timed-out decision took"
            ),
            Err(e) => {
                tracing::warn!(cause = %crate::error::chain(&e), "could not give back what a timed-out decision took")
            }
        }
    }

    /// The bound on every call.
    pub fn timeout(&self) -> Duration {
        self.runner.timeout()
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
        let _removed: i64 = self
            .runner
            .eval(&self.runner.scripts().release, &keys, args)
            .await?;
        Ok(())
    }

    /// See [`super::Store::settle`].
    pub async fn settle(&self, settlements: &[Settlement]) -> Result<(), StoreError> {
        self.run_settle(settlements, None).await
    }

    /// [`RedisStore::settle`] at a given time, for stores connected with
    /// [`ScriptClock::Argv`].
    pub async fn settle_at(
        &self,
        settlements: &[Settlement],
        now: Micros,
    ) -> Result<(), StoreError> {
        self.run_settle(settlements, Some(now)).await
    }

    /// ONE `settle.lua` call for all settlements (see [`settle_args`] for its arguments).
    async fn run_settle(
        &self,
        settlements: &[Settlement],
        now: Option<Micros>,
    ) -> Result<(), StoreError> {
        self.check_clock(now)?;
        if settlements.is_empty() {
            return Ok(());
        }
        let keys: Vec<&str> = settlements.iter().map(|s| s.key.as_str()).collect();
        let args = |command: &mut redis::Cmd| {
            if let Some(now) = now {
                command.arg(now);
            }
            for s in settlements {
                for value in settle_args(s) {
                    command.arg(value);
                }
            }
        };
        let _written: i64 = self
            .runner
            .eval(&self.runner.scripts().settle, &keys, args)
            .await?;
        Ok(())
    }

    /// One round of local-first limits (`sync.lua`): applies each item's usage to its shared
    /// state and returns the store's clock and every item's state after it, in order. One
    /// call for all keys on one server; on a Cluster one call per hash tag (a script's keys
    /// must share a slot, and keys with one tag always do), all sent at once over the
    /// per-node connections.
    ///
    /// `replica` and `round` make it exactly once: the same round sent again (its reply was
    /// lost) is not charged twice. Every call that charges carries one round marker of the
    /// replica ([`round_marker`]), which `sync.lua` checks and sets once for all of the call's
    /// keys. A resent round is the same items in the same order, so it makes the same calls
    /// with the same markers.
    pub async fn sync_round(
        &self,
        replica: &str,
        round: u64,
        items: &[SyncItem],
        now: Option<Micros>,
    ) -> Result<(Micros, Vec<Option<State>>), StoreError> {
        self.check_clock(now)?;
        let cluster = self.runner.is_cluster();
        if !cluster {
            let all: Vec<&SyncItem> = items.iter().collect();
            return self.sync_call(replica, round, &all, false, now).await;
        }
        // Grouped by hash tag in the order of first appearance (each group's items in their
        // order): the same items always make the same calls.
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut by_tag: HashMap<&str, usize> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let group = *by_tag.entry(tag_head(&item.key)).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[group].push(i);
        }
        if groups.len() <= 1 {
            let all: Vec<&SyncItem> = items.iter().collect();
            return self.sync_call(replica, round, &all, true, now).await;
        }
        let calls = groups.iter().map(|group| async move {
            let members: Vec<&SyncItem> = group.iter().map(|&i| &items[i]).collect();
            self.sync_call(replica, round, &members, true, now).await
        });
        let replies = futures_util::future::join_all(calls).await;
        let mut store_now = 0;
        let mut states = vec![None; items.len()];
        for (group, reply) in groups.iter().zip(replies) {
            let (at, replied) = reply?;
            store_now = store_now.max(at);
            for (&i, state) in group.iter().zip(replied) {
                states[i] = state;
            }
        }
        Ok((store_now, states))
    }

    /// One `sync.lua` call over `items` (all of one hash tag on a Cluster).
    async fn sync_call(
        &self,
        replica: &str,
        round: u64,
        items: &[&SyncItem],
        cluster: bool,
        now: Option<Micros>,
    ) -> Result<(Micros, Vec<Option<State>>), StoreError> {
        // The order of the call: the items with usage in runs of one limit's params (sent once
        // per run, since every argument costs Redis time to read), then the items without, which are only read and need no argument at all
        // (every item of the read 3/4 into the interval).
        let mut runs: Vec<(Params, Vec<usize>)> = Vec::new();
        let mut run_of: HashMap<Params, usize> = HashMap::new();
        let mut reads = Vec::new();
        for (i, item) in items.iter().enumerate() {
            if item.amount == 0 {
                reads.push(i);
                continue;
            }
            let run = *run_of.entry(item.params).or_insert_with(|| {
                runs.push((item.params, Vec::new()));
                runs.len() - 1
            });
            runs[run].1.push(i);
        }
        let order: Vec<usize> = runs
            .iter()
            .flat_map(|(_, run)| run.iter().copied())
            .chain(reads)
            .collect();
        let mut keys: Vec<&str> = order.iter().map(|&i| items[i].key.as_str()).collect();
        let marker = match items.first() {
            Some(first) if !runs.is_empty() => Some(round_marker(&first.key, replica, cluster)),
            _ => None,
        };
        if let Some(marker) = &marker {
            keys.push(marker);
        }
        let args = |command: &mut redis::Cmd| {
            if let Some(now) = now {
                command.arg(now);
            }
            command.arg(round).arg(items.len());
            for (p, run) in &runs {
                command
                    .arg(p.algorithm.code())
                    .arg(p.limit)
                    .arg(p.period_us)
                    .arg(p.burst)
                    .arg(run.len());
                for &i in run {
                    command.arg(items[i].amount.min(MAX_PRODUCT as u64));
                }
            }
        };
        let reply: String = self
            .runner
            .eval(&self.runner.scripts().sync, &keys, args)
            .await?;
        let mut lines = reply.split('\n');
        let time = lines.next().unwrap_or_default();
        let store_now = time
            .parse()
            .map_err(|_| StoreError::Protocol(format!("sync replied time {time:?}")))?;
        let replied: Vec<&str> = lines.collect();
        if replied.len() != items.len() {
            return Err(StoreError::Protocol(format!(
                "sync replied {} states for {} keys",
                replied.len(),
                items.len()
            )));
        }
        let mut states = vec![None; items.len()];
        for (&i, text) in order.iter().zip(replied) {
            states[i] = parse_state(text);
        }
        Ok((store_now, states))
    }

    /// Renews this replica's heartbeat under `key` for `ttl_us`, records `written` (the tick
    /// of its last write acknowledged in full, store µs; below 0: none) and returns the number
    /// of replicas alive and the oldest tick they recorded (see `heartbeat.lua`).
    pub async fn heartbeat(
        &self,
        key: &str,
        id: &str,
        ttl_us: Micros,
        written: Micros,
    ) -> Result<(u64, Micros), StoreError> {
        let args = |command: &mut redis::Cmd| {
            command.arg(id).arg(ttl_us).arg(written);
        };
        let written_key = format!("{key}:written");
        let (replicas, oldest): (u64, String) = self
            .runner
            .eval(&self.runner.scripts().heartbeat, &[key, &written_key], args)
            .await?;
        let oldest = oldest
            .parse()
            .map_err(|_| StoreError::Protocol(format!("heartbeat replied tick {oldest:?}")))?;
        Ok((replicas, oldest))
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
        let reply: Vec<i64> = self
            .runner
            .eval(&self.runner.scripts().refresh, &keys, args)
            .await?;
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
        self.description.to_string()
    }

    /// Runs one plain command (`DEL`, `GET`, `INCR` of the operators' endpoints), routed by
    /// its key on a Cluster and bounded by the timeout.
    pub async fn command<T: FromRedisValue>(&self, command: &redis::Cmd) -> Result<T, StoreError> {
        self.runner.query(command).await
    }

    /// Like [`RedisStore::command`], bounded by `timeout` (at least the store's) instead: for
    /// background work (see [`ScriptRunner::query_within`]).
    pub async fn command_within<T: FromRedisValue>(
        &self,
        command: &redis::Cmd,
        timeout: Duration,
    ) -> Result<T, StoreError> {
        self.runner.query_within(command, timeout).await
    }

    /// A connection of its own subscribed to `channel` (see [`ScriptRunner::subscribe`]).
    pub async fn subscribe(&self, channel: &str) -> Result<redis::aio::PubSub, StoreError> {
        self.runner.subscribe(channel).await
    }

    /// One `PING`, bounded by the timeout: how readiness learns that Redis is back while no
    /// request is asking.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.runner
            .query::<String>(&redis::cmd("PING"))
            .await
            .map(drop)
    }

    /// `error`'s cause, looked into when it is a timeout (see [`ScriptRunner::diagnose`]).
    pub async fn diagnose(&self, error: StoreError) -> StoreError {
        self.runner.diagnose(error).await
    }

    /// The health probe's check: every connection requests use answers `PING`, a broken one
    /// replaced first (see [`ScriptRunner::check_connections`]); Ok(true) when one was.
    pub async fn check_connections(&self) -> Result<bool, StoreError> {
        self.runner.check_connections().await
    }
}

fn describe(config: &RedisSettings) -> String {
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

/// A fresh lease id for each concurrency check, 0 for the others; empty (no allocation)
/// when no check is a concurrency limit, which [`lease_at`] reads as all 0.
fn lease_ids(checks: &[Check<'_>]) -> Vec<u64> {
    if !checks
        .iter()
        .any(|c| c.params.algorithm == Algorithm::Concurrency)
    {
        return Vec::new();
    }
    checks
        .iter()
        .map(|c| match c.params.algorithm {
            Algorithm::Concurrency => new_lease_id(),
            _ => 0,
        })
        .collect()
}

/// The lease id of check `i` in `ids` (from [`lease_ids`]).
fn lease_at(ids: &[u64], i: usize) -> u64 {
    ids.get(i).copied().unwrap_or(0)
}

/// The seven `settle.lua` arguments of one settlement: algorithm code, limit, period_us,
/// burst, op (1 refund, 2 charge), amount (capped so Lua's doubles stay exact) and the time
/// the refunded units were taken (0 for a charge).
fn settle_args(s: &Settlement) -> [i64; 7] {
    let p = &s.params;
    let cap = |amount: u64| amount.min(super::algorithm::MAX_PRODUCT as u64) as i64;
    let (op, amount, taken_at) = match s.op {
        Settle::Refund { amount, taken_at } => (1, cap(amount), taken_at),
        Settle::Charge { amount } => (2, cap(amount), 0),
    };
    [
        i64::from(p.algorithm.code()),
        p.limit.min(i64::MAX as u64) as i64,
        p.period_us,
        p.burst.min(i64::MAX as u64) as i64,
        op,
        amount,
        taken_at,
    ]
}

/// Script arguments per check (`decide.lua`'s `ARGS`).
#[cfg(test)]
const ARGS_PER_CHECK: usize = 1;

fn parse_decision(
    checks: &[Check<'_>],
    lease_ids: &[u64],
    reply: &[i64],
) -> Result<Decision, StoreError> {
    if reply.len() != 2 + 5 * checks.len() {
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
    for (i, c) in checks.iter().enumerate() {
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
                id: lease_at(lease_ids, i),
                params: c.params,
            });
        }
        verdicts.push(verdict);
    }
    Ok(Decision {
        allowed,
        verdicts,
        leases,
        at: reply[1 + 5 * checks.len()],
    })
}

/// The start of `key` up to and including the `}` that closes its Redis Cluster hash tag
/// (Redis's rule: the first `{`, then the first `}` after it, with something between), which
/// names the slot; the whole key when it has no tag.
fn tag_head(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[..open + len + 2];
            }
        }
    }
    key
}

/// The key of `replica`'s round marker for a sync call whose first key is `key` (see
/// `sync.lua`): `<head>|sync:<replica>`, where the head is, on a Cluster, `key`'s hash tag with
/// what precedes it (`<key_prefix>{<tag>}`), so the marker lives in the slot of the call's
/// keys; on one server the key prefix alone (what precedes the tag), so one marker per replica
/// serves every round whatever its keys. Every store key is `<key_prefix>{<tag>}:…` (and the
/// heartbeat's `<key_prefix>{replicas}`), so none has `|` right after its prefix or its tag:
/// a marker never collides with a limit's state. A key without a tag (none of tollgate's)
/// would put the marker in another slot on a Cluster, where Redis refuses the call (CROSSSLOT)
/// rather than count anything twice.
fn round_marker(key: &str, replica: &str, cluster: bool) -> String {
    let head = if cluster {
        tag_head(key)
    } else {
        key.find('{').map_or(key, |open| &key[..open])
    };
    let mut marker = String::with_capacity(head.len() + 6 + replica.len());
    marker.push_str(head);
    marker.push_str("|sync:");
    marker.push_str(replica);
    marker
}

/// A state in `decide.lua`'s string layout, for the algorithms local-first limits run
/// (fixed_window, sliding_window, token_bucket, gcra); None for anything else (no state, or
/// another algorithm's).
pub fn parse_state(text: &str) -> Option<State> {
    let mut fields = text.split(' ');
    let code = fields.next()?;
    let mut number = || fields.next()?.parse::<i64>().ok();
    let state = match code {
        "1" => State::FixedWindow {
            window: number()?,
            count: number()?.max(0) as u64,
        },
        "3" => State::SlidingWindow {
            window: number()?,
            current: number()?.max(0) as u64,
            previous: number()?.max(0) as u64,
        },
        "4" => State::TokenBucket {
            scaled: number()?,
            updated_at: number()?,
        },
        "5" => State::Gcra { tat: number()? },
        _ => return None,
    };
    Some(state)
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
    fn the_script_derives_block_markers_as_block_key_does() {
        let source = decide_script_source(ScriptClock::Redis);
        assert!(source.contains(&format!(
            "local BLOCK_SUFFIX = '{}'",
            super::super::BLOCK_SUFFIX
        )));
        assert!(source.contains(&format!("local ARGS = {ARGS_PER_CHECK}\n")));
        assert_eq!(super::super::block_key("t:{r}:p:v"), "t:{r}:p:v:block");
    }

    #[test]
    fn round_markers_share_the_slot_of_their_keys_on_a_cluster() {
        assert_eq!(tag_head("t:{api|u1}:gcra"), "t:{api|u1}");
        assert_eq!(tag_head("t:{api}:gcra:u1"), "t:{api}");
        // Redis's rule: the first `{` and the first `}` after it; an empty tag is none.
        assert_eq!(tag_head("t:{a}{b}:x"), "t:{a}");
        assert_eq!(tag_head("t:{{a}}:x"), "t:{{a}");
        assert_eq!(tag_head("t:{}:x"), "t:{}:x");
        assert_eq!(tag_head("plain"), "plain");
        assert_eq!(
            round_marker("t:{api|u1}:gcra", "00ff", true),
            "t:{api|u1}|sync:00ff"
        );
        assert_eq!(
            round_marker("t:{api|u1}:gcra", "00ff", false),
            "t:|sync:00ff"
        );
        assert_eq!(round_marker("sync:k", "r", false), "sync:k|sync:r");
    }
}

//! Coalescing (`store.redis.coalesce: true`): the decisions of concurrent requests travel to
//! Redis together, in one call of the decision script in its batch form.
//!
//! Most of what Redis spends on a decision is per call, not per limit: reading and parsing
//! the command, setting up the script, reading the clock, building the reply. A proxy under
//! load has many decisions waiting at once, so sending them in one call saves Redis most of
//! that. Each request still waits for exactly one round trip, and nothing waits on purpose:
//! a decision that finds a call slot free goes out at once (alone, with the ordinary
//! script), and only decisions that arrive while every slot is busy are gathered for the
//! next call. Under light load nothing changes; under heavy load calls
//! grow by themselves.
//!
//! The batch runs the decisions one after another inside one atomic script, on one reading of
//! Redis's clock, exactly as the same decisions sent back to back in that order would run:
//! every decision stays all-or-nothing over its own limits. What changes is failure: if the
//! call fails (timeout, connection lost, a Redis error), every decision in it fails, and each
//! caller applies `on_error` as it would for its own failed call.
//!
//! Not for Redis Cluster: decisions of different callers live in different hash slots, which
//! one script call cannot reach (config validation refuses the combination).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::decision::StoreError;
use super::lua::{split_batch_reply, CheckArg, PackedInts};
use super::script_runner::{ScriptRunner, ORPHAN_WAIT};

/// Calls in flight at once. Two keep Redis busy while the next batch gathers; more would
/// only make batches smaller.
const CALLS_IN_FLIGHT: usize = 2;
/// Decisions in one call at most: bounds the script's run time (and so the wait of every
/// other Redis client) to well under a millisecond even for three-limit decisions.
pub const MAX_BATCH: usize = 64;
/// Decisions queued while both calls are in flight; past this, callers wait to queue (inside
/// their own timeout), so a stalled Redis cannot make memory grow.
const QUEUE: usize = 1024;

/// One decision waiting to be sent: its keys and its script arguments, those of each limit, as
/// the single-decision script takes them.
pub struct Pending {
    pub keys: Vec<String>,
    pub args: Vec<CheckArg>,
    pub reply: oneshot::Sender<Result<Vec<i64>, StoreError>>,
    pub claim: Arc<Claim>,
}

/// Where a queued decision stands, claimed once: by the sending task before it sends the
/// decision, or by a caller that gives up waiting. Whoever comes second learns the first's
/// claim, so a decision is either never sent or known to be sent (its caller then awaits the
/// reply to give back what it took, see `redis_store`'s orphaned decisions).
#[derive(Default)]
pub struct Claim(AtomicU8);

const QUEUED: u8 = 0;
const SENT: u8 = 1;
const ABANDONED: u8 = 2;

impl Claim {
    /// Claims the decision for sending; false if its caller already gave up.
    fn send(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, SENT, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Gives the decision up; false if it was already sent (it may run in Redis).
    pub fn abandon(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// The queue in front of the sending task. Dropping it ends the task once the queue drains.
pub struct Coalescer {
    queue: mpsc::Sender<Pending>,
}

impl Coalescer {
    /// Starts the sending task (needs a Tokio runtime), which sends the batches through
    /// `runner`. The task holds the runner, never the store, so it ends when the store (the
    /// owner of this coalescer) is dropped.
    pub fn start(runner: Arc<ScriptRunner>) -> Coalescer {
        let (queue, waiting) = mpsc::channel(QUEUE);
        tokio::spawn(gather(runner, waiting));
        Coalescer { queue }
    }

    /// Queues one decision and waits for its reply values. The caller bounds the wait.
    pub async fn decide(
        &self,
        keys: Vec<String>,
        args: Vec<CheckArg>,
        claim: Arc<Claim>,
    ) -> Result<Vec<i64>, StoreError> {
        let (reply, answer) = oneshot::channel();
        let gone = || StoreError::Protocol("the coalescing task has stopped".into());
        self.queue
            .send(Pending {
                keys,
                args,
                reply,
                claim,
            })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// Takes a call slot, then everything queued (up to [`MAX_BATCH`]), and sends it; while both
/// slots are busy, decisions pile up in the queue and form the next batch.
async fn gather(runner: Arc<ScriptRunner>, mut waiting: mpsc::Receiver<Pending>) {
    let slots = Arc::new(Semaphore::new(CALLS_IN_FLIGHT));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = waiting.recv().await else {
            return;
        };
        let mut batch = Vec::with_capacity(8);
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match waiting.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        // A caller that already gave up (its timeout passed while queued) is not decided:
        // deciding would consume quota for a request that was answered otherwise.
        batch.retain(|p| p.claim.send());
        if batch.is_empty() {
            continue;
        }
        let runner = runner.clone();
        tokio::spawn(async move {
            send_batch(&runner, batch).await;
            drop(slot);
        });
    }
}

/// Sends the queued decisions of `batch` in one call and answers each of them: alone with the
/// ordinary script, several with the batch form. Waits for the reply longer than the callers'
/// timeout (up to [`ORPHAN_WAIT`]): a caller that gave up after its decision was sent still
/// needs the reply to give back what the decision took.
async fn send_batch(runner: &Arc<ScriptRunner>, batch: Vec<Pending>) {
    let call = |script: fn(&super::script_runner::Scripts) -> &super::script_runner::LuaScript,
                keys: &[&str],
                args: &dyn Fn(&mut redis::Cmd)| {
        let call = runner.eval_owned::<PackedInts>(script, keys, args);
        async move {
            match tokio::time::timeout(ORPHAN_WAIT, call).await {
                Ok(reply) => reply.map_err(|e| runner.reply_error(e)),
                Err(_) => Err(StoreError::Timeout(ORPHAN_WAIT)),
            }
        }
    };
    let replies = if let [one] = batch.as_slice() {
        let keys: Vec<&str> = one.keys.iter().map(String::as_str).collect();
        let args = |command: &mut redis::Cmd| {
            for value in &one.args {
                command.arg(value.as_bytes());
            }
        };
        call(|s| &s.decide, &keys, &args)
            .await
            .map(|PackedInts(reply)| vec![reply])
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
                    command.arg(value.as_bytes());
                }
            }
        };
        call(|s| &s.decide_batch, &keys, &args)
            .await
            .and_then(|PackedInts(flat)| {
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

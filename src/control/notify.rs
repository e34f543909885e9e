//! Changes announced to every replica at once: an override set or removed, a caller reset.
//!
//! The replica that makes a change writes it to Redis, bumps its generation (the watches'
//! fallback, see [`super::overrides`] and [`super::caller`]) and then publishes one word on the
//! channel `<key_prefix>changes` ([`publish`]): `overrides` or `resets`. Each watch of each
//! replica holds a subscription of its own ([`listen`]) and reads the change as soon as the
//! word arrives, instead of on its next tick, so a change made on one replica applies on the
//! others within a round trip or two.
//!
//! Pub/sub delivers at most once and only to connected subscribers: a message published while
//! a replica is reconnecting is lost. So the watches keep their ticks as the fallback, and a
//! new or renewed subscription wakes its watch too (it re-reads everything, whatever it missed
//! meanwhile). The subscription is on a connection of its own (a subscribed connection can
//! send nothing else): to the one server, to a seed node of a Cluster (a Cluster delivers a
//! `PUBLISH` to the subscribers of every node), or to the master the Sentinels name, looked up
//! again on every reconnect. A connection that stops answering (a partition) is found by a
//! `PING` every [`KEEPALIVE`] and replaced.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::limit::redis_store::RedisStore;
use crate::limit::Store;
use crate::store::{Shared, WeakShared};

/// What changed: the word published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic {
    Overrides,
    Resets,
}

impl Topic {
    fn word(self) -> &'static str {
        match self {
            Topic::Overrides => "overrides",
            Topic::Resets => "resets",
        }
    }
}

/// How often a subscribed connection is checked with a `PING`.
pub const KEEPALIVE: Duration = Duration::from_secs(5);
/// Pauses between attempts to subscribe while Redis cannot be reached.
const RETRY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(1));

/// The channel changes are announced on: outside every limit's key space.
pub fn channel(prefix: &str) -> String {
    format!("{prefix}changes")
}

/// Announces a change to every replica subscribed. The change itself is already in Redis: a
/// failure here is logged and the other replicas follow on their watch's next tick.
pub async fn publish(store: &RedisStore, prefix: &str, topic: Topic) {
    let publish = redis::cmd("PUBLISH")
        .arg(channel(prefix))
        .arg(topic.word())
        .clone();
    if let Err(e) = store.command::<u64>(&publish).await {
        tracing::warn!(
            cause = %crate::error::chain(&e),
            topic = topic.word(),
            "could not announce a change to the other replicas; they follow on their next look"
        );
    }
}

/// Subscribes to `topic` under `prefix` on the store in `redis`, in a task of its own. The
/// receiver gets a wake-up for each announcement and each time the subscription is made or
/// renewed (coalesced: one pending wake-up at most); the task ends when the receiver is
/// dropped.
pub fn listen(redis: &Shared, prefix: &str, topic: Topic) -> mpsc::Receiver<()> {
    let (wake, woken) = mpsc::channel(1);
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::spawn(subscription(
            redis.downgrade(),
            channel(prefix),
            topic,
            wake,
        ));
    }
    woken
}

/// The subscription's task: subscribe, forward, and subscribe again when the connection is
/// lost, until the receiver is gone.
async fn subscription(redis: WeakShared, channel: String, topic: Topic, wake: mpsc::Sender<()>) {
    let mut pause = RETRY.0;
    loop {
        let store = match redis.upgrade().as_ref().and_then(Shared::get) {
            Some(Store::Redis(store)) => Some(store.clone()),
            _ => None,
        };
        let subscribed = match store {
            // Redis is still connecting: look again shortly (no backoff, this costs nothing).
            None => {
                tokio::select! {
                    _ = wake.closed() => return,
                    _ = tokio::time::sleep(RETRY.0) => {}
                }
                continue;
            }
            Some(store) => tokio::select! {
                _ = wake.closed() => return,
                subscribed = store.subscribe(&channel) => match subscribed {
                    Ok(pubsub) => Some(pubsub),
                    Err(e) => {
                        tracing::debug!(cause = %crate::error::chain(&e), "could not subscribe to changes; the watch looks by itself meanwhile");
                        None
                    }
                },
            },
        };
        let Some(pubsub) = subscribed else {
            tokio::select! {
                _ = wake.closed() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(RETRY.1);
            continue;
        };
        // Whatever was announced while not subscribed is read now.
        let _ = wake.try_send(());
        let subscribed_at = tokio::time::Instant::now();
        if !forward(pubsub, topic, &wake).await {
            return;
        }
        tracing::debug!(
            topic = topic.word(),
            "the subscription to changes was lost; subscribing again"
        );
        // A subscription that keeps being cut at once (a server that refuses subscribers) is
        // renewed with the same backoff as a failed one, not in a loop.
        if subscribed_at.elapsed() < KEEPALIVE {
            tokio::select! {
                _ = wake.closed() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(RETRY.1);
        } else {
            pause = RETRY.0;
        }
    }
}

/// Forwards announcements of `topic` until the connection is lost (false: the receiver is
/// gone, stop).
async fn forward(pubsub: redis::aio::PubSub, topic: Topic, wake: &mpsc::Sender<()>) -> bool {
    let (mut sink, mut messages) = pubsub.split();
    let mut keepalive = tokio::time::interval(KEEPALIVE);
    keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    keepalive.tick().await;
    loop {
        tokio::select! {
            _ = wake.closed() => return false,
            message = messages.next() => match message {
                Some(message) => {
                    if message.get_payload_bytes() == topic.word().as_bytes() {
                        let _ = wake.try_send(());
                    }
                }
                None => return true,
            },
            _ = keepalive.tick() => {
                let ping = tokio::time::timeout(KEEPALIVE, sink.ping::<redis::Value>());
                if !matches!(ping.await, Ok(Ok(_))) {
                    return true;
                }
            }
        }
    }
}

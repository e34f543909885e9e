//! Per-replica records in Redis, for views of the whole fleet (top offenders, suggested
//! limits): each replica publishes its own record, and any replica reads them all without
//! knowing who else runs. Under one hash tag `{<tag>}`, so every call touches one Cluster
//! slot:
//!
//! - `<key_prefix>{<tag>}.<replica id>`, a string: that replica's record (JSON), expiring
//!   `silent_after` after its last publish, so a replica that stops drops out by itself, on
//!   Redis's clock;
//! - `<key_prefix>{<tag>}`, a sorted set, the registry: replica id → when it last published
//!   (its own clock, ms). Each publish drops the ids older than `key_ttl` and keeps the
//!   `max_replicas` most recent; the key expires `key_ttl` after the last publish.
//!
//! Neither can be a limit's key: a limit's key always goes on with `}:` after its hash tag.
//! The commands of a publish go out together (the connection pipelines them: one round trip);
//! plain commands rather than a script, so that the script calls Redis counts stay the limit
//! decisions'.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::limit::redis_store::RedisStore;
use crate::limit::StoreError;

/// One kind of per-replica record: its hash tag and how long records and ids live.
#[derive(Debug, Clone, Copy)]
pub struct ReplicaRecords {
    /// The hash tag, without braces: `offenders`, `suggest`.
    pub tag: &'static str,
    /// A record not refreshed for this long is gone (its replica is no longer in the view).
    pub silent_after: Duration,
    /// The registry expires this long after the last publish, and forgets older ids.
    pub key_ttl: Duration,
    /// Replicas kept in the registry (and read) at most; past it the least recent go.
    pub max_replicas: usize,
}

impl ReplicaRecords {
    /// The registry: replica id → when it last published.
    pub fn registry_key(&self, prefix: &str) -> String {
        format!("{prefix}{{{}}}", self.tag)
    }

    /// Replica `id`'s record.
    pub fn record_key(&self, prefix: &str, id: &str) -> String {
        format!("{prefix}{{{}}}.{id}", self.tag)
    }

    /// Publishes `record` as replica `id`'s.
    pub async fn publish(
        &self,
        redis: &RedisStore,
        prefix: &str,
        id: &str,
        record: &impl Serialize,
    ) -> Result<(), StoreError> {
        let now = unix_ms();
        let registry = self.registry_key(prefix);
        let mut set = redis::cmd("SET");
        set.arg(self.record_key(prefix, id))
            .arg(serde_json::to_string(record).unwrap_or_default())
            .arg("PX")
            .arg(self.silent_after.as_millis() as u64);
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&registry).arg(now).arg(id);
        let mut forget = redis::cmd("ZREMRANGEBYSCORE");
        forget.arg(&registry).arg("-inf").arg(format!(
            "({}",
            now.saturating_sub(self.key_ttl.as_millis() as u64)
        ));
        let mut cap = redis::cmd("ZREMRANGEBYRANK");
        cap.arg(&registry)
            .arg(0)
            .arg(-(self.max_replicas as i64) - 1);
        let mut expire = redis::cmd("PEXPIRE");
        expire.arg(&registry).arg(self.key_ttl.as_millis() as u64);
        let (set, zadd, forget, cap, expire) = tokio::join!(
            redis.command::<()>(&set),
            redis.command::<i64>(&zadd),
            redis.command::<i64>(&forget),
            redis.command::<i64>(&cap),
            redis.command::<i64>(&expire),
        );
        set.and(zadd).and(forget).and(cap).and(expire).map(drop)
    }

    /// Removes replica `id`'s record and its registry entry (it has nothing to say).
    pub async fn withdraw(
        &self,
        redis: &RedisStore,
        prefix: &str,
        id: &str,
    ) -> Result<(), StoreError> {
        let mut del = redis::cmd("DEL");
        del.arg(self.record_key(prefix, id));
        let mut zrem = redis::cmd("ZREM");
        zrem.arg(self.registry_key(prefix)).arg(id);
        let (deleted, removed) =
            tokio::join!(redis.command::<i64>(&del), redis.command::<i64>(&zrem));
        deleted.and(removed).map(drop)
    }

    /// The records of the replicas heard from within `silent_after` (the `max_replicas` most
    /// recent in the registry), by replica id. A record that does not parse is left out.
    pub async fn read<T: DeserializeOwned>(
        &self,
        redis: &RedisStore,
        prefix: &str,
    ) -> Result<Vec<(String, T)>, StoreError> {
        let mut range = redis::cmd("ZREVRANGE");
        range
            .arg(self.registry_key(prefix))
            .arg(0)
            .arg(self.max_replicas as i64 - 1);
        let ids: Vec<String> = redis.command(&range).await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut mget = redis::cmd("MGET");
        for id in &ids {
            mget.arg(self.record_key(prefix, id));
        }
        let records: Vec<Option<String>> = redis.command(&mget).await?;
        Ok(ids
            .into_iter()
            .zip(records)
            .filter_map(|(id, text)| Some((id, serde_json::from_str(&text?).ok()?)))
            .collect())
    }
}

/// Now on this machine's clock, in ms since the Unix epoch (the registry's scores).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let records = ReplicaRecords {
            tag: "offenders",
            silent_after: Duration::from_secs(10),
            key_ttl: Duration::from_secs(120),
            max_replicas: 256,
        };
        assert_eq!(records.registry_key("tg:"), "tg:{offenders}");
        assert_eq!(records.record_key("tg:", "r1"), "tg:{offenders}.r1");
    }
}

//! The fleet's top offenders through Redis: every replica publishes its own top list
//! ([`super::offenders`]) once per [`PUBLISH_EVERY`], and `/limits/top` merges the lists of
//! every replica heard from recently, counting per (route, caller) how many replicas listed it.
//!
//! A denial never touches Redis: a background task sends the replica's whole list at once
//! (a few plain commands, pipelined: one round trip whatever the number of denials), as a
//! per-replica record under the hash tag `{offenders}` ([`crate::store::replicas`]): JSON, per
//! route at most [`super::offenders::CAPACITY`] callers with count and error, and a floor,
//! gone [`SILENT_AFTER`] after the replica's last publish.
//!
//! Merging: counts and errors add up over replicas. A replica that lists a route but not a
//! caller may still have denied that caller up to its `floor` (non-zero only when its own
//! list was cut or its sketch was full), which goes into the count and the error, as within
//! one replica's sketch.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::limit::redis_store::RedisStore;
use crate::limit::StoreError;
use crate::store::replicas::ReplicaRecords;

/// How often a replica publishes its list.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// A replica not heard from for this long is no longer part of the fleet's view.
pub const SILENT_AFTER: Duration = Duration::from_secs(10);
/// The registry expires this long after the last publish of any replica, and forgets ids
/// older than this.
pub const KEY_TTL: Duration = Duration::from_secs(120);
/// Replicas kept in the registry (and read) at most; past it the ones heard from least
/// recently are dropped.
pub const MAX_REPLICAS: usize = 256;

/// One replica's list for one route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteList {
    /// What a caller this replica does not list may have had at most.
    #[serde(default)]
    pub floor: u64,
    /// (caller, count, error), most denied first.
    pub top: Vec<(String, u64, u64)>,
}

/// One replica's lists, by route (what it publishes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub routes: BTreeMap<String, RouteList>,
}

impl Snapshot {
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

/// One caller in the fleet's list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    pub item: String,
    pub count: u64,
    pub error: u64,
    /// Replicas that listed it.
    pub replicas: u32,
}

/// The fleet's top `k` per route (routes by name, callers most denied first) from every
/// replica's snapshot.
pub fn merge(snapshots: &[Snapshot], k: usize) -> Vec<(String, Vec<Merged>)> {
    let mut routes: BTreeMap<&str, Vec<&RouteList>> = BTreeMap::new();
    for snapshot in snapshots {
        for (route, list) in &snapshot.routes {
            routes.entry(route).or_default().push(list);
        }
    }
    let mut out = Vec::new();
    for (route, lists) in routes {
        let floors: u64 = lists.iter().map(|l| l.floor).sum();
        // Per caller: (count, error, replicas, floors of the replicas that listed it).
        let mut callers: HashMap<&str, (u64, u64, u32, u64)> = HashMap::new();
        for list in &lists {
            for (item, count, error) in &list.top {
                let entry = callers.entry(item).or_default();
                entry.0 += count;
                entry.1 += error;
                entry.2 += 1;
                entry.3 += list.floor;
            }
        }
        let mut merged: Vec<Merged> = callers
            .into_iter()
            .map(|(item, (count, error, replicas, listed_floors))| {
                let unlisted = floors - listed_floors;
                Merged {
                    item: item.to_owned(),
                    count: count + unlisted,
                    error: error + unlisted,
                    replicas,
                }
            })
            .collect();
        // As one replica's list: most denied first, then the more exact, then by name.
        merged.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then(a.error.cmp(&b.error))
                .then(a.item.cmp(&b.item))
        });
        merged.truncate(k);
        if !merged.is_empty() {
            out.push((route.to_owned(), merged));
        }
    }
    out
}

/// Where the replicas' lists live in Redis.
pub const LISTS: ReplicaRecords = ReplicaRecords {
    tag: "offenders",
    silent_after: SILENT_AFTER,
    key_ttl: KEY_TTL,
    max_replicas: MAX_REPLICAS,
};

/// Publishes `snapshot` as replica `id`'s list (an empty one removes it).
pub async fn publish(
    redis: &RedisStore,
    prefix: &str,
    id: &str,
    snapshot: &Snapshot,
) -> Result<(), StoreError> {
    if snapshot.is_empty() {
        return LISTS.withdraw(redis, prefix, id).await;
    }
    LISTS.publish(redis, prefix, id, snapshot).await
}

/// The lists of the replicas heard from within [`SILENT_AFTER`] (the [`MAX_REPLICAS`] most
/// recent in the registry), by replica id. A list that does not parse is left out.
pub async fn read(redis: &RedisStore, prefix: &str) -> Result<Vec<(String, Snapshot)>, StoreError> {
    LISTS.read(redis, prefix).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (caller, count, error).
    type Listed<'a> = &'a [(&'a str, u64, u64)];

    fn snapshot(routes: &[(&str, u64, Listed)]) -> Snapshot {
        Snapshot {
            routes: routes
                .iter()
                .map(|(route, floor, top)| {
                    (
                        route.to_string(),
                        RouteList {
                            floor: *floor,
                            top: top
                                .iter()
                                .map(|(i, c, e)| (i.to_string(), *c, *e))
                                .collect(),
                        },
                    )
                })
                .collect(),
        }
    }

    fn listed(merged: &[Merged]) -> Vec<(&str, u64, u64, u32)> {
        merged
            .iter()
            .map(|m| (m.item.as_str(), m.count, m.error, m.replicas))
            .collect()
    }

    #[test]
    fn counts_add_up_over_replicas_and_each_caller_says_how_many_listed_it() {
        let one = snapshot(&[("api", 0, &[("a", 30, 0), ("c", 5, 0)])]);
        let two = snapshot(&[
            ("api", 0, &[("b", 20, 0), ("c", 7, 1)]),
            ("login", 0, &[("d", 1, 0)]),
        ]);
        let merged = merge(&[one, two], 10);
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].0, "api");
        assert_eq!(
            listed(&merged[0].1),
            [("a", 30, 0, 1), ("b", 20, 0, 1), ("c", 12, 1, 2)]
        );
        assert_eq!(merged[1].0, "login");
        assert_eq!(listed(&merged[1].1), [("d", 1, 0, 1)]);
        assert_eq!(merge(&[snapshot(&[("api", 0, &[("a", 1, 0)])])], 0), []);
    }

    #[test]
    fn a_replica_that_cut_its_list_counts_its_floor_for_callers_it_left_out() {
        let one = snapshot(&[("api", 4, &[("a", 9, 0), ("b", 4, 0)])]);
        let two = snapshot(&[("api", 0, &[("c", 6, 0)])]);
        let merged = merge(&[one, two], 2);
        // c may have been denied up to 4 times on the first replica too.
        assert_eq!(listed(&merged[0].1), [("c", 10, 4, 1), ("a", 9, 0, 1)]);
    }

    #[test]
    fn the_published_form_reads_back() {
        let one = snapshot(&[("api", 3, &[("header=a|ip=1.2.3.4", 30, 2)])]);
        let text = serde_json::to_string(&one).unwrap();
        assert_eq!(serde_json::from_str::<Snapshot>(&text).unwrap(), one);
    }
}

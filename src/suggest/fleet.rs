//! The fleet's per-caller record in Redis, so that a caller whose requests a load balancer
//! spreads over several replicas counts once, at its fleet-wide rate.
//!
//! Every replica hashes a caller's key with the same keyed hash (seeded from the key prefix,
//! see `Suggest::new` in the module's root). Every publish tick (5 s) each replica adds what each of
//! its callers' counters gained since the last send ([`Delta`]) into one Redis hash per route
//! and clock hour, `<key_prefix>{suggest}.callers.<hour>.<route>`, field by field with
//! `HINCRBY` ([`SCRIPT`], run per route and hour and [`CHUNK`] callers): per caller `<hash>r` requests,
//! `<hash>m` peak per-minute rate, `<hash>s` peak per-second rate, and when not zero `<hash>x`
//! refused and `<hash>h` shadow-refused requests.
//!
//! What adds up: requests exactly. A caller's peaks are added over the replicas that saw it:
//! the fleet's `sliding_window` count at any instant is the sum of the replicas' counts then,
//! so the sum of the replicas' peaks is never below the caller's fleet-wide peak, and equals
//! it when the replicas' peaks fall at the same time (a round-robin balancer spreads every
//! burst evenly) or one replica sees the caller. It is above it when a caller's traffic moves
//! between replicas within the hour, and by up to one request per replica from each replica
//! rounding its count up.
//!
//! Bounded: a hash holds at most [`MAX_CALLERS`] callers (the `callers` field counts them);
//! a gain for a caller it does not hold once full is dropped and counted in `overflow`
//! (reported as evictions). It expires [`super::record::KEEP_HOURS`] hours after its hour
//! began. At most 5 fields per caller (3 for one that nothing refused).

use std::collections::HashMap;

use super::hist::Histogram;
use super::record::{Delta, KEEP_HOURS};
use crate::limit::redis_store::RedisStore;
use crate::limit::StoreError;

/// Callers one route's hash holds per hour: the number of live counters one replica keeps
/// for a route (`SHARDS × record::CAPACITY`).
pub const MAX_CALLERS: usize = super::record::SHARDS * super::record::CAPACITY;

const HOUR_MS: u64 = 3_600_000;

/// KEYS[1] the hash; ARGV: the caller cap, the expiry (Unix ms), then per caller its hash
/// and five gains (requests, minute peak, second peak, refused, shadow).
pub const SCRIPT: &str = r#"
local key, cap = KEYS[1], tonumber(ARGV[1])
local n = tonumber(redis.call('HGET', key, 'callers') or '0')
local names = {'r', 'm', 's', 'x', 'h'}
for i = 3, #ARGV, 6 do
  local c = ARGV[i]
  local known = redis.call('HEXISTS', key, c .. 'r') == 1
  if known or n < cap then
    if not known then
      n = n + 1
      redis.call('HINCRBY', key, 'callers', 1)
    end
    for j = 1, 5 do
      local d = tonumber(ARGV[i + j])
      if d ~= 0 then
        redis.call('HINCRBY', key, c .. names[j], d)
      end
    end
  else
    redis.call('HINCRBY', key, 'overflow', 1)
  end
end
redis.call('PEXPIREAT', key, ARGV[2])
return n
"#;

pub fn callers_key(prefix: &str, route: &str, hour: u32) -> String {
    format!("{prefix}{{suggest}}.callers.{hour}.{route}")
}

/// How long a send or read step may take: longer than a request's store timeout, as these
/// run in the background or on an operator's query, and a send that timed out may have been
/// applied (given back and sent again, it would count twice).
pub const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Callers per script run, and fields per `HSCAN` step: each command stays short, so none
/// holds Redis up (it serves the limits too) or nears the store's timeout.
pub const CHUNK: usize = 256;

/// Adds one route's gains in one hour to the fleet's hash, [`CHUNK`] callers per script run;
/// on an error, the gains not sent (a run is all or nothing, unless it timed out).
pub async fn send(
    redis: &RedisStore,
    prefix: &str,
    route: &str,
    hour: u32,
    deltas: &[Delta],
) -> Result<(), (StoreError, Vec<Delta>)> {
    for (i, chunk) in deltas.chunks(CHUNK).enumerate() {
        if let Err(cause) = send_chunk(redis, prefix, route, hour, chunk).await {
            return Err((cause, deltas[i * CHUNK..].to_vec()));
        }
    }
    Ok(())
}

async fn send_chunk(
    redis: &RedisStore,
    prefix: &str,
    route: &str,
    hour: u32,
    deltas: &[Delta],
) -> Result<(), StoreError> {
    let mut eval = redis::cmd("EVAL");
    eval.arg(SCRIPT)
        .arg(1)
        .arg(callers_key(prefix, route, hour))
        .arg(MAX_CALLERS)
        .arg((hour as u64 + KEEP_HOURS as u64) * HOUR_MS);
    for d in deltas {
        let g = d.gained;
        eval.arg(format!("{:016x}", d.hash))
            .arg(g.requests)
            .arg(g.minute)
            .arg(g.second)
            .arg(g.refused)
            .arg(g.shadow);
    }
    redis.command_within::<i64>(&eval, TIMEOUT).await.map(drop)
}

/// One route's hour as the fleet's hash has it, caller by caller.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Callers {
    pub minute: Histogram,
    pub second: Histogram,
    pub refused_callers: u64,
    pub shadow_callers: u64,
    /// Gains dropped because the hash was full.
    pub overflow: u64,
}

/// Reads the hash's fields into histograms; `None` when there is no hash.
pub fn from_fields(fields: &HashMap<String, u64>) -> Option<Callers> {
    if fields.is_empty() {
        return None;
    }
    #[derive(Default)]
    struct One {
        r: u64,
        m: u64,
        s: u64,
        x: u64,
        h: u64,
    }
    let mut callers: HashMap<&str, One> = HashMap::new();
    let mut out = Callers {
        overflow: fields.get("overflow").copied().unwrap_or(0),
        ..Callers::default()
    };
    for (name, value) in fields {
        if name.len() != 17 {
            continue; // `callers`, `overflow`
        }
        let (hash, which) = name.split_at(16);
        let one = callers.entry(hash).or_default();
        match which {
            "r" => one.r = *value,
            "m" => one.m = *value,
            "s" => one.s = *value,
            "x" => one.x = *value,
            "h" => one.h = *value,
            _ => {}
        }
    }
    for one in callers.values().filter(|c| c.r > 0) {
        let peak = |v: u64| v.min(u32::MAX as u64) as u32;
        out.minute.add(peak(one.m), one.r);
        out.second.add(peak(one.s), one.r);
        out.refused_callers += (one.x > 0) as u64;
        out.shadow_callers += (one.h > 0) as u64;
    }
    Some(out)
}

/// The fleet's hash for `route` in `hour`, if any.
pub async fn read(
    redis: &RedisStore,
    prefix: &str,
    route: &str,
    hour: u32,
) -> Result<Option<Callers>, StoreError> {
    let key = callers_key(prefix, route, hour);
    let mut fields: HashMap<String, u64> = HashMap::new();
    let mut cursor = 0u64;
    loop {
        let mut scan = redis::cmd("HSCAN");
        scan.arg(&key).arg(cursor).arg("COUNT").arg(4 * CHUNK);
        let (next, found): (u64, Vec<(String, u64)>) = redis.command_within(&scan, TIMEOUT).await?;
        fields.extend(found);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    Ok(from_fields(&fields))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_add_up_caller_by_caller() {
        let mut fields = HashMap::new();
        for (name, v) in [
            ("00000000000000aar", 10),
            ("00000000000000aam", 10),
            ("00000000000000aas", 4),
            ("00000000000000aax", 2),
            ("00000000000000bbr", 3),
            ("00000000000000bbm", 2),
            ("00000000000000bbs", 1),
            ("00000000000000bbh", 1),
            ("callers", 2),
            ("overflow", 7),
        ] {
            fields.insert(name.to_string(), v);
        }
        let c = from_fields(&fields).unwrap();
        assert_eq!((c.minute.callers(), c.minute.requests()), (2, 13));
        assert_eq!((c.minute.max(), c.second.max()), (10, 4));
        assert_eq!((c.refused_callers, c.shadow_callers, c.overflow), (1, 1, 7));
        assert_eq!(from_fields(&HashMap::new()), None);
    }
}

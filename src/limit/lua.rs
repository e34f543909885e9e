//! The Lua scripts of the Redis store and their variants: `decide.lua` (single, batch and
//! peek forms), `refresh.lua`, `settle.lua` and `release.lua`, each behind the shared
//! `prelude.lua`.
//!
//! The variants are made by switching one marked line of the source, so every form shares
//! every other line and cannot drift from the others. Also the encoding of a check as
//! `decide.lua`'s argument ([`CheckArg`]) and the parsing of packed replies. Pure text:
//! running the scripts is the script runner's job.

use super::clock::Micros;
use super::decision::{Check, StoreError};

const PRELUDE_LUA: &str = include_str!("prelude.lua");
const DECIDE_LUA: &str = include_str!("decide.lua");
const RELEASE_LUA: &str = include_str!("release.lua");
const REFRESH_LUA: &str = include_str!("refresh.lua");
const SETTLE_LUA: &str = include_str!("settle.lua");
const SYNC_LUA: &str = include_str!("sync.lua");
const HEARTBEAT_LUA: &str = include_str!("heartbeat.lua");

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
        ScriptClock::Redis => match super::calendar::test_clock_offset_us() {
            0 => source,
            offset => {
                assert!(
                    source.contains(OFFSET_LINE),
                    "the prelude lost its offset marker"
                );
                source.replacen(
                    OFFSET_LINE,
                    &format!("local OFFSET_US = {offset} -- @offset"),
                    1,
                )
            }
        },
        ScriptClock::Argv => source.replacen(CLOCK_LINE, "local CLOCK = 'argv' -- @clock", 1),
    }
}

/// The prelude's line that adds the test clock offset (debug builds only, see
/// `calendar::test_clock_offset_us`) to Redis's `TIME`; 0 everywhere else.
const OFFSET_LINE: &str = "local OFFSET_US = 0 -- @offset";

/// `decide.lua` with the given clock (both variants share every other line).
pub fn decide_script_source(clock: ScriptClock) -> String {
    with_clock(DECIDE_LUA, clock)
}

/// The line of `decide.lua` that switches it to its batch form.
const BATCH_LINE: &str = "local BATCH = false -- @batch";

/// `decide.lua` in its batch form: several decisions, each all-or-nothing over its own checks,
/// one after another in one call. ARGV (after the injected time, if any): the number of
/// decisions, then per decision its number of checks and the values of each check of the
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

/// `settle.lua` with the given clock.
pub fn settle_script_source(clock: ScriptClock) -> String {
    with_clock(SETTLE_LUA, clock)
}

/// The line of `settle.lua` where its own loop over the settlements starts: `sync.lua` keeps
/// everything before it (the charge arithmetic) and replaces the rest.
const SETTLE_LOOP_LINE: &str = "\nlocal written = 0\n";

/// `sync.lua`: one round of local-first limits, charging each key with `settle.lua`'s very
/// functions (so the two cannot drift) and replying every key's state.
pub fn sync_script_source(clock: ScriptClock) -> String {
    let (functions, _) = SETTLE_LUA
        .split_once(SETTLE_LOOP_LINE)
        .expect("settle.lua lost its settlement loop");
    with_clock(&format!("{functions}\n{SYNC_LUA}"), clock)
}

/// `heartbeat.lua`, on Redis's clock (the replicas' expiries must share one clock).
pub fn heartbeat_script_source() -> String {
    with_clock(HEARTBEAT_LUA, ScriptClock::Redis)
}

/// `release.lua` (it needs no clock).
pub fn release_script_source() -> String {
    RELEASE_LUA.to_string()
}

/// A script's reply of integers packed into one string by `packed` in prelude.lua: each
/// integer after a space. redis-rs parses an array reply element by element, building a value
/// for each; one string read in place costs a small fraction of that.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PackedInts(pub Vec<i64>);

impl PackedInts {
    /// The integers of `text`, or `None` if anything but ASCII-space-separated decimal
    /// integers (an optional `-`, then digits, fitting an i64) is in it.
    fn parse(text: &[u8]) -> Option<Vec<i64>> {
        // This runs on every exact decision: one pass over the bytes (no word iterator), one
        // comparison per digit (wrapping arithmetic; the length is checked once per integer:
        // 19 digits cannot overflow a u64), one range check per integer. A decision's reply
        // is 2 + 5 per check integers: room for one check.
        let mut values = Vec::with_capacity(8);
        let mut rest = text;
        loop {
            while let [b' ', tail @ ..] = rest {
                rest = tail;
            }
            if rest.is_empty() {
                return Some(values);
            }
            let negative = rest[0] == b'-';
            let digits = &rest[usize::from(negative)..];
            let len = digits
                .iter()
                .position(|&b| b == b' ')
                .unwrap_or(digits.len());
            if len == 0 || len > 19 {
                return None;
            }
            let mut magnitude: u64 = 0;
            for &byte in &digits[..len] {
                let digit = byte.wrapping_sub(b'0');
                if digit > 9 {
                    return None;
                }
                magnitude = magnitude.wrapping_mul(10).wrapping_add(u64::from(digit));
            }
            values.push(if negative {
                // i64::MIN's magnitude is one more than i64::MAX.
                0i64.checked_sub_unsigned(magnitude)?
            } else {
                i64::try_from(magnitude).ok()?
            });
            rest = &digits[len..];
        }
    }
}

impl redis::FromRedisValue for PackedInts {
    fn from_redis_value_ref(value: &redis::Value) -> Result<Self, redis::ParsingError> {
        match value {
            redis::Value::BulkString(text) => Self::parse(text).map(PackedInts).ok_or_else(|| {
                format!(
                    "a script replied {:?}, expected integers separated by spaces",
                    String::from_utf8_lossy(text)
                )
                .into()
            }),
            other => {
                Err(format!("a script replied {other:?}, expected a string of integers").into())
            }
        }
    }

    fn from_redis_value(value: redis::Value) -> Result<Self, redis::ParsingError> {
        Self::from_redis_value_ref(&value)
    }
}

/// The batch script's flat reply cut into each decision's reply (2 + 5 values per check),
/// given each decision's number of checks.
pub(super) fn split_batch_reply(
    checks: impl Iterator<Item = usize> + Clone,
    flat: &[i64],
) -> Result<Vec<&[i64]>, StoreError> {
    let expected: usize = checks.clone().map(|n| 2 + 5 * n).sum();
    if flat.len() != expected {
        return Err(StoreError::Protocol(format!(
            "the batch decision replied {} values, expected {expected}",
            flat.len()
        )));
    }
    let mut rest = flat;
    Ok(checks
        .map(|n| {
            let (one, tail) = rest.split_at(2 + 5 * n);
            rest = tail;
            one
        })
        .collect())
}

/// Fields of a check's argument (see [`check_arg`]), at most: a calendar window adds its four
/// turns.
const CHECK_FIELDS: usize = 12;

/// The one script argument of a check: its fields in decimal, separated by single spaces, on
/// the stack (at most 20 digits each).
#[derive(Clone, Copy)]
pub struct CheckArg {
    len: u8,
    bytes: [u8; CHECK_FIELDS * 21],
}

impl CheckArg {
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// The script argument of one check, its fields in `decide.lua`'s order: algorithm code,
/// limit, period_us, burst, cost, shadow, lease id, block_us, and for a calendar window the
/// four turns around the proxy's clock (`calendar::turns`, from `now` when the script runs on
/// an injected clock, else from the proxy's own), among which the script picks the window
/// that holds its own time. One argument rather than eight: redis-rs builds and encodes
/// every argument on its own, so each one costs on every call.
pub fn check_arg(c: &Check<'_>, lease: u64, now: Option<Micros>) -> CheckArg {
    let p = &c.params;
    let mut fields: [u64; CHECK_FIELDS] = [
        u64::from(p.algorithm.code()),
        p.limit,
        // Validated positive.
        p.period_us.max(0) as u64,
        p.burst,
        p.cost,
        u64::from(c.shadow),
        lease,
        // block_for; validated positive when set.
        c.block_us.max(0) as u64,
        0,
        0,
        0,
        0,
    ];
    let mut count = CHECK_FIELDS - 4;
    if let Some(calendar) = &p.calendar {
        let turns =
            super::calendar::turns(calendar, now.unwrap_or_else(super::calendar::proxy_now_us));
        for (field, turn) in fields[count..].iter_mut().zip(turns) {
            // Instants after 1970 (the proxy's clock is).
            *field = turn.max(0) as u64;
        }
        count = CHECK_FIELDS;
    }
    let mut arg = CheckArg {
        len: 0,
        bytes: [0; CHECK_FIELDS * 21],
    };
    let mut len = 0;
    let mut digits = itoa::Buffer::new();
    for (i, field) in fields[..count].iter().enumerate() {
        if i > 0 {
            arg.bytes[len] = b' ';
            len += 1;
        }
        let text = digits.format(*field).as_bytes();
        arg.bytes[len..len + text.len()].copy_from_slice(text);
        len += text.len();
    }
    arg.len = len as u8;
    arg
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::FromRedisValue;

    #[test]
    fn packed_integers_read_back_exactly() {
        let read = |text: &str| PackedInts::from_redis_value(redis::Value::BulkString(text.into()));
        assert_eq!(
            read(" 1 100000 0 -1 1764061234567890 9223372036854775807 -9223372036854775808"),
            Ok(PackedInts(vec![
                1,
                100_000,
                0,
                -1,
                1_764_061_234_567_890,
                i64::MAX,
                i64::MIN
            ]))
        );
        assert_eq!(read(""), Ok(PackedInts(vec![])));
        assert_eq!(read(" 1  2"), Ok(PackedInts(vec![1, 2])));
        for bad in [
            " 1 x",
            " -",
            " 1.5",
            " 9223372036854775808",
            " -9223372036854775809",
            " 99999999999999999999",
            " --1",
            " 1e3",
        ] {
            let error = read(bad).unwrap_err().to_string();
            assert!(error.contains("expected integers"), "{bad}: {error}");
        }
        let not_a_string = PackedInts::from_redis_value(redis::Value::Int(1)).unwrap_err();
        assert!(not_a_string
            .to_string()
            .contains("expected a string of integers"));
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

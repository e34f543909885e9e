//! The Lua scripts of the Redis store and their variants: `decide.lua` (single, batch and
//! peek forms), `refresh.lua`, `settle.lua` and `release.lua`, each behind the shared
//! `prelude.lua`.
//!
//! The variants are made by switching one marked line of the source, so every form shares
//! every other line and cannot drift from the others. Pure text: running the scripts is the
//! script runner's job.

use super::StoreError;

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

#[cfg(test)]
mod tests {
    use super::*;

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

//! Calendar windows for `fixed_window` (`window: day | week | month | year` with a
//! `timezone:`): where the windows around an instant turn, as microseconds since the epoch.
//!
//! A window turns at local midnight of its first day (the day itself, the Monday of the ISO
//! week, the 1st of the month, January 1st) in its IANA time zone, so a local day may last 23
//! or 25 hours and a month 28 to 31 days (plus or minus a daylight-saving hour). When midnight
//! does not exist on that day (a zone that springs forward at midnight), the window turns at
//! the first instant of the day.
//!
//! Redis's Lua cannot evaluate time-zone rules, so the proxy computes the turns around its own
//! clock ([`turns`]: the previous, current, next and following turns) and passes them to the
//! script, which picks the window that contains Redis's own time ([`pick`]). The decision is
//! then exact on the store's clock whenever the two clocks differ by less than a window. The
//! memory store runs the same two functions on its own clock.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use super::clock::Micros;

const HOUR_US: Micros = 3_600 * 1_000_000;
const DAY_US: Micros = 24 * HOUR_US;

/// The length of a calendar window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    Day,
    /// An ISO week, Monday to Sunday.
    Week,
    Month,
    Year,
}

impl Unit {
    pub const ALL: [Unit; 4] = [Unit::Day, Unit::Week, Unit::Month, Unit::Year];

    /// As the file spells it (`window:`).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    pub fn from_name(name: &str) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.name() == name)
    }

    /// The longest such window can last (a daylight-saving hour included): the bound used
    /// wherever a limit needs one period, e.g. to check its parameters fit the Lua mirror.
    pub fn longest_us(self) -> Micros {
        let days = match self {
            Unit::Day => 1,
            Unit::Week => 7,
            Unit::Month => 31,
            Unit::Year => 366,
        };
        days * DAY_US + HOUR_US
    }

    /// The first day of the window that contains `date`.
    fn start(self, date: Date) -> Date {
        match self {
            Unit::Day => date,
            Unit::Week => date
                .checked_add(i64::from(-date.weekday().to_monday_zero_offset()).days())
                .unwrap_or(date),
            Unit::Month => date.first_of_month(),
            Unit::Year => date.first_of_year(),
        }
    }

    /// The first day `n` windows after (or before) the one starting on `start`.
    fn step(self, start: Date, n: i64) -> Option<Date> {
        let span = match self {
            Unit::Day => n.days(),
            Unit::Week => (7 * n).days(),
            Unit::Month => n.months(),
            Unit::Year => n.years(),
        };
        start.checked_add(span).ok()
    }
}

/// An IANA time zone, looked up once and kept for the life of the process, so that a
/// [`Calendar`] (and the limit parameters holding it) stays a plain `Copy` value.
#[derive(Clone, Copy)]
pub struct Zone(&'static ZoneEntry);

struct ZoneEntry {
    name: Box<str>,
    tz: TimeZone,
}

/// Every zone looked up so far: each distinct name is loaded and kept once, however many
/// times the configuration is reloaded. Only validation takes this lock, never a request.
static ZONES: Mutex<Vec<&'static ZoneEntry>> = Mutex::new(Vec::new());

impl Zone {
    /// The zone of this IANA name (from the database bundled into the binary, so it does not
    /// depend on the host's /usr/share/zoneinfo); an error message when there is none.
    pub fn get(name: &str) -> Result<Zone, String> {
        let mut zones = ZONES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = zones.iter().find(|z| &*z.name == name) {
            return Ok(Zone(entry));
        }
        let tz = TimeZone::get(name).map_err(|e| e.to_string())?;
        let entry: &'static ZoneEntry = Box::leak(Box::new(ZoneEntry {
            name: name.into(),
            tz,
        }));
        zones.push(entry);
        Ok(Zone(entry))
    }

    /// The name as configured.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    fn tz(&self) -> &TimeZone {
        &self.0.tz
    }
}

impl PartialEq for Zone {
    fn eq(&self, other: &Zone) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Zone {}

impl Hash for Zone {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Zone({})", self.name())
    }
}

/// A calendar window: its unit and the zone whose local midnight turns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Calendar {
    pub unit: Unit,
    pub zone: Zone,
}

impl Calendar {
    /// The instant local midnight starts `date`, or the first instant of that day when
    /// midnight falls in a daylight-saving gap.
    fn midnight(&self, date: Date) -> Option<Micros> {
        let ts = self.zone.tz().to_timestamp(DateTime::from(date)).ok()?;
        Some(ts.as_microsecond())
    }

    fn try_turns(&self, now: Micros) -> Option<[Micros; 4]> {
        let ts = Timestamp::from_microsecond(now).ok()?;
        let local = self.zone.tz().to_datetime(ts).date();
        let mut start = self.unit.start(local);
        // A window starts at the first instant of its first day; in a zone whose day starts
        // after a gap, an instant between midnight UTC-wise and that first instant belongs
        // to the window before.
        if self.midnight(start)? > now {
            start = self.unit.step(start, -1)?;
        }
        let mut turns = [0; 4];
        for (i, turn) in turns.iter_mut().enumerate() {
            *turn = self.midnight(self.unit.step(start, i as i64 - 1)?)?;
        }
        Some(turns)
    }
}

/// The turns around `now`, ascending: the start of the window before the current one, the
/// start of the current one (`<= now`), the start of the next one (`> now`), and the start of
/// the one after that. Far outside the years a calendar can name (±9999), the windows fall
/// back to the unit's longest length counted from the epoch.
pub fn turns(calendar: &Calendar, now: Micros) -> [Micros; 4] {
    // The turns depend only on the window that holds `now`: while `now` stays in the window
    // last computed for this calendar, the cached turns are exactly what the computation
    // gives. Per thread, so no lock; a handful of entries, for routes with several calendars.
    let id = (
        calendar.zone.0 as *const ZoneEntry as usize,
        calendar.unit as u8,
    );
    let hit = CACHE.with(|cache| {
        cache
            .get()
            .iter()
            .find(|(key, t)| *key == id && t[1] <= now && now < t[2])
            .map(|(_, t)| *t)
    });
    if let Some(turns) = hit {
        return turns;
    }
    let turns = calendar.try_turns(now).unwrap_or_else(|| {
        let len = calendar.unit.longest_us();
        let start = now.div_euclid(len) * len;
        [start - len, start, start + len, start + 2 * len]
    });
    CACHE.with(|cache| {
        let mut entries = cache.get();
        entries.rotate_right(1);
        entries[0] = (id, turns);
        cache.set(entries);
    });
    turns
}

/// A cache entry: (zone entry's address, unit) and its turns. Zone entries live for the whole
/// process, so an address names one zone for good.
type CacheEntry = ((usize, u8), [Micros; 4]);

thread_local! {
    /// The turns last computed on this thread, newest first; an empty entry has turns that
    /// contain no instant.
    static CACHE: std::cell::Cell<[CacheEntry; 4]> =
        const { std::cell::Cell::new([((0, 0), [0; 4]); 4]) };
}

/// The window `[start, end)` among `turns` (as [`turns`] returns them) that contains `now`:
/// the previous, current or next one. A `now` outside all three (clocks that disagree by more
/// than a window) gets the nearest, with an end at least 1 µs ahead so nothing reports a turn
/// in the past. `decide.lua` mirrors this.
pub fn pick(turns: &[Micros; 4], now: Micros) -> (Micros, Micros) {
    let (start, end) = if now < turns[1] {
        (turns[0], turns[1])
    } else if now < turns[2] {
        (turns[1], turns[2])
    } else {
        (turns[2], turns[3])
    };
    (start, end.max(now + 1))
}

/// The current window's `[start, end)` at `now`.
pub fn window(calendar: &Calendar, now: Micros) -> (Micros, Micros) {
    pick(&turns(calendar, now), now)
}

/// The environment variable that shifts tollgate's clocks by this many milliseconds, in debug
/// builds only: the proxy's clock for calendar turns, the memory store's clock and Redis's
/// `TIME` as the scripts read it, so a test can stand a few seconds before a window turns
/// without waiting for it. Read once, when the stores are built; release builds ignore it.
pub const TEST_CLOCK_OFFSET_ENV: &str = "TOLLGATE_TEST_CLOCK_OFFSET_MS";

/// The test clock offset in microseconds (see [`TEST_CLOCK_OFFSET_ENV`]); always 0 in release
/// builds.
pub fn test_clock_offset_us() -> Micros {
    #[cfg(debug_assertions)]
    {
        static OFFSET: std::sync::OnceLock<Micros> = std::sync::OnceLock::new();
        *OFFSET.get_or_init(|| {
            std::env::var(TEST_CLOCK_OFFSET_ENV)
                .ok()
                .and_then(|v| v.trim().parse::<i64>().ok())
                .map_or(0, |ms| ms.saturating_mul(1_000))
        })
    }
    #[cfg(not(debug_assertions))]
    {
        0
    }
}

/// The proxy's clock in microseconds since the epoch (plus the test offset, if any): where the
/// turns sent to Redis are computed from.
pub fn proxy_now_us() -> Micros {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as Micros);
    now + test_clock_offset_us()
}

/// `at` as RFC 3339 in the calendar's zone (for `check`'s summary).
pub fn local_time(calendar: &Calendar, at: Micros) -> String {
    match Timestamp::from_microsecond(at) {
        Ok(ts) => ts.to_zoned_datetime(calendar.zone.tz().clone()).to_string(),
        Err(_) => at.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cal(unit: Unit, zone: &str) -> Calendar {
        Calendar {
            unit,
            zone: Zone::get(zone).unwrap(),
        }
    }

    /// Microseconds of an RFC 3339 instant.
    fn at(text: &str) -> Micros {
        text.parse::<Timestamp>().unwrap().as_microsecond()
    }

    #[test]
    fn unknown_zones_are_refused() {
        assert!(Zone::get("Mars/Olympus_Mons").is_err());
        assert!(Zone::get("Europe/Berlin").is_ok());
        assert_eq!(Zone::get("UTC").unwrap().name(), "UTC");
    }

    #[test]
    fn month_in_new_york_across_a_month_end_and_both_dst_changes() {
        let c = cal(Unit::Month, "America/New_York");
        // March 2026: DST starts on the 8th; the month turns at EST midnight on the 1st
        // (05:00Z) and ends at EDT midnight on April 1st (04:00Z): 31 days less an hour.
        let t = turns(&c, at("2026-03-15T12:00:00Z"));
        assert_eq!(
            t,
            [
                at("2026-02-01T05:00:00Z"),
                at("2026-03-01T05:00:00Z"),
                at("2026-04-01T04:00:00Z"),
                at("2026-05-01T04:00:00Z"),
            ]
        );
        assert_eq!(t[2] - t[1], 31 * DAY_US - HOUR_US);
        // One microsecond before local midnight of April 1st is still March.
        let before = at("2026-04-01T04:00:00Z") - 1;
        assert_eq!(
            window(&c, before),
            (at("2026-03-01T05:00:00Z"), at("2026-04-01T04:00:00Z"))
        );
        // 23:30 on March 31st in New York is 03:30Z on April 1st: still March locally.
        assert_eq!(
            window(&c, at("2026-04-01T03:30:00Z")).1,
            at("2026-04-01T04:00:00Z")
        );
        assert_eq!(
            window(&c, at("2026-04-01T04:00:00Z")),
            (at("2026-04-01T04:00:00Z"), at("2026-05-01T04:00:00Z"))
        );
        // November 2026: DST ends on the 1st at 02:00 local, after the month has turned
        // (at EDT midnight); November lasts 30 days and an hour.
        let (start, end) = window(&c, at("2026-11-10T00:00:00Z"));
        assert_eq!(start, at("2026-11-01T04:00:00Z"));
        assert_eq!(end, at("2026-12-01T05:00:00Z"));
        assert_eq!(end - start, 30 * DAY_US + HOUR_US);
        // February of a leap year in New York: 29 days.
        let (start, end) = window(
            &cal(Unit::Month, "America/New_York"),
            at("2028-02-10T00:00:00Z"),
        );
        assert_eq!(end - start, 29 * DAY_US);
    }

    #[test]
    fn days_of_23_and_25_hours() {
        let c = cal(Unit::Day, "Europe/Berlin");
        // Berlin springs forward on 2026-03-29 (02:00 -> 03:00).
        let (start, end) = window(&c, at("2026-03-29T12:00:00Z"));
        assert_eq!(start, at("2026-03-28T23:00:00Z"));
        assert_eq!(end, at("2026-03-29T22:00:00Z"));
        assert_eq!(end - start, 23 * HOUR_US);
        // ... and falls back on 2026-10-25 (03:00 -> 02:00).
        let (start, end) = window(&c, at("2026-10-25T12:00:00Z"));
        assert_eq!(start, at("2026-10-24T22:00:00Z"));
        assert_eq!(end, at("2026-10-25T23:00:00Z"));
        assert_eq!(end - start, 25 * HOUR_US);
        // A plain UTC day.
        let (start, end) = window(&cal(Unit::Day, "UTC"), at("2026-05-05T23:59:59.999999Z"));
        assert_eq!(
            (start, end),
            (at("2026-05-05T00:00:00Z"), at("2026-05-06T00:00:00Z"))
        );
    }

    #[test]
    fn a_day_whose_midnight_does_not_exist_starts_after_the_gap() {
        // Santiago springs forward at 24:00 on the first Saturday of September: 2026-09-06
        // has no 00:00 and starts at 01:00 local (-03), 04:00Z.
        let c = cal(Unit::Day, "America/Santiago");
        let (start, end) = window(&c, at("2026-09-06T12:00:00Z"));
        assert_eq!(start, at("2026-09-06T04:00:00Z"));
        assert_eq!(end - start, 23 * HOUR_US);
        // The instant before the day's first belongs to the day before.
        assert_eq!(window(&c, start - 1).1, start);
    }

    #[test]
    fn weeks_start_on_monday() {
        let c = cal(Unit::Week, "Europe/Berlin");
        // Thursday 2026-11-26; the week started on Monday 2026-11-23, 00:00 CET (23:00Z).
        let (start, end) = window(&c, at("2026-11-26T12:00:00Z"));
        assert_eq!(start, at("2026-11-22T23:00:00Z"));
        assert_eq!(end, at("2026-11-29T23:00:00Z"));
        // A Sunday evening belongs to the week that started six days before.
        assert_eq!(window(&c, at("2026-11-29T22:59:59Z")).0, start);
        // A Monday just after midnight starts a new week.
        assert_eq!(window(&c, at("2026-11-29T23:00:00Z")).0, end);
        // The week of the spring DST change lasts 7 days less an hour.
        let (start, end) = window(&c, at("2026-03-27T12:00:00Z"));
        assert_eq!(end - start, 7 * DAY_US - HOUR_US);
    }

    #[test]
    fn years_and_leap_februaries() {
        let c = cal(Unit::Year, "Europe/Berlin");
        let (start, end) = window(&c, at("2028-07-01T00:00:00Z"));
        assert_eq!(start, at("2027-12-31T23:00:00Z"));
        assert_eq!(end, at("2028-12-31T23:00:00Z"));
        assert_eq!(end - start, 366 * DAY_US);
        let utc = cal(Unit::Year, "UTC");
        let (start, end) = window(&utc, at("2027-07-01T00:00:00Z"));
        assert_eq!(end - start, 365 * DAY_US);
        // February in UTC: 29 days in 2028, 28 in 2027.
        let feb = cal(Unit::Month, "UTC");
        let (start, end) = window(&feb, at("2028-02-29T23:59:59Z"));
        assert_eq!(
            (start, end),
            (at("2028-02-01T00:00:00Z"), at("2028-03-01T00:00:00Z"))
        );
        let (start, end) = window(&feb, at("2027-02-15T00:00:00Z"));
        assert_eq!(end - start, 28 * DAY_US);
    }

    #[test]
    fn pick_takes_the_window_of_the_stores_clock() {
        let t = [100, 200, 300, 400];
        assert_eq!(pick(&t, 150), (100, 200));
        assert_eq!(pick(&t, 200), (200, 300));
        assert_eq!(pick(&t, 299), (200, 300));
        assert_eq!(pick(&t, 300), (300, 400));
        // Clocks more than a window apart: the nearest window, never an end in the past.
        assert_eq!(pick(&t, 50), (100, 200));
        assert_eq!(pick(&t, 500), (300, 501));
    }

    #[test]
    fn turns_bracket_now_for_every_unit() {
        let zone = "Australia/Lord_Howe"; // a half-hour DST shift
        for unit in Unit::ALL {
            let c = cal(unit, zone);
            let mut now = at("2025-01-01T00:00:00Z");
            while now < at("2027-01-01T00:00:00Z") {
                let t = turns(&c, now);
                // The per-thread cache answers exactly what the computation gives.
                assert_eq!(Some(t), c.try_turns(now));
                assert!(
                    t[0] < t[1] && t[1] <= now && now < t[2] && t[2] < t[3],
                    "{unit:?} {now}"
                );
                assert!(t[2] - t[1] <= unit.longest_us());
                now += 7 * HOUR_US + 13;
            }
        }
    }
}

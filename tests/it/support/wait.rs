//! Waiting for an event instead of for a length of time (docs/testing.md): a test that needs
//! something to have happened (a replica saw a reset, a store reconnected, a connection was
//! parked) polls for it with a generous overall bound, so a busy machine makes it slower and
//! never red.

use std::fmt::Debug;
use std::time::{Duration, Instant};

/// The overall bound for an event that happens within milliseconds on a quiet machine: far
/// past anything a busy one takes, and still a failure (not a hang) when it never happens.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// How often `eventually` asks (not a bound: an interval).
const POLL: Duration = Duration::from_millis(10);

/// Asks `check` every 10 ms until it answers `Ok`, and returns that value; panics after
/// `bound` with `what` and the last `Err` it answered (what the test saw). `check` may keep
/// state between calls (it is an `async FnMut`):
///
/// ```ignore
/// eventually("b admits alice after the reset", PATIENCE, async || {
///     match call(&b, "alice").await {
///         StatusCode::OK => Ok(()),
///         status => Err(status),
///     }
/// })
/// .await;
/// ```
pub async fn eventually<T, E: Debug>(
    what: &str,
    bound: Duration,
    mut check: impl AsyncFnMut() -> Result<T, E>,
) -> T {
    let started = Instant::now();
    loop {
        let last = match check().await {
            Ok(value) => return value,
            Err(last) => last,
        };
        if started.elapsed() >= bound {
            panic!("{what}: not within {bound:?}; last saw {last:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `Ok(())` when `holds`, else `Err(seen)`: for checks whose answer is a condition and the
/// value that failed it, as in `eventually(.., async || until(n == 3, n))`.
pub fn until<E>(holds: bool, seen: E) -> Result<(), E> {
    if holds {
        Ok(())
    } else {
        Err(seen)
    }
}

/// The value of one series (`name` or `name{labels}`, exactly as exposed) on the admin
/// listener's `/metrics`, or `None` while it is not exposed: for waiting on a metric.
pub async fn metric(admin: std::net::SocketAddr, series: &str) -> Option<f64> {
    let url = format!("http://{admin}/metrics");
    let response = crate::support::http1_client()
        .request(crate::support::get(&url))
        .await
        .ok()?;
    let exposition = crate::support::text(response).await;
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

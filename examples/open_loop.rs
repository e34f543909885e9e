//! The open-loop load client of the overload benchmark (`bench/overload.sh`) as a command: the
//! same code as the tests' `tests/it/support/open_loop.rs` (included here with `#[path]`).
//!
//! ```text
//! cargo run --release --example open_loop -- --url http://127.0.0.1:8080 \
//!     --phase 1200:15s --phase 1200:10s --phase 200:10s --timeout 1s --settle 2s \
//!     --class high:1:X-Priority=high --class low:4 > report.json
//! ```
//!
//! Each `--phase RATE:DURATION` is a step of the schedule (requests per second). Each
//! `--class NAME:SHARE[:Header=Value...]` takes that share of the requests with those headers
//! (default: one class `all`). Prints the report as JSON (per phase, leaving out the first
//! `--settle` of each phase, and per class: sent, ok, shed, other, timeouts, failed, goodput
//! per second, latency percentiles of the successes; then the whole run and a series of
//! `--bucket` buckets), and a short summary on stderr.

#[path = "../tests/it/support/open_loop.rs"]
#[allow(dead_code)]
mod open_loop;

use std::time::Duration;

use clap::Parser;

use open_loop::OpenLoop;

#[derive(Parser)]
struct Args {
    /// Base URL of the server (`http://host:port`).
    #[arg(long)]
    url: String,
    /// Path of every request.
    #[arg(long, default_value = "/")]
    path: String,
    /// RATE:DURATION, repeatable: the schedule's steps.
    #[arg(long = "phase", required = true)]
    phases: Vec<String>,
    /// The client gives up on a request this long after its scheduled time.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// NAME:SHARE[:Header=Value...], repeatable.
    #[arg(long = "class")]
    classes: Vec<String>,
    /// The time series' bucket.
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    bucket: Duration,
    /// Left out of each phase's summary at its start.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    settle: Duration,
}

fn main() {
    let args = Args::parse();
    let mut load = OpenLoop::new(&args.url)
        .path(&args.path)
        .timeout(args.timeout)
        .bucket(args.bucket);
    for phase in &args.phases {
        let (rate, duration) = phase
            .split_once(':')
            .unwrap_or_else(|| panic!("--phase {phase}: RATE:DURATION expected"));
        load = load.rate(
            rate.parse()
                .expect("--phase: a number of requests per second"),
            humantime::parse_duration(duration).expect("--phase: a duration such as 10s"),
        );
    }
    for class in &args.classes {
        let mut parts = class.split(':');
        let name = parts.next().unwrap();
        let share: f64 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("--class {class}: NAME:SHARE[:Header=Value] expected"));
        let headers: Vec<(&str, &str)> = parts
            .map(|h| {
                h.split_once('=')
                    .unwrap_or_else(|| panic!("--class {class}: Header=Value expected"))
            })
            .collect();
        load = load.class(name, share, &headers);
    }
    let report = load.run_blocking();
    for (index, phase) in report.phases.iter().enumerate() {
        let s = report.phase(None, index, args.settle);
        eprintln!(
            "phase {index} ({} /s for {:?}): sent {} ok {} ({:.0}/s) shed {} other {} timeouts {} failed {} p50 {:?} p99 {:?}",
            phase.rate, phase.duration, s.sent, s.ok, s.goodput, s.shed, s.other, s.timeouts,
            s.failed, s.p50, s.p99
        );
    }
    println!("{}", report.to_json(args.settle));
}

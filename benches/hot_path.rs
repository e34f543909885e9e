//! Micro-benchmarks of the per-request work tollgate does before it asks the store: route
//! match, identity extraction, store-key building, and the pure algorithm step (what the memory
//! store and the Lua mirror compute). The whole-proxy numbers come from bench/run.sh; these say
//! which piece a change made faster or slower. Run: `cargo bench --bench hot_path`.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use http::request::Parts;
use http::Request;
use tollgate::config::Config;
use tollgate::limit::algorithm::{self, Algorithm, Params, State};

/// The benchmark's route table: a few routes before the one hit, as in a real file.
const CONFIG: &str = r#"
listen: 127.0.0.1:0
upstream: { url: "http://127.0.0.1:1" }
identities:
  user:
    - header: X-User-Id
  api_key:
    - bearer: {}
routes:
  - name: login
    match: { path_prefix: /login, methods: [POST] }
    limits:
      - { algorithm: sliding_log, limit: 5, period: 1m }
  - name: uploads
    match: { path_prefix: /api/uploads/, methods: [POST, PUT] }
    key: user
    limits:
      - { algorithm: concurrency, limit: 2 }
  - name: admin
    match: { path_prefix: /admin/, host: "*.example.com" }
    limits:
      - { algorithm: fixed_window, limit: 10, period: 1m }
  - name: api
    match: { path_prefix: /api/ }
    key: user
    limits:
      - { algorithm: gcra, limit: 100, period: 1s, burst: 100, name: one }
  - name: multi
    match: { path_prefix: /multi/ }
    key: user
    limits:
      - { algorithm: gcra, limit: 100, period: 1s, burst: 100, name: a }
      - { algorithm: token_bucket, limit: 1000, period: 10s, burst: 1000, name: b }
      - { algorithm: sliding_window, limit: 100000, period: 1s, key: client_ip, name: c }
"#;

fn config() -> Config {
    tollgate::config::parse(Path::new("bench.yaml"), CONFIG, |_| None).expect("bench config")
}

fn request(path: &str) -> Parts {
    Request::get(path)
        .header("host", "bench.example.com")
        .header("x-user-id", "user-4711")
        .header("accept", "*/*")
        .header("user-agent", "wrk")
        .body(())
        .unwrap()
        .into_parts()
        .0
}

const IP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn route_match(c: &mut Criterion) {
    let config = config();
    let routes = &config.throttle.routes;
    let hit = request("/api/v1/items/42");
    let miss = request("/static/app.js");
    let odd = request("/api//v1/%69tems/../items");
    c.bench_function("route match (4th route)", |b| {
        b.iter(|| tollgate::routing::position(black_box(routes), black_box(&hit)))
    });
    c.bench_function("route match (no route)", |b| {
        b.iter(|| tollgate::routing::position(black_box(routes), black_box(&miss)))
    });
    c.bench_function("route match (path to normalise)", |b| {
        b.iter(|| tollgate::routing::position(black_box(routes), black_box(&odd)))
    });
}

fn identity(c: &mut Criterion) {
    let config = config();
    let route = config
        .throttle
        .routes
        .iter()
        .find(|r| r.name == "api")
        .unwrap();
    let user = route.limits[0].key[0].clone();
    let parts = request("/api/v1/items/42");
    c.bench_function("identify (header)", |b| {
        b.iter(|| user.identify(black_box(&parts), IP))
    });
    let fallback = request("/api/v1/items/42");
    let mut no_header = fallback.clone();
    no_header.headers.remove("x-user-id");
    c.bench_function("identify (fallback to client ip)", |b| {
        b.iter(|| user.identify(black_box(&no_header), IP))
    });
}

fn key_building(c: &mut Criterion) {
    let config = config();
    let prefix = &config.throttle.key_prefix;
    let parts = request("/api/v1/items/42");
    for name in ["api", "multi"] {
        let route = config
            .throttle
            .routes
            .iter()
            .find(|r| r.name == name)
            .unwrap();
        let n = route.limits.len();
        c.bench_function(
            &format!("store keys ({n} limit{})", if n == 1 { "" } else { "s" }),
            |b| {
                b.iter(|| {
                    tollgate::throttle::keys::build(
                        black_box(prefix),
                        &route.limits,
                        &mut tollgate::identity::caller::Caller::new(black_box(&parts), IP),
                    )
                })
            },
        );
    }
}

fn algorithm_step(c: &mut Criterion) {
    let second = 1_000_000;
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        let params = Params {
            algorithm,
            limit: 100,
            period_us: second,
            burst: 100,
            cost: 1,
            calendar: None,
        };
        // A warm state: fifty requests already taken in the current period.
        let mut state: Option<State> = None;
        let mut now = 10 * second;
        for _ in 0..50 {
            let step = algorithm::step_for(&params, state.as_ref(), now, 0);
            state = Some(step.state);
            now += 1_000;
        }
        c.bench_function(&format!("algorithm step ({})", algorithm.name()), |b| {
            b.iter(|| algorithm::step_for(black_box(&params), state.as_ref(), black_box(now), 0))
        });
    }
}

criterion_group!(benches, route_match, identity, key_building, algorithm_step);
criterion_main!(benches);

//! Denial of service through tollgate's own levers, black-box, on the Redis store:
//!
//! - Malformed request framing (a chunk size of `0x0`, not hex, overflowing, a chunk
//!   extension with a bare newline) is the client's 400, never the app's 502: it is not counted
//!   as the app's 5xx and is no input to protect, so a flood of it does not cut protect's limit
//!   and ordinary requests keep being served.
//! - The admin listener is bounded like the proxy listener: silent and trickling admin
//!   connections are closed after the header read timeout, and the proxy answers while the
//!   admin listener is flooded.
//! - A lookup by short form (`/limits/state?identity=sha256:<12 hex>`) among ~90,000 callers
//!   of one route answers: the scan of the store's keys is linear.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;
use http::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How late past a configured timeout a busy machine may see it fire.
const MARGIN: Duration = Duration::from_secs(2);

/// The Redis store of these tests: no timeout is under test here, so a store call on a busy
/// machine (or a Redis busy with the lookup test's 90,000 keys) has seconds, not 50 ms.
fn redis_store(redis: &RedisServer, prefix: &str) -> Store {
    store::redis(&redis.url())
        .timeout("5s")
        .key_prefix(prefix)
        .on_error("deny")
}

/// `path` on the admin listener as JSON, with its status.
async fn admin_json(admin: SocketAddr, path: &str) -> (StatusCode, Value) {
    let (status, _, text) = exchange("GET", &format!("http://{admin}{path}"), &[]).await;
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

// ---------------------------------------------------------------------------------------------
// Malformed framing is the client's error

/// Chunked bodies hyper refuses to read, each with what is wrong with it.
const MALFORMED: [(&str, &[u8]); 4] = [
    ("a chunk size of 0x0", b"0x0\r\n\r\n"),
    ("a chunk size that is not hex", b"zz\r\nhello\r\n0\r\n\r\n"),
    (
        "a chunk extension with a bare newline",
        b"5;name=a\nb\r\nhello\r\n0\r\n\r\n",
    ),
    (
        "a chunk size that overflows",
        b"fffffffffffffffffffff\r\nhello\r\n0\r\n\r\n",
    ),
];

/// `POST /echo` with `Transfer-Encoding: chunked` and `body` as its raw framing.
fn chunked_post(body: &[u8]) -> Vec<u8> {
    let mut request = b"POST /echo HTTP/1.1\r\nHost: app.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    request.extend_from_slice(body);
    request
}

/// protect on (its limit starts at 20, the most it may be here), a Redis-limited route for
/// every path.
fn framing_config(app: &str, redis: &RedisServer) -> Config {
    config()
        .upstream(app)
        .admin("127.0.0.1:0")
        .access_log(false)
        .store(redis_store(redis, "dos-framing:"))
        .route(
            route("api")
                .prefix("/")
                .key("client_ip")
                .limit(limit::fixed_window(1_000_000, "10m")),
        )
        .raw("protect:\n  max_limit: 20\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_chunked_bodies_are_the_clients_400_and_never_cut_protect() {
    let _turn = heavy_turn().await;
    let redis = RedisServer::start();
    let app = upstream().start().await;
    let proxy = proxy(framing_config(&app.url(), &redis)).start().await;
    proxy.wait_ready().await;
    let admin = proxy.admin.unwrap();

    for (what, body) in MALFORMED {
        let answer = raw_exchange(proxy.addr, &chunked_post(body)).await;
        assert_eq!(answer.status, 400, "{what}: {}", answer.body_text());
    }
    // Four loops of malformed posts, as a flood would send them.
    let addr = proxy.addr;
    let loops: Vec<_> = (0..4)
        .map(|i| {
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for n in 0..100 {
                    let (_, body) = MALFORMED[(i + n) % MALFORMED.len()];
                    statuses.push(raw_exchange(addr, &chunked_post(body)).await.status);
                }
                statuses
            })
        })
        .collect();
    for flood in loops {
        let statuses = flood.await.unwrap();
        assert!(statuses.iter().all(|s| *s == 400), "{statuses:?}");
    }

    // None of it was the app's failure: no 5xx counted for it, no cut of protect's limit.
    let fives = metric(
        admin,
        "tollgate_upstream_responses_total{route=\"api\",status_class=\"5xx\"}",
    )
    .await;
    assert!(fives.unwrap_or(0.0) == 0.0, "5xx counted: {fives:?}");
    let (status, protect) = admin_json(admin, "/protect").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(protect["limit"].as_f64(), Some(20.0), "{protect:#}");
    assert_eq!(protect["last_cut"], Value::Null, "{protect:#}");
    assert_eq!(protect["error_share"].as_f64(), Some(0.0), "{protect:#}");

    // Ordinary requests are served, all of them.
    for _ in 0..40 {
        let (status, _, _) = exchange("GET", &proxy.url("/echo"), &[]).await;
        assert_eq!(status, StatusCode::OK);
    }
}

/// A field of a JSON log line, at its top or under `fields`.
fn log_field<'l>(line: &'l Value, name: &str) -> &'l Value {
    match &line[name] {
        Value::Null => &line["fields"][name],
        found => found,
    }
}

/// Through the binary, with JSON logs: a malformed chunked body is logged as the client's
/// refusal (`request refused`, `side` `client`, status 400), never as a request the upstream
/// failed.
#[tokio::test]
async fn malformed_framing_is_logged_as_the_clients() {
    let app = upstream().start().await;
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = write_config(
        &dir,
        &config()
            .listen(&format!("127.0.0.1:{port}"))
            .upstream(&app.url())
            .yaml(),
    );
    let child = std::process::Command::new(TOLLGATE_BIN)
        .args(["--config", file.to_str().unwrap(), "--log-format", "json"])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    eventually("tollgate listens", PATIENCE, async || {
        let up = TcpStream::connect(addr).await.is_ok();
        until(up, up)
    })
    .await;
    for (what, body) in MALFORMED {
        let answer = raw_exchange(addr, &chunked_post(body)).await;
        assert_eq!(answer.status, 400, "{what}: {}", answer.body_text());
    }
    let stderr = stop_for_stderr(child).await;
    let lines: Vec<Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let refused: Vec<&Value> = lines
        .iter()
        .filter(|l| l.to_string().contains("request refused"))
        .collect();
    assert_eq!(refused.len(), MALFORMED.len(), "{stderr}");
    for line in refused {
        assert_eq!(log_field(line, "side"), "client", "{line}");
        assert_eq!(log_field(line, "status"), 400, "{line}");
    }
    assert!(!stderr.contains("request failed"), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// The admin listener under a flood of silent and trickling connections

/// Reads until the peer closes; panics if it is still open after `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> Vec<u8> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => panic!(
                "connection still open after {within:?} (read so far: {:?})",
                String::from_utf8_lossy(&all)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => return all,
            Ok(Ok(n)) => all.extend_from_slice(&buf[..n]),
        }
    }
}

/// 300 silent and 300 trickling admin connections (more than the admin listener's default
/// cap of 128): the proxy answers throughout, a silent admin connection is closed once the
/// header read timeout (the top-level one, which the admin listener takes unless
/// `admin.header_read_timeout` says otherwise) has passed, and once the flood is cut the admin
/// listener answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_admin_listener_cuts_silent_peers_and_the_proxy_serves_on() {
    let _turn = heavy_turn().await;
    let app = upstream().start().await;
    let proxy = proxy(
        config()
            .upstream(&app.url())
            .admin("127.0.0.1:0")
            .access_log(false)
            .header_read_timeout("1s")
            .idle_timeout("2s"),
    )
    .start()
    .await;
    let admin = proxy.admin.unwrap();
    // One silent connection before the flood: it holds a slot, and must lose it.
    let mut first = TcpStream::connect(admin).await.unwrap();
    let opened = Instant::now();

    let mut attackers = Vec::new();
    for i in 0..600 {
        attackers.push(tokio::spawn(async move {
            let Ok(mut s) = TcpStream::connect(admin).await else {
                return;
            };
            if i % 2 == 1 {
                if s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                    .await
                    .is_err()
                {
                    return;
                }
                // The scenario: a head trickled a byte at a time, never finished.
                for _ in 0..100 {
                    if s.write_all(b"a").await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            let mut buf = [0u8; 64];
            let _ = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await;
        }));
    }

    // The proxy listener answers while the admin listener is flooded, and the first silent
    // connection is cut meanwhile.
    let served = async {
        for _ in 0..10 {
            let (status, _, _) = exchange("GET", &proxy.url("/echo"), &[]).await;
            assert_eq!(status, StatusCode::OK);
        }
    };
    let cut = async {
        let read = closed_within(&mut first, PATIENCE).await;
        (opened.elapsed(), read)
    };
    let ((), (cut_after, read)) = tokio::join!(served, cut);
    assert!(read.is_empty(), "{:?}", String::from_utf8_lossy(&read));
    // timeout under test: header_read_timeout 1s (the admin listener's by default)
    assert!(
        cut_after <= Duration::from_secs(1) + MARGIN,
        "a silent admin connection was cut after {cut_after:?}"
    );

    // As the timeouts cut the flood, the admin listener answers again.
    eventually("the admin listener answers", PATIENCE, async || {
        let answered = tokio::time::timeout(Duration::from_secs(2), async {
            exchange("GET", &format!("http://{admin}/healthz"), &[])
                .await
                .0
        })
        .await;
        until(answered == Ok(StatusCode::OK), answered)
    })
    .await;
    for attacker in attackers {
        attacker.abort();
    }
}

/// The binary allowed 200 descriptors, and 190 admin connections that never speak (more than
/// it has descriptors left): the admin listener takes at most its cap (`admin.max_connections`,
/// 128 by default) and the proxy listener answers 5 of 5 meanwhile. The timeouts are long here
/// (60 s), so that the cap alone is what keeps the proxy serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_admin_connections_cannot_take_the_proxys_descriptors() {
    let _turn = heavy_turn().await;
    let app = upstream().start().await;
    let served = serve_with_descriptors(
        &config()
            .upstream(&app.url())
            .access_log(false)
            .header_read_timeout("60s")
            .idle_timeout("60s"),
        Some(200),
    )
    .await;
    let before = served.open_descriptors();
    let mut silent = Vec::new();
    // More than the descriptors left, fewer than the cap plus the kernel's backlog (128):
    // past that, connecting would wait on SYN retries.
    for _ in 0..190 {
        silent.push(TcpStream::connect(served.admin).await.unwrap());
    }
    // The admin listener has taken most of what it will take (its cap is 128).
    eventually(
        "the admin listener accepted its share",
        PATIENCE,
        async || {
            let open = served.open_descriptors();
            until(open >= before + 100, open)
        },
    )
    .await;
    for i in 0..5 {
        let answered = tokio::time::timeout(
            Duration::from_secs(10),
            exchange("GET", &served.url("/echo"), &[]),
        )
        .await;
        assert!(
            matches!(answered, Ok((StatusCode::OK, _, _))),
            "request {i} of 5 with the admin listener flooded: {:?} ({} descriptors open)",
            answered.map(|a| a.0),
            served.open_descriptors()
        );
    }
    assert!(
        served.open_descriptors() < 200,
        "{} descriptors open",
        served.open_descriptors()
    );
    drop(silent);
}

// ---------------------------------------------------------------------------------------------
// Admin lookups by short form among many callers

/// The short form of `initech` (the first 6 bytes of its SHA-256).
const INITECH_SHORT: &str = "sha256:4cdc1a4207f4";
const CALLERS: usize = 90_000;

/// `initech` and 90,000 other callers of `r1` in Redis (their keys copied from the real
/// one's, so each has the shape tollgate wrote): `/limits/state` by `initech`'s short form
/// answers with its state, well within the lookup's bound, and so does the console's caller
/// search. A duplicate check by a linear
/// search per key made this lookup quadratic: minutes at this size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_form_lookup_among_many_callers_answers() {
    let _turn = heavy_turn().await;
    let redis = RedisServer::start();
    let app = upstream().start().await;
    let proxy = proxy(
        config()
            .upstream(&app.url())
            .admin("127.0.0.1:0")
            .access_log(false)
            .store(redis_store(&redis, "dos-lookup:"))
            .identity("user", [source::header("x-user")])
            .route(
                route("r1")
                    .prefix("/")
                    .key("user")
                    .limit(limit::fixed_window(3, "10m")),
            ),
    )
    .start()
    .await;
    proxy.wait_ready().await;
    let admin = proxy.admin.unwrap();
    let (status, _, _) = exchange("GET", &proxy.url("/echo"), &[("x-user", "initech")]).await;
    assert_eq!(status, StatusCode::OK);

    let mut conn = redis.client().await;
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("dos-lookup:*initech*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let dumped: Vec<u8> = ::redis::cmd("DUMP")
        .arg(&keys[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    for batch in (0..CALLERS).collect::<Vec<_>>().chunks(10_000) {
        let mut pipe = ::redis::pipe();
        for n in batch {
            let key = keys[0].replace("initech", &format!("caller-{n:06}"));
            pipe.cmd("RESTORE")
                .arg(key)
                .arg(600_000)
                .arg(&dumped)
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
    }

    let path = format!("/limits/state?route=r1&identity={INITECH_SHORT}");
    let answered = tokio::time::timeout(Duration::from_secs(30), admin_json(admin, &path))
        .await
        .expect("the lookup answered within 30 s");
    let (status, state) = answered;
    assert_eq!(status, StatusCode::OK, "{state:#}");
    assert_eq!(state["identity"], "initech", "{state:#}");

    // The console's caller search finds it the same way.
    let path = format!("/console/api/caller?identity={INITECH_SHORT}");
    let answered = tokio::time::timeout(Duration::from_secs(30), admin_json(admin, &path))
        .await
        .expect("the console's search answered within 30 s");
    let (status, caller) = answered;
    assert_eq!(status, StatusCode::OK, "{caller:#}");
    let r1 = &caller["routes"][0];
    assert_eq!(r1["route"], "r1", "{caller:#}");
    assert_eq!(r1["state"]["identity"], "initech", "{caller:#}");
}

// ---------------------------------------------------------------------------------------------
// Top offenders under a flood of one-off decoys

/// `path` from `client` (through the test's trusted proxy) as `user`: the status.
async fn as_client(proxy: SocketAddr, client: &str, user: &str) -> StatusCode {
    let (status, _, _) = exchange(
        "GET",
        &format!("http://{proxy}/item"),
        &[("x-user", user), ("x-forwarded-for", client)],
    )
    .await;
    status
}

/// An abuser refused 30 times from 198.51.100.7, and 1,500 decoys from 203.0.113.0/24 each
/// refused once (one admitted request, one refused): `/limits/top` lists, beside the route's
/// callers, its client networks, where the decoys are one network counted whole and the
/// abuser's network has its own 30, both exactly (two networks are far below the sketch's
/// capacity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_off_decoys_from_one_network_show_as_that_network_beside_the_abuser() {
    let _turn = heavy_turn().await;
    const DECOYS: usize = 1_500;
    let redis = RedisServer::start();
    let app = upstream().start().await;
    let proxy = proxy(
        config()
            .upstream(&app.url())
            .admin("127.0.0.1:0")
            .access_log(false)
            .store(redis_store(&redis, "dos-top:"))
            .trusted_proxies(["127.0.0.1/32"])
            .identity("user", [source::header("x-user")])
            .route(
                route("api")
                    .prefix("/")
                    .key("user")
                    .limit(limit::fixed_window(1, "10m")),
            ),
    )
    .start()
    .await;
    proxy.wait_ready().await;
    let (addr, admin) = (proxy.addr, proxy.admin.unwrap());

    assert_eq!(
        as_client(addr, "198.51.100.7", "mallory").await,
        StatusCode::OK
    );
    let abuser = tokio::spawn(async move {
        for _ in 0..30 {
            assert_eq!(
                as_client(addr, "198.51.100.7", "mallory").await,
                StatusCode::TOO_MANY_REQUESTS
            );
        }
    });
    let lanes: Vec<_> = (0..8)
        .map(|lane| {
            tokio::spawn(async move {
                for n in (lane..DECOYS).step_by(8) {
                    let (client, user) =
                        (format!("203.0.113.{}", n % 250 + 1), format!("decoy-{n}"));
                    assert_eq!(as_client(addr, &client, &user).await, StatusCode::OK);
                    assert_eq!(
                        as_client(addr, &client, &user).await,
                        StatusCode::TOO_MANY_REQUESTS
                    );
                }
            })
        })
        .collect();
    abuser.await.unwrap();
    for lane in lanes {
        lane.await.unwrap();
    }

    let (status, top) = admin_json(admin, "/limits/top?k=10").await;
    assert_eq!(status, StatusCode::OK, "{top:#}");
    let api = top["routes"]
        .as_array()
        .and_then(|routes| routes.iter().find(|r| r["route"] == "api"))
        .unwrap_or_else(|| panic!("no route api in {top:#}"));
    let networks: Vec<(String, u64, u64)> = api["networks"]
        .as_array()
        .unwrap_or_else(|| panic!("no networks in {api:#}"))
        .iter()
        .map(|n| {
            (
                n["network"].as_str().unwrap().to_owned(),
                n["count"].as_u64().unwrap(),
                n["error"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        networks,
        [
            ("203.0.113.0/24".to_owned(), DECOYS as u64, 0),
            ("198.51.100.0/24".to_owned(), 30, 0),
        ],
        "{api:#}"
    );
}

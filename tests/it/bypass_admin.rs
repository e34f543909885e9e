//! Issue 38, black-box: the admin listener answers only for its own host names (DNS
//! rebinding), and a flood of new client addresses cannot lock callers out of the usage
//! endpoint.
//!
//! - Every admin request, read or change, naming a host other than an IP address, `localhost`
//!   or a name in `admin.hosts` is answered 421 and reads nothing; the addresses probes and
//!   scrapers use (a pod's IP, the listener's own address, a port-forward's `localhost`)
//!   and the listed names are answered.
//! - `/_quota` keeps its own rate in a bounded table: a flood with a new address (through a
//!   trusted proxy's `X-Forwarded-For`) per request, past the table's size, never refuses a
//!   caller it has not seen, a caller limited before the flood stays limited, and a flood from
//!   one network is limited as that network. On the memory store and on Redis.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use crate::support::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An admin listener on 127.0.0.1:0 with `admin.hosts`, a route `api` keyed by `x-user`
/// (2 a minute) and the overload protection (so `/protect` answers).
fn admin_config(upstream: &str) -> Config {
    config()
        .upstream(upstream)
        .without_admin()
        .raw("admin:\n  address: 127.0.0.1:0\n  hosts: [tollgate-admin.internal, \"*.monitoring.svc\", \"pinned.example:9901\"]\n")
        .raw("protect: {}\n")
        .identity("user", [source::header("x-user")])
        .route(
            route("api")
                .prefix("/")
                .key("user")
                .limit(limit::fixed_window(2, "1m")),
        )
}

/// `method path` to `addr` with `host` as the Host line (none: an HTTP/1.0 request without
/// one), and `extra` header lines.
async fn admin(
    addr: SocketAddr,
    method: &str,
    path: &str,
    host: Option<&str>,
    extra: &str,
) -> RawResponse {
    let request = match host {
        Some(host) => format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
        ),
        None => format!("{method} {path} HTTP/1.0\r\n{extra}\r\n"),
    };
    raw_exchange(addr, request.as_bytes()).await
}

/// Every endpoint the admin listener answers, reads and changes.
const ENDPOINTS: [(&str, &str); 14] = [
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/limits/top"),
    ("GET", "/limits/top?scope=local"),
    ("GET", "/limits/state?route=api&identity=alice"),
    ("GET", "/limits/audit"),
    ("GET", "/protect"),
    ("GET", "/console"),
    ("GET", "/console/api/overview"),
    ("GET", "/console/api/caller?identity=alice"),
    ("GET", "/console/api/protect"),
    ("GET", "/limits/explain?url=/x"),
    ("POST", "/limits/reset?route=api&identity=alice"),
];

/// A page on another site rebound to the listener's address names its own host: every
/// endpoint answers 421 with the reason, and nothing of the state is in the answer.
#[tokio::test]
async fn admin_requests_for_another_host_are_refused() {
    let up = upstream().start().await;
    let proxy = proxy(admin_config(&up.url())).start().await;
    let addr = proxy.admin.unwrap();
    let port = addr.port();
    for (method, path) in ENDPOINTS {
        for host in [
            "rebind.evil.example".to_owned(),
            format!("rebind.evil.example:{port}"),
            format!("REBIND.evil.example.:{port}"),
            // Not the listed names: the domain itself, a name that ends like one, a port
            // other than the one pinned.
            "monitoring.svc".to_owned(),
            "tollgate-admin.internal.evil.example".to_owned(),
            "pinned.example:9902".to_owned(),
            "localhost.evil.example".to_owned(),
            format!("127.0.0.1.nip.io:{port}"),
            // Not a port.
            "127.0.0.1:abc".to_owned(),
        ] {
            let answer = admin(addr, method, path, Some(&host), "").await;
            let what = format!("{method} {path} with Host {host}");
            assert_eq!(answer.status, 421, "{what}: {}", answer.body_text());
            assert_eq!(
                answer.header("content-type"),
                Some("application/json"),
                "{what}"
            );
            let body: Value = serde_json::from_slice(&answer.body).unwrap();
            let error = body["error"].as_str().unwrap();
            assert!(
                error.starts_with(
                    "misdirected request: this admin listener does not answer for Host `"
                ) && error.contains("admin.hosts"),
                "{what}: {error}"
            );
            assert_eq!(body.as_object().unwrap().len(), 1, "{what}: {body}");
        }
    }
    // Two Host lines, one of them the listener's own: refused too.
    let answer = admin(
        addr,
        "GET",
        "/metrics",
        Some(&addr.to_string()),
        "Host: rebind.evil.example\r\n",
    )
    .await;
    assert_ne!(answer.status, 200, "{}", answer.body_text());
}

/// What probes, scrapers, port forwards, the console and listed names send is answered.
#[tokio::test]
async fn admin_requests_by_address_localhost_or_a_listed_name_are_answered() {
    let up = upstream().start().await;
    let proxy = proxy(admin_config(&up.url())).start().await;
    let addr = proxy.admin.unwrap();
    let port = addr.port();
    let hosts = [
        // The listener's own address, as bound.
        addr.to_string(),
        // A pod's IP on a listener bound to 0.0.0.0 (Kubernetes probes, Prometheus).
        format!("10.42.0.17:{port}"),
        "10.42.0.17".to_owned(),
        format!("[fd00::17]:{port}"),
        // Loopback names, with the port or through a port forward (another port).
        format!("localhost:{port}"),
        "localhost:19901".to_owned(),
        format!("[::1]:{port}"),
        // admin.hosts: a name (any port), a wildcard, a pinned port.
        format!("tollgate-admin.internal:{port}"),
        "TOLLGATE-ADMIN.internal.".to_owned(),
        "tollgate.monitoring.svc".to_owned(),
        "pinned.example:9901".to_owned(),
    ];
    for (method, path) in ENDPOINTS {
        for host in &hosts {
            let answer = admin(addr, method, path, Some(host), "").await;
            assert_eq!(
                answer.status,
                200,
                "{method} {path} with Host {host}: {}",
                answer.body_text()
            );
        }
        // HTTP/1.0 without Host: not a browser.
        let answer = admin(addr, method, path, None, "").await;
        assert_eq!(answer.status, 200, "{method} {path} without Host");
    }
    // The console's own mutation, from its own origin.
    let own = format!("http://localhost:{port}");
    let answer = admin(
        addr,
        "POST",
        "/limits/reset?route=api&identity=alice",
        Some(&format!("localhost:{port}")),
        &format!("Origin: {own}\r\n"),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body_text());
}

// ---------------------------------------------------------------------------------------
// The usage endpoint under a flood of new addresses.

/// How many entries the usage endpoint's own table holds (src/usage.rs, `OWN_ENTRIES`).
const TABLE: usize = 65_536;
/// Requests one client address may make to `/_quota` per window.
const OWN_LIMIT: usize = 10;
/// Requests one network (IPv4 /24, IPv6 /48) may make per window.
const NETWORK_LIMIT: usize = 160;

/// `/_quota` behind a trusted proxy (the test, on 127.0.0.1): the client is the address in
/// `X-Forwarded-For`. One route, whose allow-list holds the flood's networks (10.0.0.0/7) so
/// that a flood request's answer reads nothing from the store: the flood then runs as fast as
/// the endpoint's own table, filling it within one window. Everyone else's answer is read
/// from `store`.
fn usage_config(upstream: &str, store: Store) -> Config {
    config()
        .upstream(upstream)
        .store(store)
        .trusted_proxies(["127.0.0.1/32"])
        .route(
            route("api")
                .prefix("/")
                .allow(allow().client_ips(["10.0.0.0/7"]))
                .limit(limit::fixed_window(100, "1m")),
        )
        .set("usage", json!({ "path": "/_quota" }))
}

/// The most requests a client limited to `limit` per 10 s window can be answered in `elapsed`:
/// one full window per window started.
fn per_windows(limit: usize, elapsed: Duration) -> usize {
    limit * (elapsed.as_secs() as usize / 10 + 1)
}

fn redis_store(redis: &RedisServer) -> Store {
    store::redis(&redis.url())
        .timeout("2s")
        .key_prefix("bypass:")
        .on_error("deny")
}

/// `GET /_quota` for each client in `clients`, pipelined on `connections` connections: the
/// statuses, in the order of `clients`.
async fn quota_for(addr: SocketAddr, clients: &[String], connections: usize) -> Vec<u16> {
    let per = clients.len().div_ceil(connections).max(1);
    let mut tasks = Vec::new();
    for (part, chunk) in clients.chunks(per).enumerate() {
        let chunk = chunk.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let mut statuses = Vec::with_capacity(chunk.len());
            let mut buf = Vec::new();
            for batch in chunk.chunks(200) {
                let mut out = Vec::new();
                for client in batch {
                    out.extend_from_slice(
                        format!("GET /_quota HTTP/1.1\r\nHost: app.example\r\nX-Forwarded-For: {client}\r\n\r\n")
                            .as_bytes(),
                    );
                }
                stream.write_all(&out).await.unwrap();
                for _ in batch {
                    statuses.push(read_response(&mut stream, &mut buf).await);
                }
            }
            (part, statuses)
        }));
    }
    let mut parts = Vec::new();
    for task in tasks {
        parts.push(task.await.unwrap());
    }
    parts.sort_by_key(|(part, _)| *part);
    parts
        .into_iter()
        .flat_map(|(_, statuses)| statuses)
        .collect()
}

/// Reads one response (head and Content-Length body) from `stream`, `buf` holding what was
/// read past the previous one; its status.
async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> u16 {
    let mut chunk = [0u8; 65536];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .expect("a Content-Length");
            if buf.len() >= end + 4 + length {
                let status = head[9..12].parse().unwrap();
                buf.drain(..end + 4 + length);
                return status;
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut chunk))
            .await
            .expect("a response within 30 s")
            .unwrap();
        assert!(n > 0, "the connection closed");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// One `GET /_quota` for `client`: its status.
async fn quota(addr: SocketAddr, client: &str) -> u16 {
    quota_for(addr, &[client.to_owned()], 1).await[0]
}

/// A caller limited before the flood; a flood of 70,000 requests (more than the table holds),
/// each from an address in a network of its own (10.0.0.1, 10.0.1.1, ... past 10.255.255.1
/// into 11/8), with the limited caller trying again every 100th; then callers never seen:
/// each answered 200, every flood request answered, and the limited caller never answered
/// more than its limit per window.
async fn a_flood_of_new_addresses_never_locks_out_a_newcomer(store: Store) {
    let _turn = heavy_turn().await;
    let up = upstream().start().await;
    let served = serve(&usage_config(&up.url(), store)).await;
    let limited = "198.51.100.7".to_owned();
    let started = std::time::Instant::now();
    let statuses = quota_for(served.addr, &vec![limited.clone(); OWN_LIMIT + 1], 1).await;
    assert_eq!(statuses[..OWN_LIMIT], [200; OWN_LIMIT]);
    assert_eq!(
        statuses[OWN_LIMIT], 429,
        "the limited caller, before the flood"
    );

    let mut flood = Vec::new();
    for i in 0..70_000u32 {
        if i % 100 == 0 {
            flood.push(limited.clone());
        }
        flood.push(Ipv4Addr::from((10 << 24) + (i << 8) + 1).to_string());
    }
    let statuses = quota_for(served.addr, &flood, 8).await;
    let elapsed = started.elapsed();
    let (mut refused, mut limited_answered) = (Vec::new(), 0);
    for (client, status) in flood.iter().zip(&statuses) {
        if *client == limited {
            limited_answered += usize::from(*status == 200);
        } else if *status != 200 {
            refused.push(client);
        }
    }
    assert_eq!(
        refused.len(),
        0,
        "every flood request is a caller not seen before ({elapsed:?}); first refused: {:?}",
        refused.first()
    );
    assert!(
        limited_answered + OWN_LIMIT <= per_windows(OWN_LIMIT, elapsed),
        "the limited caller was answered {limited_answered} times during the flood ({elapsed:?}): forgotten"
    );

    for newcomer in ["192.0.2.10", "203.0.113.77", "2001:db8:77::1"] {
        assert_eq!(
            quota(served.addr, newcomer).await,
            200,
            "{newcomer}, after the flood"
        );
    }
    assert_eq!(up.request_count(), 0, "/_quota is never forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_new_addresses_never_locks_out_a_newcomer_in_memory() {
    a_flood_of_new_addresses_never_locks_out_a_newcomer(store::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_new_addresses_never_locks_out_a_newcomer_in_redis() {
    let redis = RedisServer::start();
    a_flood_of_new_addresses_never_locks_out_a_newcomer(redis_store(&redis)).await;
}

/// The flood: every /64 of one IPv6 /48 once (65,536 addresses, the table's size).
/// The /48 is limited as one network; callers elsewhere are answered.
async fn a_flood_from_one_network_is_limited_as_that_network(store: Store) {
    let _turn = heavy_turn().await;
    let up = upstream().start().await;
    let served = serve(&usage_config(&up.url(), store)).await;
    let flood: Vec<String> = (0..TABLE as u128)
        .map(|i| Ipv6Addr::from((0x2001_0db8_0bad_u128 << 80) | (i << 64) | 1).to_string())
        .collect();
    let started = std::time::Instant::now();
    let statuses = quota_for(served.addr, &flood, 8).await;
    let elapsed = started.elapsed();
    let answered = statuses.iter().filter(|&&s| s == 200).count();
    assert!(
        (NETWORK_LIMIT..=per_windows(NETWORK_LIMIT, elapsed)).contains(&answered),
        "the /48 answered {answered} times in {elapsed:?}, not as one network"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 429).count(),
        flood.len() - answered
    );
    for newcomer in ["2001:db8:beef::1", "192.0.2.10"] {
        assert_eq!(
            quota(served.addr, newcomer).await,
            200,
            "{newcomer}, after the flood"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_network_is_limited_as_that_network_in_memory() {
    a_flood_from_one_network_is_limited_as_that_network(store::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_network_is_limited_as_that_network_in_redis() {
    let redis = RedisServer::start();
    a_flood_from_one_network_is_limited_as_that_network(redis_store(&redis)).await;
}

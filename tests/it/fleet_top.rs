//! `/limits/top` over the fleet: replicas on one Redis (two `tollgate` processes on a server;
//! in-process proxies on a Cluster and Sentinel) each publish their top list, and every
//! replica's `/limits/top` merges them, saying per caller how many replicas denied it;
//! `?scope=local` is one replica's own view; a memory store, or a Redis that does not answer,
//! gets the local view saying why.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};
use serde_json::{json, Value};

/// The route `api` on every path, keyed by the `x-user` header: one request per caller and
/// hour, so every later request of that caller is a denial.
fn api_config(up: &Upstream, store: Option<Store>) -> Config {
    let api = route("api")
        .prefix("/")
        .key("user")
        .limit(limit::fixed_window(1, "1h").name("per-user"));
    let config = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .identity("user", [source::header("x-user")])
        .route(api);
    match store {
        Some(store) => config.store(store),
        None => config,
    }
}

async fn start(yaml: impl Into<String>) -> ProxyHandle {
    let proxy = proxy(yaml).start().await;
    proxy.wait_store().await;
    proxy
}

/// A replica's proxy and admin addresses: an in-process proxy or a `tollgate` process.
#[derive(Clone, Copy)]
struct Replica {
    addr: SocketAddr,
    admin: SocketAddr,
}

impl From<&ProxyHandle> for Replica {
    fn from(proxy: &ProxyHandle) -> Replica {
        Replica {
            addr: proxy.addr,
            admin: proxy.admin.expect("admin listener"),
        }
    }
}

impl From<&Replica> for Replica {
    fn from(replica: &Replica) -> Replica {
        *replica
    }
}

/// A `tollgate` process, killed on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `tollgate --config` with `config` on free ports, once it answers.
async fn spawn(dir: &tempfile::TempDir, name: &str, config: &Config) -> (Process, Replica) {
    let (port, admin) = (free_port(), free_port());
    let file = dir.path().join(format!("{name}.yaml"));
    let yaml = config
        .clone()
        .listen(&format!("127.0.0.1:{port}"))
        .admin(&format!("127.0.0.1:{admin}"))
        .yaml();
    std::fs::write(&file, yaml).unwrap();
    let process = Process(
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("--config")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tollgate"),
    );
    let replica = Replica {
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        admin: format!("127.0.0.1:{admin}").parse().unwrap(),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ready = Request::get(format!("http://{}/readyz", replica.admin))
            .body(body(""))
            .unwrap();
        if let Ok(response) = http1_client().request(ready).await {
            if response.status() == StatusCode::OK {
                break;
            }
        }
        assert!(Instant::now() < deadline, "{name} never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (process, replica)
}

async fn call(proxy: impl Into<Replica>, user: &str) -> StatusCode {
    let request = Request::get(format!("http://{}/api/x", proxy.into().addr))
        .header("x-user", user)
        .body(body(""))
        .unwrap();
    http1_client().request(request).await.unwrap().status()
}

/// `user`'s first request on `first` (admitted), then `denials` denied ones, each on the
/// replica given in turn.
async fn deny(user: &str, first: impl Into<Replica>, on: &[(Replica, usize)]) {
    assert_eq!(call(first, user).await, StatusCode::OK, "{user}");
    for (proxy, denials) in on {
        for _ in 0..*denials {
            assert_eq!(
                call(*proxy, user).await,
                StatusCode::TOO_MANY_REQUESTS,
                "{user}"
            );
        }
    }
}

async fn admin(proxy: impl Into<Replica>, path_and_query: &str) -> (StatusCode, String) {
    let admin = proxy.into().admin;
    let request = Request::get(format!("http://{admin}{path_and_query}"))
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let status = response.status();
    (status, text(response).await)
}

async fn admin_json(proxy: impl Into<Replica>, path_and_query: &str) -> (StatusCode, Value) {
    let (status, text) = admin(proxy, path_and_query).await;
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, value)
}

/// (identity, count, replicas) per caller listed for route `api`.
fn listed(top: &Value) -> Vec<(String, u64, u64)> {
    let Some(api) = top["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["route"] == "api")
    else {
        return Vec::new();
    };
    api["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["error"], 0, "{c}");
            (
                c["identity"].as_str().unwrap().to_owned(),
                c["count"].as_u64().unwrap(),
                c["replicas"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn owned(list: &[(&str, u64, u64)]) -> Vec<(String, u64, u64)> {
    list.iter()
        .map(|(i, c, r)| (i.to_string(), *c, *r))
        .collect()
}

/// Asks `path` until it lists `expected` for route `api` (the other replica publishes once a
/// second), and returns the answer.
async fn until_listed(
    proxy: impl Into<Replica>,
    path: &str,
    expected: &[(&str, u64, u64)],
) -> Value {
    let proxy = proxy.into();
    let started = Instant::now();
    loop {
        let (status, top) = admin_json(proxy, path).await;
        assert_eq!(status, StatusCode::OK, "{top}");
        if listed(&top) == owned(expected) {
            return top;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{path} never listed {expected:?}: {top}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// alice denied 5 times on `a`, bob 3 times on `b`, carol 2 times on `a` and 4 on `b`: both
/// replicas list all three with their fleet counts, carol seen by 2 replicas.
async fn both_replicas_see_the_fleet(a: Replica, b: Replica) {
    deny("alice", a, &[(a, 5)]).await;
    deny("bob", b, &[(b, 3)]).await;
    deny("carol", a, &[(a, 2), (b, 4)]).await;
    let fleet = [("carol", 6, 2), ("alice", 5, 1), ("bob", 3, 1)];
    for proxy in [a, b] {
        let top = until_listed(proxy, "/limits/top", &fleet).await;
        assert_eq!(top["scope"], "fleet", "{top}");
        assert_eq!(top["replicas"], 2, "{top}");
        assert!(top.get("reason").is_none(), "{top}");
        assert_eq!(top["window_seconds"], 60);
    }
    // This replica alone, as before.
    let (status, local) = admin_json(a, "/limits/top?scope=local").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed(&local), owned(&[("alice", 5, 1), ("carol", 2, 1)]));
    assert_eq!(local["scope"], "local", "{local}");
    assert!(local.get("reason").is_none(), "{local}");
    let (_, local) = admin_json(b, "/limits/top?scope=local").await;
    assert_eq!(listed(&local), owned(&[("carol", 4, 1), ("bob", 3, 1)]));
}

/// Two `tollgate` processes on one Redis.
#[tokio::test]
async fn two_replicas_on_one_redis_list_the_whole_fleet() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let store = store::redis(&redis.url())
        .key_prefix("fleet:")
        .timeout("500ms")
        .on_error("deny");
    let config = api_config(&up, Some(store));
    let dir = tempfile::TempDir::new().unwrap();
    let (_one, a) = spawn(&dir, "one", &config).await;
    let (_two, b) = spawn(&dir, "two", &config).await;
    both_replicas_see_the_fleet(a, b).await;

    // `k` and `scope=fleet` by name.
    let (_, top) = admin_json(&b, "/limits/top?k=1&scope=fleet").await;
    assert_eq!(listed(&top), owned(&[("carol", 6, 2)]));
    // The text form says which view and how many replicas saw each caller.
    let (status, text) = admin(&a, "/limits/top?format=text").await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("the fleet (2 replicas reporting)"), "{text}");
    let carol = text
        .lines()
        .find(|l| l.contains("carol (header)"))
        .expect(&text);
    assert!(
        carol.contains(" 6 ") && carol.ends_with("2 replicas"),
        "{text}"
    );
    let alice = text
        .lines()
        .find(|l| l.contains("alice (header)"))
        .expect(&text);
    assert!(alice.ends_with("1 replica"), "{text}");
    let (_, text) = admin(&a, "/limits/top?format=text&scope=local").await;
    assert!(text.contains("this replica only"), "{text}");
    assert!(!text.contains("bob"), "{text}");

    // What Redis holds: a registry of the two replicas and each one's list, one hash tag,
    // everything expiring.
    let mut conn = redis.client().await;
    let replicas: Vec<String> = ::redis::cmd("ZRANGE")
        .arg("fleet:{offenders}")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(replicas.len(), 2);
    let ttl = |key: String| {
        let mut conn = conn.clone();
        async move {
            let ttl: i64 = ::redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            ttl
        }
    };
    let registry = ttl("fleet:{offenders}".to_owned()).await;
    assert!(registry > 100_000 && registry <= 120_000, "{registry}");
    for id in replicas {
        let list = ttl(format!("fleet:{{offenders}}.{id}")).await;
        assert!(list > 0 && list <= 10_000, "{id}: {list}");
    }

    // A scope other than the two is refused, naming them.
    let (status, answer) = admin_json(&a, "/limits/top?scope=bogus").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer,
        json!({ "error": "scope must be `fleet` or `local`" })
    );
    let (status, answer) = admin_json(&a, "/limits/top?scope=local&region=eu").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer,
        json!({ "error": "unknown query parameter `region`: /limits/top takes k, format, scope" })
    );
}

#[tokio::test]
async fn a_memory_store_shows_this_replica_and_says_so() {
    let up = upstream().start().await;
    let proxy = start(api_config(&up, None)).await;
    deny("alice", &proxy, &[((&proxy).into(), 2)]).await;
    for path in ["/limits/top", "/limits/top?scope=fleet"] {
        let (status, top) = admin_json(&proxy, path).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(listed(&top), owned(&[("alice", 2, 1)]), "{path}");
        assert_eq!(top["scope"], "local", "{path}: {top}");
        assert_eq!(
            top["reason"], "memory store: each replica counts its own denials",
            "{path}: {top}"
        );
        assert_eq!(top["replicas"], 1);
    }
    let (_, top) = admin_json(&proxy, "/limits/top?scope=local").await;
    assert_eq!(top["scope"], "local");
    assert!(top.get("reason").is_none(), "{top}");
    let (_, text) = admin(&proxy, "/limits/top?format=text").await;
    assert!(
        text.contains("this replica only (memory store: each replica counts its own denials)"),
        "{text}"
    );
}

#[tokio::test]
async fn with_redis_down_the_fleet_view_answers_with_this_replica() {
    let mut redis = RedisServer::start();
    let up = upstream().start().await;
    let store = store::redis(&redis.url())
        .key_prefix("down:")
        .timeout("300ms")
        .on_error("allow");
    let proxy = start(api_config(&up, Some(store))).await;
    deny("alice", &proxy, &[((&proxy).into(), 3)]).await;
    until_listed(&proxy, "/limits/top", &[("alice", 3, 1)]).await;
    redis.stop();
    let (status, top) = admin_json(&proxy, "/limits/top").await;
    assert_eq!(status, StatusCode::OK, "{top}");
    assert_eq!(listed(&top), owned(&[("alice", 3, 1)]));
    assert_eq!(top["scope"], "local", "{top}");
    assert_eq!(top["reason"], "store unavailable", "{top}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_fleet_is_merged_from_one_slot() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let up = upstream().start().await;
    let store = store::cluster(cluster.urls())
        .key_prefix("cl:")
        .timeout("2s")
        .on_error("deny");
    let yaml = api_config(&up, Some(store));
    let a = start(&yaml).await;
    let b = start(yaml).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    both_replicas_see_the_fleet((&a).into(), (&b).into()).await;
    assert_eq!(
        cluster.keyslot("cl:{offenders}"),
        cluster.keyslot("cl:{offenders}.0123456789abcdef")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_fleet_is_merged_through_the_master() {
    let setup = tokio::task::block_in_place(SentinelSetup::start);
    let up = upstream().start().await;
    let store = store::sentinel(&setup.name, setup.sentinel_urls())
        .key_prefix("se:")
        .timeout("2s")
        .on_error("deny");
    let yaml = api_config(&up, Some(store));
    let a = start(&yaml).await;
    let b = start(yaml).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    both_replicas_see_the_fleet((&a).into(), (&b).into()).await;
}

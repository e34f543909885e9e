//! `tollgate explain`: the real binary explaining requests against a real config (and, with
//! `--live`, a real Redis that a real proxy has been counting in).

use std::process::Command;

use crate::support::*;
use http::Request;

/// Three routes: `login` by client IP, `api` by user with an allow list and a tier, `loc` in
/// this instance's memory; behind `store` when given.
fn explain_config(upstream_url: &str, store: Option<Store>) -> Config {
    let config = config()
        .upstream(upstream_url)
        .trusted_proxies(["10.0.0.0/8"])
        .identity("user", [source::header("X-User-Id"), source::bearer()])
        .route(
            route("login")
                .prefix("/login")
                .methods(["POST"])
                .limit(limit::sliding_log(5, "60s")),
        )
        .route(
            route("api")
                .prefix("/api/")
                .key("user")
                .allow(allow().client_ips(["192.0.2.0/24"]))
                .tier(
                    tier("partner")
                        .values(["partner-1"])
                        .limit(limit::gcra(100, "1s")),
                )
                .limit(limit::fixed_window(3, "24h").name("daily"))
                .limit(limit::gcra(10, "1s").burst(5).name("rate"))
                .limit(limit::concurrency(2).key("global").name("slots")),
        )
        .route(
            route("loc")
                .prefix("/loc")
                .limit(limit::fixed_window(2, "24h").scope("local")),
        );
    match store {
        Some(store) => config.store(store),
        None => config,
    }
}

fn config_file(dir: &std::path::Path, store: Option<Store>) -> std::path::PathBuf {
    let path = dir.join("tollgate.yaml");
    std::fs::write(&path, explain_config("http://127.0.0.1:1", store).yaml()).unwrap();
    path
}

fn explain(config: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("explain")
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[test]
fn explains_route_identity_source_and_keys_in_text() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), None);
    let (ok, out, err) = explain(
        &config,
        &[
            "-X",
            "POST",
            "--client-ip",
            "203.0.113.7",
            "http://example.com/login",
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains("request   POST /login\n"), "{out}");
    assert!(out.contains("client ip 203.0.113.7\n"), "{out}");
    assert!(out.contains("route     login\n"), "{out}");
    assert!(
        out.contains("limit     login (sliding_log 5 per 1m, local)"),
        "{out}"
    );
    assert!(
        out.contains("  identity  client_ip = 203.0.113.7 (from client ip)"),
        "{out}"
    );
    assert!(
        out.contains("  key       tollgate:{login|client_ip=203.0.113.7}:login"),
        "{out}"
    );

    let (ok, out, _) = explain(&config, &["-H", "X-User-Id: alice", "/api/posts"]);
    assert!(ok);
    assert!(out.contains("route     api\n"), "{out}");
    assert!(
        out.contains("  identity  user = alice (from header x-user-id)"),
        "{out}"
    );
    assert!(
        out.contains("  key       tollgate:{api}:daily:header=alice"),
        "{out}"
    );
    assert!(out.contains("  key       tollgate:{api}:slots:*"), "{out}");
    assert!(
        out.contains("limit     rate (gcra 10 per 1s, burst 5"),
        "{out}"
    );

    // Secrets never shown raw.
    let (_, out, _) = explain(
        &config,
        &["-H", "Authorization: Bearer sk_live_SECRET", "/api/x"],
    );
    assert!(out.contains("(from bearer token)"), "{out}");
    assert!(!out.contains("sk_live_SECRET"), "{out}");
    assert!(out.contains("user = sha256:"), "{out}");

    // Behind a trusted proxy, X-Forwarded-For names the client.
    let (_, out, _) = explain(
        &config,
        &[
            "-X",
            "POST",
            "--client-ip",
            "10.1.1.1",
            "-H",
            "X-Forwarded-For: 198.51.100.4",
            "/login",
        ],
    );
    assert!(
        out.contains(
            "client ip 198.51.100.4 (from X-Forwarded-For; peer 10.1.1.1 is a trusted proxy)"
        ),
        "{out}"
    );

    // Tiers, allow-lists, and requests that no route limits.
    let (_, out, _) = explain(&config, &["-H", "X-User-Id: partner-1", "/api/x"]);
    assert!(out.contains("tier      partner\n"), "{out}");
    let (_, out, _) = explain(&config, &["--client-ip", "192.0.2.9", "/api/x"]);
    assert!(
        out.contains("tier      allow-list: forwarded without limits"),
        "{out}"
    );
    let (_, out, _) = explain(&config, &["/login"]);
    assert!(
        out.contains("route     none: forwarded without limits"),
        "GET /login is not the login route: {out}"
    );
}

#[test]
fn json_output_is_machine_readable() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), None);
    let (ok, out, err) = explain(&config, &["--json", "-H", "X-User-Id: bob", "/api/x"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["route"], "api");
    assert_eq!(v["client_ip"], "127.0.0.1");
    let limits = v["limits"].as_array().unwrap();
    assert_eq!(limits.len(), 3);
    assert_eq!(limits[0]["name"], "daily");
    assert_eq!(limits[0]["algorithm"], "fixed_window");
    assert_eq!(limits[0]["limit"], 3);
    assert_eq!(limits[0]["period_seconds"], 86400.0);
    assert_eq!(limits[0]["key"], "tollgate:{api}:daily:header=bob");
    assert_eq!(limits[0]["identities"][0]["source"], "header x-user-id");
    assert_eq!(limits[0]["identities"][0]["value"], "bob");
    assert!(limits[0]["live"].is_null());
}

#[test]
fn bad_input_is_refused_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), None);
    let (ok, _, err) = explain(&config, &["-H", "no colon", "/x"]);
    assert!(!ok);
    assert!(err.contains("is not a header"), "{err}");
    let (ok, _, err) = explain(&config, &["-X", "POST", "--live", "/login"]);
    assert!(!ok, "--live without a store has nothing to read");
    assert!(err.contains("no store.redis section"), "{err}");
}

#[tokio::test]
async fn live_reads_the_store_without_consuming() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = store::redis(&redis.url());
    let config = config_file(dir.path(), Some(store.clone()));
    let yaml = explain_config(&up.url(), Some(store));
    let proxy = proxy(yaml).start().await;
    // Counted in Redis, not in memory while the store connects.
    proxy.wait_store().await;
    for _ in 0..2 {
        let r = http1_client()
            .request(
                Request::get(proxy.url("/api/x"))
                    .header("x-user-id", "carol")
                    .body(body(""))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let _ = text(r).await;
    }
    let config_path = config.clone();
    let run = move || {
        explain(
            &config_path,
            &["--live", "--json", "-H", "X-User-Id: carol", "/api/x"],
        )
    };
    for _ in 0..3 {
        let (ok, out, err) = tokio::task::spawn_blocking(run.clone()).await.unwrap();
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let daily = &v["limits"][0]["live"];
        assert_eq!(daily["allowed"], true);
        assert_eq!(
            daily["remaining"], 0,
            "3 per day, 2 used: this request would take the last"
        );
        assert_eq!(
            v["limits"][2]["live"]["remaining"], 1,
            "slots: none held now, this one would take 1 of 2"
        );
    }
    // Nothing was consumed: exactly one more request passes.
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let r = http1_client()
            .request(
                Request::get(proxy.url("/api/x"))
                    .header("x-user-id", "carol")
                    .body(body(""))
                    .unwrap(),
            )
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
        let _ = text(r).await;
    }
    assert_eq!(statuses, [200, 429]);
    let config_path = config.clone();
    let (_, out, _) = tokio::task::spawn_blocking(move || {
        explain(
            &config_path,
            &["--live", "-H", "X-User-Id: carol", "/api/x"],
        )
    })
    .await
    .unwrap();
    assert!(out.contains("would be LIMITED: 0 of 3 left"), "{out}");
    let config_path = config.clone();
    let (ok, out, _) =
        tokio::task::spawn_blocking(move || explain(&config_path, &["--live", "/loc"]))
            .await
            .unwrap();
    assert!(ok);
    assert!(
        out.contains("unknown: a local limit lives in each proxy's memory"),
        "{out}"
    );
}

/// Issue 40: `explain` runs the proxy's stages in its order: a shape refused before routing
/// (400, or 405 for CONNECT) ends there, and so does the usage path, which tollgate answers
/// itself; neither is "forwarded without limits".
#[test]
fn explains_shape_refusals_and_the_usage_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    let yaml = explain_config("http://127.0.0.1:1", None)
        .raw("usage: { path: /_quota }\n")
        .yaml();
    std::fs::write(&path, yaml).unwrap();
    let refused = |status: &str, detail: &str| {
        format!("refused   {status} before routing: {detail} (no app sees it; counted as decision=\"rejected\")\n")
    };
    for (args, want) in [
        (
            &["-X", "post", "/login"][..],
            refused(
                "400 Bad Request",
                "the method must be spelled in upper case",
            ),
        ),
        (
            &["-X", "CONNECT", "/login"][..],
            refused(
                "405 Method Not Allowed",
                "CONNECT is not forwarded: this is a reverse proxy",
            ),
        ),
        (
            &["-H", "Host: a.example", "-H", "Host: b.example", "/login"][..],
            refused("400 Bad Request", "the request has more than one Host"),
        ),
    ] {
        let (ok, out, err) = explain(&path, args);
        assert!(ok, "{args:?}: {err}");
        assert!(out.ends_with(&want), "{args:?}:\n{out}");
        assert!(!out.contains("route"), "{args:?}:\n{out}");
    }
    // A Host header given with a full URL is the request's one Host.
    let (ok, out, err) = explain(
        &path,
        &[
            "-X",
            "POST",
            "-H",
            "Host: a.example",
            "http://a.example/login",
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains("route     login\n"), "{out}");

    let (ok, out, err) = explain(&path, &["/_quota"]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "request   GET /_quota\nclient ip 127.0.0.1\nusage     answered by tollgate, never forwarded: the caller's own usage of every route, as JSON; consumes nothing (its own rate: at most 10 per 10s per client address)\n"
    );
    let (ok, out, err) = explain(&path, &["--json", "/_quota"]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["usage"], true, "{json}");
    assert_eq!(json["route"], serde_json::Value::Null, "{json}");
    assert_eq!(json["refused"], serde_json::Value::Null, "{json}");
    let (ok, out, err) = explain(&path, &["--json", "-X", "post", "/login"]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        json["refused"],
        serde_json::json!({"status": 400, "detail": "the method must be spelled in upper case"})
    );
}

/// A request naming another method in a method override counts against that method's route
/// too, and `explain` says so: `POST /report` with `X-HTTP-Method-Override: GET`, once
/// `GET /report` is spent, is explained as limited by the GET route's limit (live, from the
/// Redis the proxy counted in), as the proxy then refuses it.
#[tokio::test]
async fn explain_counts_the_routes_a_method_override_reaches() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let config = config()
        .upstream(&up.url())
        .store(store::redis(&redis.url()).timeout("2s"))
        .identity("user", [source::header("x-user")])
        .route(
            route("report")
                .prefix("/report")
                .methods(["GET"])
                .key("user")
                .limit(limit::fixed_window(3, "1d").name("reads")),
        )
        .route(
            route("writes")
                .prefix("/report")
                .methods(["POST"])
                .key("user")
                .limit(limit::fixed_window(3, "1d").name("writes")),
        );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, config.yaml()).unwrap();
    let proxy = proxy(config).start().await;
    proxy.wait_store().await;
    let send = async |method: &str, over: Option<&str>| {
        let mut request = Request::builder()
            .method(method)
            .uri(proxy.url("/report"))
            .header("x-user", "erin");
        if let Some(over) = over {
            request = request.header("x-http-method-override", over);
        }
        let response = http1_client()
            .request(request.body(body("")).unwrap())
            .await
            .unwrap();
        response.status().as_u16()
    };
    for _ in 0..3 {
        assert_eq!(send("GET", None).await, 200);
    }
    let args = [
        "--live",
        "-X",
        "POST",
        "-H",
        "X-User: erin",
        "-H",
        "X-HTTP-Method-Override: GET",
        "/report",
    ];
    let (ok, out, err) = tokio::task::spawn_blocking(move || explain(&path, &args))
        .await
        .unwrap();
    assert!(ok, "{err}");
    assert!(out.contains("route     writes\n"), "{out}");
    assert!(
        out.contains(
            "limit     reads (fixed_window 3 per 1day), of route report: counted too by the method override\n"
        ),
        "{out}"
    );
    assert!(out.contains("would be LIMITED: 0 of 3 left"), "{out}");
    assert!(out.contains("would pass: 2 of 3 left"), "{out}");
    // The proxy agrees: refused.
    assert_eq!(send("POST", Some("GET")).await, 429);
}

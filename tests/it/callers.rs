//! Callers as operators see and name them (issue 40), end to end on real proxies and a real
//! Redis: one short form per value in `/limits/top`, `/limits/state`, `tollgate limits`, the
//! audit trail and the admin log lines, set per identity by `display`; a caller found by its
//! value and by its short form; and operator actions on one limit: an override of one limit
//! leaves the monthly quota alone (API and CLI, on two replicas), a reset of one limit leaves
//! the others, `dry_run` changes nothing, an override without a name scales every limit, and
//! the overrides in force are listed the same on both replicas.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};
use serde_json::{json, Value};

/// How long a replica may take to follow a change made on another (see tests/overrides.rs).
const FOLLOW_WITHIN: Duration = Duration::from_secs(3);

/// The key of a caller in the tests: short and safe, so store keys keep it readable and only
/// the display rule hides it. Its short form is sha256("initech"), first 12 hex digits.
const KEY: &str = "initech";
const KEY_SHORT: &str = "sha256:4cdc1a4207f4";

async fn call(base: &str, path: &str, header: (&str, &str)) -> StatusCode {
    let request = Request::get(format!("{base}{path}"))
        .header(header.0, header.1)
        .body(body(""))
        .unwrap();
    http1_client().request(request).await.unwrap().status()
}

async fn admin(base: &str, method: &str, path_and_query: &str) -> (StatusCode, String) {
    let request = Request::builder()
        .method(method)
        .uri(format!("{base}{path_and_query}"))
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let status = response.status();
    (status, text(response).await)
}

async fn admin_json(base: &str, method: &str, path_and_query: &str) -> (StatusCode, Value) {
    let (status, text) = admin(base, method, path_and_query).await;
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, value)
}

fn admin_base(proxy: &ProxyHandle) -> String {
    format!("http://127.0.0.1:{}", proxy.admin.expect("admin").port())
}

fn proxy_base(proxy: &ProxyHandle) -> String {
    proxy.url("").trim_end_matches('/').to_owned()
}

/// Calls until `want` is answered, for at most `within`.
async fn until_status(base: &str, header: (&str, &str), want: StatusCode, within: Duration) {
    let answered = tokio::time::timeout(within, async {
        while call(base, "/api/x", header).await != want {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(answered.is_ok(), "no {want} within {within:?}");
}

/// The fields `names` of each entry of `value[list]`, one line per entry, separated by spaces
/// (strings without quotes): `hourly true 4 2`.
fn rows(value: &Value, list: &str, names: &[&str]) -> Vec<String> {
    let entries = value[list].as_array();
    let entries = entries.unwrap_or_else(|| panic!("no {list} in {value}"));
    let field = |e: &Value, n: &&str| match &e[*n] {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let row = |e: &Value| {
        names
            .iter()
            .map(|n| field(e, n))
            .collect::<Vec<_>>()
            .join(" ")
    };
    entries.iter().map(row).collect()
}

/// Each limit of a state: `name overridden limit-in-force remaining`.
fn limits_of(state: &Value) -> Vec<String> {
    rows(
        state,
        "limits",
        &["limit_name", "overridden", "limit", "remaining"],
    )
}

/// Asserts [`limits_of`] a state.
fn assert_limits(state: &Value, want: [&str; 2]) {
    assert_eq!(limits_of(state), want, "{state}");
}

/// Each limit of an override's answer: `name before after changed scaled`.
fn planned(answer: &Value) -> Vec<String> {
    rows(
        answer,
        "limits",
        &["name", "before", "after", "changed", "scaled"],
    )
}

/// `tollgate limits WORDS... -c FILE` (WORDS split at spaces): exit code, stdout, stderr.
async fn limits_cli(file: &str, words: &str) -> (i32, String, String) {
    let mut args: Vec<&str> = vec!["limits"];
    args.extend(words.split(' '));
    args.extend(["-c", file]);
    run_tollgate(&args).await
}

/// [`limits_cli`] that must succeed: its stdout.
async fn limits_ok(file: &str, words: &str) -> String {
    let (code, out, err) = limits_cli(file, words).await;
    assert_eq!(code, 0, "limits {words}: {err}");
    out
}

/// A route keyed by an API key (a credential-named header: shown as its digest), with an
/// hourly limit of 2 and a "monthly" quota of 5 (30 days).
fn quota_config(up: &Upstream, redis: &RedisServer, prefix: &str) -> Config {
    quota_config_on(
        up,
        Some(
            store::redis(&redis.url())
                .key_prefix(prefix)
                .timeout("500ms")
                .on_error("deny"),
        ),
    )
}

/// [`quota_config`] on `store` (None: the memory store).
fn quota_config_on(up: &Upstream, store: Option<Store>) -> Config {
    let config = config().upstream(&up.url()).admin("127.0.0.1:0");
    let config = match store {
        Some(store) => config.store(store),
        None => config,
    };
    config
        .identity("customer", [source::header("x-api-key")])
        .route(route("api").prefix("/").key("customer").limits([
            // GCRA: no window boundary for a slow run to cross.
            limit::gcra(2, "1h").name("hourly"),
            limit::fixed_window(5, "30d").name("monthly"),
        ]))
}

async fn start(yaml: impl Into<String>) -> ProxyHandle {
    let proxy = proxy(yaml).start().await;
    proxy.wait_store().await;
    proxy
}

#[tokio::test]
async fn a_per_limit_override_leaves_the_monthly_quota_alone_and_a_dry_run_changes_nothing() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = quota_config(&up, &redis, "cq:");
    let a = start(&yaml).await;
    let b = start(&yaml).await;
    let (pa, pb) = (proxy_base(&a), proxy_base(&b));
    let (aa, ab) = (admin_base(&a), admin_base(&b));
    let acme = ("x-api-key", KEY);
    assert_eq!(call(&pa, "/api/x", acme).await, StatusCode::OK);
    assert_eq!(call(&pb, "/api/x", acme).await, StatusCode::OK);
    assert_eq!(
        call(&pb, "/api/x", acme).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let state = format!("/limits/state?route=api&identity={KEY}");
    let (_, before) = admin_json(&ab, "GET", &state).await;
    assert_limits(&before, ["hourly false 2 0", "monthly false 5 2"]);

    // A dry run answers what each limit would become and changes nothing, anywhere.
    let ask = format!("/limits/override?route=api&identity={KEY}&limit=4&limit_name=hourly&for=1h");
    let (status, dry) = admin_json(&aa, "POST", &format!("{ask}&dry_run=true")).await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    assert_eq!(
        (&dry["dry_run"], &dry["applied"]),
        (&json!(true), &json!(false))
    );
    assert_eq!(
        planned(&dry),
        ["hourly 2 4 true false", "monthly 5 5 false false"]
    );
    for admin in [&aa, &ab] {
        let (_, list) = admin_json(admin, "GET", "/limits/overrides").await;
        assert_eq!(list, json!({ "overrides": [] }));
        let (_, trail) = admin_json(admin, "GET", "/limits/audit").await;
        assert_eq!(trail["entries"], json!([]), "a dry run is not audited");
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        call(&pb, "/api/x", acme).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (_, after_dry) = admin_json(&ab, "GET", &state).await;
    assert_eq!(limits_of(&after_dry), limits_of(&before), "{after_dry}");

    // Applied on one replica, followed by the other: the hourly limit becomes 4, counted
    // afresh; the month keeps its 5 and the 2 already used. (`remaining` is what a request
    // sent now would leave; a refused request counts on no limit.)
    let (status, done) = admin_json(&aa, "POST", &ask).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(planned(&done), planned(&dry));
    assert_eq!(done["applied"], json!(true));
    until_status(&pb, acme, StatusCode::OK, FOLLOW_WITHIN).await;
    let (_, now) = admin_json(&ab, "GET", &state).await;
    assert_limits(&now, ["hourly true 4 2", "monthly false 5 1"]);
    assert_eq!(now["limits"][0]["override"]["limit_name"], "hourly");
    assert!(now["limits"][1]["override"].is_null(), "{now}");
    // Two more, then the month is used up: refused although the hour has room.
    assert_eq!(call(&pa, "/api/x", acme).await, StatusCode::OK);
    assert_eq!(call(&pb, "/api/x", acme).await, StatusCode::OK);
    assert_eq!(
        call(&pa, "/api/x", acme).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (_, spent) = admin_json(&aa, "GET", &state).await;
    assert_limits(&spent, ["hourly true 4 0", "monthly false 5 0"]);

    // The list in force is the same on both replicas: one override, of one limit, with who
    // set it and when it ends, the caller by its short form.
    let (_, list_a) = admin_json(&aa, "GET", "/limits/overrides").await;
    let (_, list_b) = admin_json(&ab, "GET", "/limits/overrides").await;
    let entries = list_a["overrides"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{list_a}");
    let strip = |mut list: Value| {
        for o in list["overrides"].as_array_mut().unwrap() {
            o.as_object_mut().unwrap().remove("expires_in_seconds");
        }
        list
    };
    assert_eq!(strip(list_a.clone()), strip(list_b));
    let o = &entries[0];
    assert_eq!(
        (
            &o["route"],
            &o["identity"],
            &o["limit_name"],
            &o["limit"],
            &o["set_by"]
        ),
        (
            &json!("api"),
            &json!(KEY_SHORT),
            &json!("hourly"),
            &json!(4),
            &json!("loopback")
        )
    );
    assert!(
        humantime::parse_rfc3339(o["until"].as_str().unwrap()).is_ok(),
        "{o}"
    );
    assert!(
        humantime::parse_rfc3339(o["set_at"].as_str().unwrap()).is_ok(),
        "{o}"
    );
    let (_, text) = admin(&ab, "GET", "/limits/overrides?format=text").await;
    assert!(
        text.starts_with(&format!(
            "route api identity {KEY_SHORT} limit hourly: limit 4 until "
        )),
        "{text}"
    );
    assert!(text.contains(", set by loopback at "), "{text}");

    // Without a limit name, `limit` is for the shortest period and the month scales with it.
    let (status, scaled) = admin_json(
        &aa,
        "POST",
        &format!("/limits/override?route=api&identity={KEY}&limit=20&for=1h&dry_run=true"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{scaled}");
    assert_eq!(
        planned(&scaled),
        ["hourly 2 20 true false", "monthly 5 50 true true"]
    );
    // Nonsense is refused, naming what is allowed.
    for (query, says) in [
        ("multiply=0.0000001&for=1h", "less than 1"),
        (
            "limit=5&limit_name=daily&for=1h",
            "write limit_name as one of hourly, monthly",
        ),
    ] {
        let (status, text) = admin(
            &aa,
            "POST",
            &format!("/limits/override?route=api&identity={KEY}&{query}"),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {text}");
        assert!(text.contains(says), "{query}: {text}");
    }

    // A reset of one limit leaves the others: the hour is full again, the month stays spent.
    let (status, reset) = admin_json(
        &ab,
        "POST",
        &format!("/limits/reset?route=api&identity={KEY_SHORT}&limit_name=hourly"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reset}");
    assert_eq!(reset["identity"], KEY_SHORT);
    assert!(!reset.to_string().contains(KEY), "{reset}");
    let (_, state_now) = admin_json(&aa, "GET", &state).await;
    assert_limits(&state_now, ["hourly true 4 3", "monthly false 5 0"]);
    let (status, text) = admin(
        &ab,
        "POST",
        &format!("/limits/reset?route=api&identity={KEY}&limit_name=daily"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("one of hourly, monthly"), "{text}");
}

/// On a Cluster the keys of one decision must share a slot: an override of one limit counts
/// on a key in the same hash tag as the limits it leaves alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_limit_override_works_on_a_cluster() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let up = upstream().start().await;
    let store = store::cluster(cluster.urls())
        .key_prefix("cqs:")
        .timeout("2s")
        .on_error("deny");
    let proxy = start(&quota_config_on(&up, Some(store))).await;
    let (base, at) = (proxy_base(&proxy), admin_base(&proxy));
    let acme = ("x-api-key", KEY);
    until_status(&base, acme, StatusCode::OK, Duration::from_secs(10)).await;
    assert_eq!(call(&base, "/api/x", acme).await, StatusCode::OK);
    assert_eq!(
        call(&base, "/api/x", acme).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (status, done) = admin_json(
        &at,
        "POST",
        &format!("/limits/override?route=api&identity={KEY}&limit=4&limit_name=hourly&for=1h"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    until_status(&base, acme, StatusCode::OK, FOLLOW_WITHIN).await;
    let (_, state) = admin_json(
        &at,
        "GET",
        &format!("/limits/state?route=api&identity={KEY}"),
    )
    .await;
    assert_limits(&state, ["hourly true 4 2", "monthly false 5 1"]);
}

/// A memory store keeps overrides in the process: the same per-limit override, listed there.
#[tokio::test]
async fn a_per_limit_override_in_memory_leaves_the_month_alone() {
    let _own = memory_operator_state().await;
    let up = upstream().start().await;
    let proxy = start(&quota_config_on(&up, None)).await;
    let (base, at) = (proxy_base(&proxy), admin_base(&proxy));
    let acme = ("x-api-key", KEY);
    for want in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        assert_eq!(call(&base, "/api/x", acme).await, want);
    }
    let ask = format!("/limits/override?route=api&identity={KEY}&limit=4&limit_name=hourly&for=1h");
    let (status, done) = admin_json(&at, "POST", &ask).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    // Applied here at once.
    assert_eq!(call(&base, "/api/x", acme).await, StatusCode::OK);
    let state = format!("/limits/state?route=api&identity={KEY_SHORT}");
    let (_, now) = admin_json(&at, "GET", &state).await;
    assert_limits(&now, ["hourly true 4 2", "monthly false 5 1"]);
    let (_, list) = admin_json(&at, "GET", "/limits/overrides").await;
    assert_eq!(
        rows(
            &list,
            "overrides",
            &["identity", "limit_name", "limit", "set_by"]
        ),
        [format!("{KEY_SHORT} hourly 4 loopback")]
    );
}

#[tokio::test]
async fn the_cli_overrides_and_resets_one_limit_and_lists_the_overrides() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = quota_config(&up, &redis, "cqc:");
    let proxy = start(&yaml).await;
    let (base, admin_at) = (proxy_base(&proxy), admin_base(&proxy));
    let acme = ("x-api-key", KEY);
    for _ in 0..2 {
        assert_eq!(call(&base, "/api/x", acme).await, StatusCode::OK);
    }
    assert_eq!(
        call(&base, "/api/x", acme).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let dir = tempfile::tempdir().unwrap();
    let file = write_config(&dir, &yaml.clone().without_admin().yaml());
    let file = file.to_str().unwrap();
    let caller = format!("--route api --identity {KEY}");

    // Dry run: what each limit would become, nothing set.
    let out = limits_ok(
        file,
        &format!("override --limit-name hourly --limit 4 --for 1h --dry-run {caller}"),
    )
    .await;
    let first = out.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!(
            "override  route api identity {KEY_SHORT} limit hourly: limit 4 until "
        )) && first.ends_with(" (dry run: nothing changed)"),
        "{out}"
    );
    assert_eq!(
        out.lines().skip(1).collect::<Vec<_>>(),
        [
            "  limit   hourly per 1h: 2 -> 4",
            "  limit   monthly per 30days: 5 -> 5 (unchanged)"
        ],
        "{out}"
    );
    assert_eq!(
        limits_ok(file, "overrides").await,
        "no overrides in force\n"
    );

    // Applied: the hour has 4 afresh, the month keeps its 3.
    limits_ok(
        file,
        &format!("override --limit-name hourly --limit 4 --for 1h {caller}"),
    )
    .await;
    until_status(&base, acme, StatusCode::OK, FOLLOW_WITHIN).await;
    let out = limits_ok(
        file,
        &format!("get --json --route api --identity {KEY_SHORT}"),
    )
    .await;
    let state: Value = serde_json::from_str(&out).unwrap();
    assert_limits(&state, ["hourly true 4 2", "monthly false 5 1"]);
    let out = limits_ok(file, "overrides").await;
    assert!(
        out.starts_with(&format!(
            "route api identity {KEY_SHORT} limit hourly: limit 4 until "
        )) && out.contains(", set by cli at "),
        "{out}"
    );
    let (_, list) = admin_json(&admin_at, "GET", "/limits/overrides").await;
    assert_eq!(list["overrides"][0]["set_by"], "cli", "{list}");

    // Reset of the month only: the hour keeps its use under the override.
    let out = limits_ok(file, &format!("reset --limit-name monthly {caller}")).await;
    assert!(
        out.starts_with(&format!(
            "reset     route api identity {KEY_SHORT} limit monthly: "
        )),
        "{out}"
    );
    let (_, state) = admin_json(
        &admin_at,
        "GET",
        &format!("/limits/state?route=api&identity={KEY}"),
    )
    .await;
    assert_limits(&state, ["hourly true 4 2", "monthly false 5 4"]);
    // The override of one limit ends by its name; an unknown name is a usage error.
    let out = limits_ok(
        file,
        &format!("override --delete --limit-name hourly {caller}"),
    )
    .await;
    assert!(out.contains("limit hourly: removed (1)"), "{out}");
    assert_eq!(
        limits_ok(file, "overrides").await,
        "no overrides in force\n"
    );
    let (code, _, err) = limits_cli(file, &format!("reset --limit-name daily {caller}")).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("one of hourly, monthly"), "{err}");
}

/// The routes of the display test: one keyed by an API key (default: digest), one by a user
/// id (default: clear), one by a token in the query shown `last4`.
fn display_config(up: &Upstream, redis: &RedisServer, listen: u16, admin: u16) -> Config {
    config()
        .listen(&format!("127.0.0.1:{listen}"))
        .admin(&format!("127.0.0.1:{admin}"))
        .upstream(&up.url())
        .store(
            store::redis(&redis.url())
                .key_prefix("cd:")
                .timeout("500ms")
                .on_error("deny"),
        )
        .identity("customer", [source::header("x-api-key")])
        .identity("user", [source::header("x-user")])
        .identity("partner", [source::query("api_token")])
        .display("partner", "last4")
        .routes([
            route("keys")
                .prefix("/keys")
                .key("customer")
                .limits([limit::gcra(1, "1h").name("hourly")]),
            route("users")
                .prefix("/users")
                .key("user")
                .limits([limit::gcra(1, "1h").name("hourly")]),
            route("partners")
                .prefix("/partners")
                .key("partner")
                .limits([limit::gcra(1, "1h").name("hourly")]),
        ])
}

#[tokio::test]
async fn a_caller_is_shown_one_way_everywhere_and_found_by_value_and_short_form() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let (listen, admin_port) = (free_port(), free_port());
    let yaml = display_config(&up, &redis, listen, admin_port).yaml();
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(&dir, &yaml);
    let file = path.to_str().unwrap();
    // The binary itself, so that its log lines can be read.
    let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["--config", file, "--log-format", "json"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{listen}");
    let at = format!("http://127.0.0.1:{admin_port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready(&at).await {
        assert!(Instant::now() < deadline, "tollgate did not get ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let token = "tok_live_0123456789f00d";
    let token_short = format!(
        "…f00d ({})",
        "sha256:".to_owned() + &sha256_hex(token)[..12]
    );
    let user_short = "alice";
    for _ in 0..3 {
        call(&base, "/keys/x", ("x-api-key", KEY)).await;
        call(&base, "/users/x", ("x-user", "alice")).await;
        call(
            &base,
            &format!("/partners/x?api_token={token}"),
            ("x-other", "1"),
        )
        .await;
    }

    // The top offenders: each caller by its route's rule, the API key never in clear.
    let (status, top) = admin_json(&at, "GET", "/limits/top").await;
    assert_eq!(status, StatusCode::OK);
    let shown: Vec<(String, String, String)> = top["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let first = &r["top"][0];
            (
                r["route"].as_str().unwrap().to_owned(),
                first["identity"].as_str().unwrap().to_owned(),
                first["source"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("keys".into(), KEY_SHORT.into(), "header".into()),
            ("partners".into(), token_short.clone(), "query".into()),
            ("users".into(), user_short.into(), "header".into()),
        ],
        "{top}"
    );
    let (_, top_text) = admin(&at, "GET", "/limits/top?format=text").await;
    assert!(
        top_text.contains(&format!("  {KEY_SHORT} (header)  ")),
        "{top_text}"
    );
    for page in [top.to_string(), top_text] {
        assert!(!page.contains(KEY) && !page.contains(token), "{page}");
    }

    // The state, by value and by short form: the same answer, the same form, no clear key.
    let by_value = format!("/limits/state?route=keys&identity={KEY}");
    let by_short = format!("/limits/state?route=keys&identity={KEY_SHORT}");
    let (_, state) = admin_json(&at, "GET", &by_value).await;
    let (status, found) = admin_json(&at, "GET", &by_short).await;
    assert_eq!(status, StatusCode::OK, "{found}");
    let essentials = |s: &Value| {
        (
            s["identity"].clone(),
            s["limits"][0]["identity"].clone(),
            s["limits"][0]["key"].clone(),
            s["limits"][0]["remaining"].clone(),
        )
    };
    assert_eq!(essentials(&state), essentials(&found));
    assert_eq!(
        essentials(&state),
        (
            json!(KEY_SHORT),
            json!(KEY_SHORT),
            json!(format!("cd:{{keys|header={KEY_SHORT}}}:hourly")),
            json!(0)
        )
    );
    assert!(!state.to_string().contains(KEY), "{state}");
    // The last4 form finds its caller too, whole (percent-encoded as a browser sends it).
    let encoded: String = token_short
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'0'..=b'9' | b':' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (status, partner) = admin_json(
        &at,
        "GET",
        &format!("/limits/state?route=partners&identity={encoded}"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{partner}");
    assert_eq!(partner["identity"], json!(token_short));
    assert_eq!(partner["limits"][0]["remaining"], json!(0));
    let (_, user) = admin_json(&at, "GET", "/limits/state?route=users&identity=alice").await;
    assert_eq!(user["identity"], "alice");
    // A short form nobody has: 404, and a hint to name the caller by its value.
    let (status, text) = admin(
        &at,
        "GET",
        "/limits/state?route=keys&identity=sha256:000000000000",
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert!(text.contains("name it by its value"), "{text}");

    // The CLI, straight to Redis: the same form, by value and by short form.
    for identity in [KEY, KEY_SHORT] {
        let out = limits_ok(file, &format!("get --route keys --identity {identity}")).await;
        assert!(
            out.starts_with(&format!("route     keys\nidentity  {KEY_SHORT}\n")),
            "{out}"
        );
        assert!(!out.contains(KEY), "{out}");
    }

    // A reset by short form: the audit trail and the log line name the caller the same way.
    let (status, reset) = admin_json(
        &at,
        "POST",
        &format!("/limits/reset?route=keys&identity={KEY_SHORT}"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reset}");
    assert_eq!(
        call(&base, "/keys/x", ("x-api-key", KEY)).await,
        StatusCode::OK
    );
    let (_, trail) = admin_json(&at, "GET", "/limits/audit").await;
    assert_eq!(trail["entries"][0]["identity"], KEY_SHORT, "{trail}");

    let log = stop_for_stderr(child).await;
    let mutation: Value = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l.to_string().contains("admin mutation"))
        .unwrap_or_else(|| panic!("no admin mutation logged: {log}"));
    let identity = mutation
        .get("identity")
        .or_else(|| mutation["fields"].get("identity"));
    assert_eq!(identity, Some(&json!(KEY_SHORT)), "{mutation}");
    assert!(!log.contains(KEY), "{log}");
}

/// Whether the admin listener at `at` answers `/readyz` with 200 (not listening yet: no).
async fn ready(at: &str) -> bool {
    let request = Request::get(format!("{at}/readyz")).body(body("")).unwrap();
    matches!(http1_client().request(request).await, Ok(r) if r.status() == StatusCode::OK)
}

/// The first bytes of SHA-256 of `text`, in hex, computed apart from tollgate (`sha256sum`).
fn sha256_hex(text: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum (coreutils) is needed");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

#[tokio::test]
async fn a_display_the_file_cannot_mean_is_refused_with_its_place_and_what_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = config()
        .upstream("http://127.0.0.1:1")
        .identity("customer", [source::header("x-api-key")])
        .display("customer", "hash")
        .route(
            route("api")
                .prefix("/")
                .key("customer")
                .limits([limit::gcra(1, "1m")]),
        )
        .yaml();
    // Where the file says it (1-based line and column of the value).
    let (line, col) = yaml
        .lines()
        .enumerate()
        .find_map(|(i, l)| l.find("hash").map(|c| (i + 1, c + 1)))
        .unwrap_or_else(|| panic!("{yaml}"));
    let path = write_config(&dir, &yaml);
    let file = path.to_str().unwrap();
    let (code, _, err) = run_tollgate(&["check", "-c", file]).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "{file}:{line}:{col}: identities.customer.display: `hash` is not a display: write `clear`, `digest` or `last4`"
        )),
        "{err}"
    );
}

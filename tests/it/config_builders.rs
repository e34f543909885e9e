//! The typed configuration builders of tests/support/config.rs render the YAML the tests mean:
//! each builder call becomes the field docs/configuration.md names, with the same value, and
//! tollgate accepts the result. The other tests rely on this when they build their
//! configurations instead of writing YAML.

use std::path::Path;

use crate::support::*;

fn value(yaml: &str) -> serde_yaml::Value {
    serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("{e}:\n{yaml}"))
}

/// Renders `built`, checks it means the same as `written`, and that tollgate accepts it.
fn same_as(built: Config, written: &str) {
    let yaml = built.yaml();
    assert_eq!(value(&yaml), value(written), "rendered:\n{yaml}");
    let env = |name: &str| match name {
        "TEST_JWT_SECRET" | "TEST_ADMIN_TOKEN" => Some("s3cret".to_string()),
        _ => None,
    };
    if let Err(e) = tollgate::config::parse(Path::new("built.yaml"), &yaml, env) {
        panic!("refused:\n{e}\n---\n{yaml}");
    }
}

#[test]
fn a_minimal_configuration_is_a_listener_and_an_upstream() {
    same_as(
        config().upstream("http://127.0.0.1:3000"),
        "listen: 127.0.0.1:0\nupstream:\n  url: http://127.0.0.1:3000\n",
    );
}

#[test]
fn proxy_fields_and_upstream_options() {
    same_as(
        config()
            .listen("127.0.0.1:8080")
            .admin_with_token("127.0.0.1:9901", "TEST_ADMIN_TOKEN")
            .upstream("http://127.0.0.1:3000")
            .connect_timeout("1s")
            .upstream_timeout("300ms")
            .upstream_host("upstream")
            .http2()
            .pool_idle_timeout("3s")
            .max_request_body("1KiB")
            .header_read_timeout("5s")
            .idle_timeout("30s")
            .shutdown_timeout("10s")
            .max_connections(100)
            .workers(2)
            .http2_max_concurrent_streams(8)
            .access_log(false)
            .response_status(503)
            .response_headers(["ietf", "legacy"]),
        r#"
listen: 127.0.0.1:8080
admin: { address: 127.0.0.1:9901, token_env: TEST_ADMIN_TOKEN }
upstream:
  url: http://127.0.0.1:3000
  connect_timeout: 1s
  timeout: 300ms
  host: upstream
  http2: true
  pool_idle_timeout: 3s
max_request_body: 1KiB
header_read_timeout: 5s
idle_timeout: 30s
shutdown_timeout: 10s
max_connections: 100
workers: 2
http2_max_concurrent_streams: 8
access_log: false
response: { status: 503, headers: [ietf, legacy] }
"#,
    );
    // A plain number of bytes stays a number; no rate-limit fields is an empty list.
    same_as(
        config()
            .upstream("http://127.0.0.1:3000")
            .max_request_body(100u64)
            .response_headers(Vec::<String>::new()),
        "listen: 127.0.0.1:0\nupstream: { url: http://127.0.0.1:3000 }\nmax_request_body: 100\nresponse: { headers: [] }\n",
    );
}

#[test]
fn stores() {
    let upstream = "listen: 127.0.0.1:0\nupstream: { url: http://127.0.0.1:3000 }\n";
    let with = |store: Store| config().upstream("http://127.0.0.1:3000").store(store);
    same_as(
        with(
            store::redis("redis://127.0.0.1:6379")
                .key_prefix("tg-test:")
                .timeout("500ms")
                .coalesce()
                .on_error("deny"),
        ),
        &format!("{upstream}store:\n  redis: {{ url: \"redis://127.0.0.1:6379\", key_prefix: \"tg-test:\", timeout: 500ms, coalesce: true }}\n  on_error: deny\n"),
    );
    same_as(
        with(store::cluster(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]).on_error("local")),
        &format!("{upstream}store:\n  redis:\n    cluster: [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]\n  on_error: local\n"),
    );
    same_as(
        with(
            store::sentinel("mymaster", ["redis://127.0.0.1:26379"])
                .username("tollgate")
                .password("${TEST_JWT_SECRET}"),
        ),
        &format!("{upstream}store:\n  redis:\n    sentinel: {{ master: mymaster, nodes: [\"redis://127.0.0.1:26379\"] }}\n    username: tollgate\n    password: \"${{TEST_JWT_SECRET}}\"\n"),
    );
    same_as(
        with(store::memory().on_error("allow")),
        &format!("{upstream}store: {{ on_error: allow }}\n"),
    );
}

#[test]
fn identities_routes_limits_allow_lists_and_tiers() {
    let public_key = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/identity/rsa_public.pem"
    );
    let built = config()
        .upstream("http://127.0.0.1:3000")
        .trusted_proxies(["10.0.0.0/8", "127.0.0.1"])
        .allow(allow().client_ips(["192.0.2.0/24"]))
        .identity(
            "user",
            [
                source::jwt(Jwt::hmac("sub", "TEST_JWT_SECRET").leeway("5s")),
                source::jwt(
                    Jwt::public_key("sub", public_key)
                        .algorithm("RS256")
                        .issuer("https://login.example.com")
                        .audience("api"),
                ),
                source::header("x-user"),
                source::query("token"),
                source::cookie("session"),
                source::bearer(),
                source::path_segment(2),
                source::client_ip(),
            ],
        )
        .route(
            route("login")
                .prefix("/login")
                .methods(["POST"])
                .host("*.example.com")
                .limit(limit::sliding_log(5, "1m").block_for("15m"))
                .limit(
                    limit::fixed_window(10, "24h")
                        .count_statuses([401, 403])
                        .count_statuses(["5xx"]),
                ),
        )
        .route(
            route("api")
                .prefix("/api/")
                .key(["user", "client_ip"])
                .allow(allow().identity("user", ["ops-bot"]))
                .tier(
                    tier("partner")
                        .identity("user")
                        .values(["partner-1", "partner-2"])
                        .limit(limit::gcra(100, "1s").burst(500)),
                )
                .limit(
                    limit::token_bucket(10, "1s")
                        .burst(50)
                        .delay("250ms")
                        .name("rate"),
                )
                .limit(
                    limit::sliding_window(1200, "1m")
                        .key("client_ip")
                        .scope("local"),
                )
                .limit(
                    limit::fixed_window(100000, "1h")
                        .key("global")
                        .shadow()
                        .cost(2),
                )
                .limit(
                    limit::new("token_bucket", 1000, "1h")
                        .cost_from_response("X-Tokens-Used")
                        .name("tokens"),
                ),
        )
        .route(route("uploads").limit(limit::concurrency(2).lease_ttl("2m").on_limit("reject")))
        .route(route("search").limit(limit::fixed_window(50, "1m").sync("100ms")))
        .route(
            route("slow").limit(
                limit::gcra(5, "1s")
                    .set("max_delay", "1s")
                    .on_limit("delay"),
            ),
        );
    let written = format!(
        r#"
listen: 127.0.0.1:0
upstream: {{ url: http://127.0.0.1:3000 }}
client_ip: {{ trusted_proxies: [10.0.0.0/8, 127.0.0.1] }}
allow: {{ client_ips: [192.0.2.0/24] }}
identities:
  user:
    - jwt: {{ claim: sub, secret_env: TEST_JWT_SECRET, leeway: 5s }}
    - jwt: {{ claim: sub, public_key_file: "{public_key}", algorithm: RS256, issuer: "https://login.example.com", audience: api }}
    - header: x-user
    - query: token
    - cookie: session
    - bearer: {{}}
    - path_segment: 2
    - client_ip
routes:
  - name: login
    match: {{ path_prefix: /login, methods: [POST], host: "*.example.com" }}
    limits:
      - {{ algorithm: sliding_log, limit: 5, period: 1m, block_for: 15m }}
      - {{ algorithm: fixed_window, limit: 10, period: 24h, count_statuses: [401, 403, "5xx"] }}
  - name: api
    match: {{ path_prefix: /api/ }}
    key: [user, client_ip]
    allow: {{ identities: {{ user: [ops-bot] }} }}
    overrides:
      - {{ name: partner, identity: user, values: [partner-1, partner-2], limits: [ {{ algorithm: gcra, limit: 100, period: 1s, burst: 500 }} ] }}
    limits:
      - {{ algorithm: token_bucket, limit: 10, period: 1s, burst: 50, on_limit: delay, max_delay: 250ms, name: rate }}
      - {{ algorithm: sliding_window, limit: 1200, period: 1m, key: client_ip, scope: local }}
      - {{ algorithm: fixed_window, limit: 100000, period: 1h, key: global, shadow: true, cost: 2 }}
      - {{ algorithm: token_bucket, limit: 1000, period: 1h, cost_from_response: X-Tokens-Used, name: tokens }}
  - name: uploads
    limits:
      - {{ algorithm: concurrency, limit: 2, lease_ttl: 2m, on_limit: reject }}
  - name: search
    limits:
      - {{ algorithm: fixed_window, limit: 50, period: 1m, sync: 100ms }}
  - name: slow
    limits:
      - {{ algorithm: gcra, limit: 5, period: 1s, max_delay: 1s, on_limit: delay }}
"#
    );
    same_as(built, &written);
}

#[test]
fn escape_hatches_add_a_key_or_a_fragment() {
    same_as(
        config()
            .upstream("http://127.0.0.1:3000")
            .set("workers", 3)
            .raw("access_log: false\n")
            .route(route("r").set("match", serde_yaml::from_str::<serde_yaml::Value>("{ path_prefix: /r }").unwrap()).limit(limit::fixed_window(1, "1h"))),
        "listen: 127.0.0.1:0\nupstream: { url: http://127.0.0.1:3000 }\nworkers: 3\naccess_log: false\nroutes:\n  - { name: r, match: { path_prefix: /r }, limits: [ { algorithm: fixed_window, limit: 1, period: 1h } ] }\n",
    );
}

#[test]
fn a_tls_listener_and_a_config_without_admin() {
    let yaml = config()
        .admin("127.0.0.1:0")
        .listen_tls("127.0.0.1:0", "cert.pem", "key.pem")
        .upstream("http://127.0.0.1:3000")
        .without_admin()
        .yaml();
    assert_eq!(
        value(&yaml),
        value("listen: [ { address: 127.0.0.1:0, tls: { cert: cert.pem, key: key.pem } } ]\nupstream: { url: http://127.0.0.1:3000 }\n"),
        "{yaml}"
    );
}

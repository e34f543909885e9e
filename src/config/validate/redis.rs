//! Validation of `store.redis`: which Redis deployment to talk to (one server, a Redis Cluster
//! or a Sentinel-managed master), how to authenticate (ACL username/password) and TLS (custom
//! CA, client certificate). Certificate files are read here, so a missing or unreadable file
//! is a FILE:LINE:COL error at startup rather than a connection failure later.

use std::time::Duration;

use super::validator::Validator;
use crate::config::model::{RedisConfig, RedisMode, RedisTls, Secret};
use crate::config::raw::{RawRedis, RawRedisTls};

fn scheme_ok(url: &str) -> bool {
    url.starts_with("redis://") || url.starts_with("rediss://")
}

pub(super) fn redis(v: &mut Validator, raw: &RawRedis, default_timeout: Duration) -> RedisConfig {
    let timeout = v.duration(
        "store.redis.timeout",
        raw.timeout.as_deref(),
        default_timeout,
    );
    let (mode, urls) = mode(v, raw);
    let tls_urls = check_urls(v, &urls);
    let tls = raw
        .tls
        .as_ref()
        .map(|t| tls(v, t, tls_urls == 0 && !urls.is_empty()));
    let username = raw.username.clone().filter(|u| !u.is_empty());
    let password = raw.password.clone().map(Secret);
    if username.is_some() && password.is_none() {
        v.error(
            "store.redis.username",
            "an ACL username needs a `password` (e.g. password: ${REDIS_PASSWORD})",
        );
    }
    let coalesce = raw.coalesce.unwrap_or(false);
    if coalesce && matches!(mode, RedisMode::Cluster(_)) {
        v.error(
            "store.redis.coalesce",
            "not available with `cluster`: the decisions of different callers live in different hash slots, which one script call cannot reach; remove `coalesce` or use `url`/`sentinel`",
        );
    }
    RedisConfig {
        mode,
        username,
        password,
        tls,
        timeout,
        coalesce,
    }
}

/// One server, a Cluster or a Sentinel, with every URL given and where it stands in the file.
fn mode(v: &mut Validator, raw: &RawRedis) -> (RedisMode, Vec<(String, String)>) {
    let given = [
        raw.url.is_some(),
        raw.cluster.is_some(),
        raw.sentinel.is_some(),
    ];
    if given.iter().filter(|g| **g).count() != 1 {
        v.error(
            "store.redis",
            "give exactly one of `url` (one server), `cluster` (a list of Redis Cluster nodes) or `sentinel` ({ master: NAME, nodes: [...] })",
        );
    }
    let mut urls: Vec<(String, String)> = Vec::new();
    let mode = if let Some(url) = &raw.url {
        let url = url.trim().to_string();
        urls.push(("store.redis.url".into(), url.clone()));
        RedisMode::Standalone(url)
    } else if let Some(nodes) = &raw.cluster {
        if nodes.is_empty() {
            v.error(
                "store.redis.cluster",
                "list at least one node, e.g. [redis://10.0.0.1:6379]",
            );
        }
        let nodes: Vec<String> = nodes.iter().map(|n| n.trim().to_string()).collect();
        for (i, n) in nodes.iter().enumerate() {
            urls.push((format!("store.redis.cluster[{i}]"), n.clone()));
        }
        RedisMode::Cluster(nodes)
    } else if let Some(sentinel) = &raw.sentinel {
        if sentinel.master.trim().is_empty() {
            v.error(
                "store.redis.sentinel.master",
                "name the master as the Sentinels know it (their `sentinel monitor NAME ...`)",
            );
        }
        if sentinel.nodes.is_empty() {
            v.error(
                "store.redis.sentinel.nodes",
                "list at least one Sentinel, e.g. [redis://10.0.0.1:26379]",
            );
        }
        let nodes: Vec<String> = sentinel
            .nodes
            .iter()
            .map(|n| n.trim().to_string())
            .collect();
        for (i, n) in nodes.iter().enumerate() {
            urls.push((format!("store.redis.sentinel.nodes[{i}]"), n.clone()));
        }
        RedisMode::Sentinel {
            master: sentinel.master.trim().to_string(),
            nodes,
        }
    } else {
        RedisMode::Standalone(String::new())
    };
    (mode, urls)
}

/// Refuses URLs the client cannot use and a mix of TLS and plain; returns how many say TLS.
fn check_urls(v: &mut Validator, urls: &[(String, String)]) -> usize {
    for (path, url) in urls {
        if !scheme_ok(url) {
            v.error(
                path,
                format!("`{url}` must start with redis:// or rediss:// (TLS)"),
            );
        } else if let Err(e) = redis::Client::open(url.as_str()) {
            v.error(path, format!("not a usable Redis URL: {e}"));
        }
    }
    let tls_urls = urls
        .iter()
        .filter(|(_, u)| u.starts_with("rediss://"))
        .count();
    if tls_urls != 0 && tls_urls != urls.len() {
        v.error(
            "store.redis",
            "mix of redis:// and rediss:// URLs: use rediss:// for every node or for none",
        );
    }
    tls_urls
}

/// `store.redis.tls`; `plain_urls` when the URLs say redis://, where the files would go unused.
fn tls(v: &mut Validator, t: &RawRedisTls, plain_urls: bool) -> RedisTls {
    if plain_urls {
        v.error(
            "store.redis.tls",
            "TLS certificates are set but the URLs say redis://: write rediss:// to connect with TLS",
        );
    }
    let ca = t
        .ca_file
        .as_ref()
        .and_then(|f| pem_file(v, "store.redis.tls.ca_file", f));
    let client = match (&t.cert_file, &t.key_file) {
        (Some(cert), Some(key)) => {
            let cert = pem_file(v, "store.redis.tls.cert_file", cert);
            let key = pem_file(v, "store.redis.tls.key_file", key);
            cert.zip(key)
        }
        (None, None) => None,
        _ => {
            v.error(
                "store.redis.tls",
                "a client certificate needs both `cert_file` and `key_file`",
            );
            None
        }
    };
    RedisTls { ca, client }
}

fn pem_file(v: &mut Validator, path: &str, file: &str) -> Option<Vec<u8>> {
    let file = v.relative(file);
    match std::fs::read(&file) {
        Ok(pem) if String::from_utf8_lossy(&pem).contains("-----BEGIN ") => Some(pem),
        Ok(_) => {
            v.error(
                path,
                format!("{} is not a PEM file (no -----BEGIN line)", file.display()),
            );
            None
        }
        Err(e) => {
            v.error(path, format!("cannot read {}: {e}", file.display()));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{parse, Config, StoreConfig};

    const BASE: &str = "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n";

    fn env(name: &str) -> Option<String> {
        (name == "REDIS_PW").then(|| "from-env".to_string())
    }

    fn redis(extra: &str) -> RedisConfig {
        let c: Config = parse(Path::new("t.yaml"), &format!("{BASE}{extra}"), env)
            .unwrap_or_else(|e| panic!("{e}"));
        match c.throttle.store {
            StoreConfig::Redis(r) => r,
            other => panic!("not redis: {other:?}"),
        }
    }

    fn errors(extra: &str) -> String {
        parse(Path::new("t.yaml"), &format!("{BASE}{extra}"), env)
            .expect_err("should be refused")
            .to_string()
    }

    #[test]
    fn cluster_and_sentinel_with_acl_user_and_password_from_the_environment() {
        let r = redis("store:\n  redis:\n    cluster: [redis://10.0.0.1:7000, \"redis://10.0.0.2:7000\"]\n    username: tollgate\n    password: ${REDIS_PW}\n    timeout: 80ms\n");
        assert_eq!(
            r.mode,
            RedisMode::Cluster(vec![
                "redis://10.0.0.1:7000".into(),
                "redis://10.0.0.2:7000".into()
            ])
        );
        assert_eq!(r.username.as_deref(), Some("tollgate"));
        assert_eq!(r.password, Some(Secret("from-env".into())));
        assert_eq!(r.timeout, Duration::from_millis(80));
        assert!(!format!("{r:?}").contains("from-env"), "Debug hides it");

        let r = redis("store:\n  redis:\n    sentinel: { master: cache, nodes: [redis://s1:26379, redis://s2:26379] }\n");
        assert_eq!(
            r.mode,
            RedisMode::Sentinel {
                master: "cache".into(),
                nodes: vec!["redis://s1:26379".into(), "redis://s2:26379".into()]
            }
        );
    }

    #[test]
    fn coalesce_is_off_by_default_and_refused_with_a_cluster() {
        assert!(!redis("store:\n  redis:\n    url: redis://a:1\n").coalesce);
        assert!(redis("store:\n  redis:\n    url: redis://a:1\n    coalesce: true\n").coalesce);
        assert!(
            redis("store:\n  redis:\n    sentinel: { master: m, nodes: [redis://s:1] }\n    coalesce: true\n")
                .coalesce
        );
        let all = errors("store:\n  redis:\n    cluster: [redis://a:1]\n    coalesce: true\n");
        assert!(
            all.contains("t.yaml:6:15: store.redis.coalesce: not available with `cluster`"),
            "{all}"
        );
        let all = errors("store:\n  redis:\n    url: redis://a:1\n    coalesce: sometimes\n");
        assert!(all.contains("t.yaml:6:15"), "{all}");
    }

    #[test]
    fn tls_files_are_read_at_startup() {
        let dir = tempfile::tempdir().unwrap();
        let pem = "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n";
        for name in ["ca.pem", "c.pem", "c.key"] {
            std::fs::write(dir.path().join(name), pem).unwrap();
        }
        let d = dir.path().display();
        let r = redis(&format!("store:\n  redis:\n    url: rediss://cache:6380\n    tls: {{ ca_file: {d}/ca.pem, cert_file: {d}/c.pem, key_file: {d}/c.key }}\n"));
        let tls = r.tls.expect("tls");
        assert_eq!(tls.ca.as_deref(), Some(pem.as_bytes()));
        assert!(tls.client.is_some());

        let all = errors(&format!("store:\n  redis:\n    url: redis://cache:6379\n    tls:\n      ca_file: {d}/missing.pem\n      cert_file: {d}/c.pem\n"));
        for expected in [
            "t.yaml:7:7: store.redis.tls: TLS certificates are set but the URLs say redis://",
            "t.yaml:7:16: store.redis.tls.ca_file: cannot read",
            "store.redis.tls: a client certificate needs both `cert_file` and `key_file`",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
    }

    #[test]
    fn bad_redis_sections_are_refused_with_positions() {
        let all = errors("store:\n  redis:\n    url: redis://a:1\n    cluster: [redis://b:1]\n");
        assert!(
            all.contains("t.yaml:5:5: store.redis: give exactly one of `url`"),
            "{all}"
        );
        let all = errors("store:\n  redis: { key_prefix: x }\n");
        assert!(all.contains("store.redis: give exactly one of"), "{all}");
        let all = errors(
            "store:\n  redis:\n    cluster: [redis://a:1, rediss://b:1, \"http://c:1\"]\n    username: u\n",
        );
        for expected in [
            "t.yaml:5:42: store.redis.cluster[2]: `http://c:1` must start with redis://",
            "store.redis: mix of redis:// and rediss:// URLs",
            "t.yaml:6:15: store.redis.username: an ACL username needs a `password`",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
        let all = errors("store:\n  redis:\n    sentinel: { master: \"\", nodes: [] }\n");
        for expected in [
            "store.redis.sentinel.master: name the master",
            "store.redis.sentinel.nodes: list at least one Sentinel",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
        let all = errors(
            "store:\n  redis:\n    sentinel: { master: m, nodes: [redis://s:1], master_name: x }\n",
        );
        assert!(all.contains("unknown field `master_name`"), "{all}");
        let all = errors("store:\n  redis:\n    url: redis://a:1\n    tls: { ca: x }\n");
        assert!(
            all.contains("unknown field `ca`, expected one of `ca_file`"),
            "{all}"
        );
    }
}

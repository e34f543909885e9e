//! Configuration: raw file → validated runtime config.
//!
//! Loading happens in three steps, each with its own errors, all reported as `FILE:LINE:COL:
//! what is wrong`: environment substitution (`env`), YAML parsing into raw structs with unknown
//! keys refused (`raw`, with `spans` mapping each value to its position), then validation
//! (`validate`, one file per section) into the runtime types (`model`), which hold only values
//! that work (parsed addresses, durations, sizes). The rest of the program never sees raw text.
//!
//! The configuration is the bottom layer of what it describes: it builds the identity and
//! limit engine's runtime types and renders nothing; responses are rendered by
//! `throttle::headers`, and human text (what `check` prints) by `summary`.
//!
//! Inside, dependencies run one way: this file over `validate` over `model`, `raw`, `spans`
//! and `error`; `model` imports none of its siblings.

mod env;
mod error;
mod model;
mod raw;
mod spans;
mod validate;

use std::path::Path;

pub use env::substitute;
pub use error::{ConfigError, ConfigErrors};
pub use model::Usage;
pub use model::{
    AdminHost, Allow, ByResponse, Config, HostMode, Limit, LimitSet, Listener, OnError, OnLimit,
    RedisConfig, RedisMode, RedisTls, ResponseConfig, Route, Scope, Secret, StatusSet, StoreConfig,
    Throttle, Tier, TlsFiles, Upstream, DEFAULT_CONNECT_TIMEOUT, DEFAULT_H2_STREAMS,
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_KEY_PREFIX, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_POOL_IDLE_TIMEOUT, DEFAULT_SHUTDOWN_TIMEOUT, DEFAULT_UPSTREAM_TIMEOUT, MAX_WORKERS,
};
pub use model::{CallerContext, OtlpProtocol, Propagators, Sampling, Traces};
pub use model::{LatencyTarget, Priority, Protect, ProtectMode};
pub use model::{MatchCase, MethodOverride, DEFAULT_UPGRADES, METHOD_OVERRIDE_HEADERS};
use raw::RawConfig;

/// Reads, substitutes, parses and validates the file at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            file: path.to_path_buf(),
            line: 1,
            col: 1,
            message: format!("cannot read the configuration file: {e}"),
        }])
    })?;
    parse(path, &text, |name| std::env::var(name).ok())
}

/// Like [`load`], from text already read (`file` is only used in error messages).
pub fn parse(
    file: &Path,
    text: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Config, ConfigErrors> {
    let at = |line, col, message: String| ConfigError {
        file: file.to_path_buf(),
        line,
        col,
        message,
    };
    let text =
        substitute(text, &env).map_err(|e| ConfigErrors(vec![at(e.line, e.col, e.message)]))?;
    let raw: RawConfig = serde_yaml::from_str(&text).map_err(|e| {
        let (line, col) = e
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((1, 1));
        ConfigErrors(vec![at(line, col, explain_serde_error(&e))])
    })?;
    validate::validate(file, &text, &env, raw).map_err(ConfigErrors)
}

/// serde_yaml's message without its trailing " at line N column M" (we print the position in
/// front, in the `FILE:LINE:COL` form editors understand), with the shapes it could not match
/// spelt out.
fn explain_serde_error(e: &serde_yaml::Error) -> String {
    let text = e.to_string();
    let text = strip_position(&text);
    if text.contains("did not match any variant of untagged enum RawListen") {
        return format!("{text}: `listen` is an address like \"0.0.0.0:8080\" or a list of addresses or {{address, tls: {{cert, key}}}}");
    }
    if text.contains("untagged enum RawMethodOverride") {
        return format!(
            "{text}: `method_override` is true, false or {{ headers: true|false, query: _method }}"
        );
    }
    if text.contains("untagged enum RawKey") {
        return format!("{text}: `key` is an identity name or a list of identity names");
    }
    if text.contains("untagged enum RawSize") {
        return format!("{text}: a size is a number of bytes or text like \"10MiB\"");
    }
    if text.contains("RawSource") || text.contains("unknown variant") {
        return format!("{text} (identity sources are written `- header: NAME`, `- query: NAME`, `- cookie: NAME`, `- bearer: {{}}`, `- jwt: {{claim, secret_env | public_key_file, algorithm}}`, `- path_segment: N`, `- client_ip`)");
    }
    text
}

/// Removes serde_yaml's " at line N column M" wherever it stands in the message.
fn strip_position(text: &str) -> String {
    let Some(start) = text.find(" at line ") else {
        return text.to_string();
    };
    if !text[start..].contains(" column ") {
        return text.to_string();
    }
    let after = &text[start..];
    let end = after
        .find(" column ")
        .map(|c| {
            let digits = after[c + 8..]
                .find(|ch: char| !ch.is_ascii_digit())
                .unwrap_or(after.len() - c - 8);
            c + 8 + digits
        })
        .unwrap_or(after.len());
    strip_position(&format!("{}{}", &text[..start], &after[end..]))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn parse_ok(text: &str) -> Config {
        parse(Path::new("t.yaml"), text, |_| None).unwrap_or_else(|e| panic!("{e}"))
    }

    fn parse_err(text: &str) -> Vec<String> {
        parse(Path::new("t.yaml"), text, |_| None)
            .expect_err("config should be refused")
            .0
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse_ok("listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n");
        assert_eq!(c.listeners.len(), 1);
        assert!(c.listeners[0].tls.is_none());
        assert_eq!(c.upstream.timeout, DEFAULT_UPSTREAM_TIMEOUT);
        assert_eq!(c.upstream.host, HostMode::Preserve);
        assert_eq!(c.upstream.authority.as_str(), "127.0.0.1:3000");
        assert_eq!(c.max_request_body, None);
        assert_eq!(c.shutdown_timeout, DEFAULT_SHUTDOWN_TIMEOUT);
        assert_eq!(c.idle_timeout, DEFAULT_IDLE_TIMEOUT);
    }

    #[test]
    fn idle_timeout_is_a_positive_duration() {
        let base = "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n";
        let c = parse_ok(&format!("{base}idle_timeout: 90s\n"));
        assert_eq!(c.idle_timeout, Duration::from_secs(90));
        let errors = parse_err(&format!("{base}idle_timeout: 0s\n"));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("t.yaml:3:15: idle_timeout: must be greater than zero"),
            "{}",
            errors[0]
        );
        let errors = parse_err(&format!("{base}idle_timeout: forever\n"));
        assert!(errors[0].contains("is not a duration"), "{}", errors[0]);
    }

    #[test]
    fn lingering_close_has_bounds_and_can_be_turned_off() {
        let base = "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n";
        let c = parse_ok(base);
        assert_eq!(c.lingering_close, crate::linger::Bounds::default());
        let c = parse_ok(&format!(
            "{base}lingering_close: {{ time: 10s, timeout: 1s, max_bytes: 1MiB }}\n"
        ));
        let expected = crate::linger::Bounds {
            time: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
            max_bytes: 1024 * 1024,
        };
        assert_eq!(c.lingering_close, expected);
        let c = parse_ok(&format!("{base}lingering_close: {{ time: 0s }}\n"));
        assert!(c.lingering_close.is_off());
        let errors = parse_err(&format!(
            "{base}lingering_close: {{ timeout: 0s, max_bytes: 0 }}\n"
        ));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("lingering_close.timeout: must be greater than zero"));
        assert!(errors[1].contains("lingering_close.max_bytes: must be greater than zero"));
    }

    #[test]
    fn full_core_config_parses() {
        let c = parse_ok(
            "listen:\n  - 127.0.0.1:8080\n  - address: \"[::1]:8443\"\n    tls: { cert: certs/c.pem, key: /k.pem }\n\
             admin: 127.0.0.1:9901\nupstream:\n  url: https://app.internal:8443\n  connect_timeout: 250ms\n  timeout: 1m\n  host: upstream\n  http2: true\n\
             max_request_body: 10MiB\nheader_read_timeout: 5s\nshutdown_timeout: 2s\n",
        );
        assert_eq!(c.listeners.len(), 2);
        let tls = c.listeners[1].tls.as_ref().unwrap();
        assert_eq!(tls.cert, Path::new("certs/c.pem"));
        assert_eq!(tls.key, Path::new("/k.pem"));
        assert_eq!(c.upstream.connect_timeout, Duration::from_millis(250));
        assert_eq!(c.upstream.timeout, Duration::from_secs(60));
        assert_eq!(c.upstream.host, HostMode::Upstream);
        assert!(c.upstream.http2);
        assert_eq!(c.max_request_body, Some(10 * 1024 * 1024));
        assert_eq!(c.header_read_timeout, Duration::from_secs(5));
    }

    #[test]
    fn unknown_keys_are_refused_with_position_and_allowed_keys() {
        let errors =
            parse_err("listen: 127.0.0.1:8080\nupstream:\n  url: http://a:1\n  timout: 3s\n");
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("t.yaml:4:3: "), "{}", errors[0]);
        assert!(
            errors[0].contains("unknown field `timout`"),
            "{}",
            errors[0]
        );
        assert!(errors[0].contains("`timeout`"), "{}", errors[0]);
    }

    #[test]
    fn validation_errors_point_at_the_value() {
        let errors = parse_err(
            "listen: 127.0.0.1:8080\nupstream:\n  url: ftp://a:1\n  timeout: soon\nmax_request_body: lots\n",
        );
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0].starts_with("t.yaml:3:8: upstream.url:"),
            "{}",
            errors[0]
        );
        assert!(
            errors[1].starts_with("t.yaml:4:12: upstream.timeout:"),
            "{}",
            errors[1]
        );
        assert!(errors[1].contains("like 50ms"), "{}", errors[1]);
        assert!(
            errors[2].starts_with("t.yaml:5:19: max_request_body:"),
            "{}",
            errors[2]
        );
    }

    /// An identity is a list of sources or `{ sources, on_invalid }`; `on_invalid` takes
    /// `reject` or `client_ip` and needs a jwt source; mistakes point at the value.
    #[test]
    fn on_invalid_is_an_identity_field() {
        let key = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/identity/rsa_public.pem"
        );
        let with = |identity: &str| {
            format!(
                "listen: 127.0.0.1:8080\nupstream: {{ url: http://a:1 }}\nidentities:\n  user: {identity}\nroutes:\n  - {{ name: api, key: user, limits: [ {{ algorithm: gcra, limit: 1, period: 1s }} ] }}\n"
            )
        };
        let jwt = format!("{{ jwt: {{ public_key_file: \"{key}\" }} }}");
        let user = |config: Config| config.throttle.routes[0].limits[0].key[0].clone();
        let on = |text: &str| parse_ok(&with(text));
        use crate::identity::OnInvalid;
        assert_eq!(
            user(on(&format!("[{jwt}, {{ header: x-user }}]"))).on_invalid,
            OnInvalid::ClientIp
        );
        let full = user(on(&format!(
            "{{ sources: [{jwt}, {{ header: x-user }}], on_invalid: reject }}"
        )));
        assert_eq!(
            (full.on_invalid, full.sources.len()),
            (OnInvalid::Reject, 2)
        );

        let errors = parse_err(&with(&format!("{{ sources: [{jwt}], on_invalid: deny }}")));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("t.yaml:4:")
                && errors[0].contains("identities.user.on_invalid: `deny`"),
            "{}",
            errors[0]
        );
        let errors = parse_err(&with(
            "{ sources: [ { header: x-user } ], on_invalid: reject }",
        ));
        assert!(
            errors[0].contains("only a `jwt` source refuses"),
            "{errors:?}"
        );
        let errors = parse_err(&with("{ sources: [ { header: x } ], on_invalidd: reject }"));
        assert!(
            errors[0].contains("unknown field `on_invalidd`"),
            "{errors:?}"
        );
        let errors = parse_err(&with("{ sources: [ { header: \"a b\" } ] }"));
        assert!(
            errors[0].contains("identities.user.sources[0].header"),
            "{errors:?}"
        );
    }

    #[test]
    fn workers_default_to_one_per_core_and_are_bounded() {
        let base = "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n";
        assert_eq!(parse_ok(base).workers, crate::workers::default_count());
        assert_eq!(parse_ok(&format!("{base}workers: 3\n")).workers, 3);
        for bad in ["0", "257"] {
            let errors = parse_err(&format!("{base}workers: {bad}\n"));
            assert_eq!(
                errors,
                vec![
                    "t.yaml:3:10: workers: must be from 1 to 256 (leave it out for one per core)"
                        .to_string()
                ]
            );
        }
    }

    #[test]
    fn bad_addresses_and_host_modes_are_explained() {
        let errors = parse_err(
            "listen: localhost\nupstream: { url: \"http://a:1/base\", host: client }\nadmin: nope\n",
        );
        let all = errors.join("\n");
        assert!(
            all.contains("t.yaml:1:9: listen: `localhost` is not an address"),
            "{all}"
        );
        assert!(all.contains("must not have a path"), "{all}");
        assert!(all.contains("use `preserve`"), "{all}");
        assert!(all.contains("t.yaml:3:8: admin:"), "{all}");
    }

    /// The admin listener's connection bounds: the proxy listener's timeouts unless given,
    /// a cap of its own; a cap of 0 is refused.
    #[test]
    fn admin_connections_take_the_proxy_timeouts_unless_given() {
        let base = "listen: 127.0.0.1:0\nupstream: { url: \"http://a:1\" }\nheader_read_timeout: 3s\nidle_timeout: 20s\n";
        let c = parse_ok(&format!("{base}admin: 127.0.0.1:9901\n"));
        assert_eq!(
            c.admin_connections,
            model::AdminConnections {
                header_read_timeout: Duration::from_secs(3),
                idle_timeout: Duration::from_secs(20),
                max_connections: model::DEFAULT_ADMIN_MAX_CONNECTIONS,
            }
        );
        let c = parse_ok(&format!(
            "{base}admin: {{ address: 127.0.0.1:9901, header_read_timeout: 1s, idle_timeout: 5s, max_connections: 16 }}\n"
        ));
        assert_eq!(
            c.admin_connections,
            model::AdminConnections {
                header_read_timeout: Duration::from_secs(1),
                idle_timeout: Duration::from_secs(5),
                max_connections: 16,
            }
        );
        let errors = parse_err(&format!(
            "{base}admin: {{ address: 127.0.0.1:9901, max_connections: 0, idle_timeout: 0s }}\n"
        ));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].contains("admin.max_connections: must be at least 1")
                || errors[1].contains("admin.max_connections: must be at least 1"),
            "{errors:?}"
        );
    }

    /// `admin.hosts`: names, `*.` wildcards and pinned ports; anything else is refused at
    /// its position.
    #[test]
    fn admin_hosts_are_host_names_with_an_optional_port() {
        let base = "listen: 127.0.0.1:0\nupstream: { url: \"http://a:1\" }\nadmin:\n  address: 0.0.0.0:9901\n";
        let c = parse_ok(&format!(
            "{base}  hosts: [Tollgate-Admin.Internal., \"*.monitoring.svc\", \"pinned.example:9901\"]\n"
        ));
        let shown: Vec<String> = c.admin_hosts.iter().map(|h| h.to_string()).collect();
        assert_eq!(
            shown,
            [
                "tollgate-admin.internal",
                "*.monitoring.svc",
                "pinned.example:9901"
            ]
        );
        assert!(parse_ok(base).admin_hosts.is_empty());
        let errors = parse_err(&format!(
            "{base}  hosts:\n    - ok.example\n    - \"a b\"\n    - \"name:http\"\n    - \"*.\"\n    - \"x.*.example\"\n"
        ));
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert!(
            errors[0].starts_with("t.yaml:7:7: admin.hosts[1]: `a b` is not a host name"),
            "{}",
            errors[0]
        );
        assert!(
            errors[1].starts_with("t.yaml:8:7: admin.hosts[2]: `name:http` has a port"),
            "{}",
            errors[1]
        );
        assert!(
            errors[2].starts_with("t.yaml:9:7: admin.hosts[3]:"),
            "{}",
            errors[2]
        );
        assert!(
            errors[3].starts_with("t.yaml:10:7: admin.hosts[4]:"),
            "{}",
            errors[3]
        );
    }

    #[test]
    fn method_override_is_a_bool_or_headers_and_a_query_field() {
        let with = |value: &str| {
            format!("listen: 127.0.0.1:0\nupstream: {{ url: \"http://a:1\" }}\nroutes:\n  - name: r\n    match: {{ methods: [GET] }}\n    method_override: {value}\n")
        };
        let of = |value: &str| {
            parse_ok(&with(value)).throttle.routes[0]
                .method_override
                .clone()
        };
        assert_eq!(of("true"), MethodOverride::default());
        assert!(!of("false").is_on());
        let both = of("{ query: _method }");
        assert!(both.headers && both.query.as_deref() == Some("_method"));
        let query = of("{ headers: false, query: _method }");
        assert!(!query.headers && query.is_on());
        let errors = parse_err(&with("{ query: \"a b\" }"));
        assert!(
            errors[0].starts_with("t.yaml:6:")
                && errors[0].contains("routes[0].method_override.query: `a b`"),
            "{errors:?}"
        );
        let errors = parse_err(&with("sometimes"));
        assert!(
            errors[0].contains("`method_override` is true, false or"),
            "{errors:?}"
        );
    }

    #[test]
    fn admin_takes_an_address_or_a_map_with_a_token_from_the_environment() {
        let plain = parse_ok(
            "listen: 127.0.0.1:0\nupstream: { url: \"http://a:1\" }\nadmin: 127.0.0.1:9901\n",
        );
        assert_eq!(plain.admin.unwrap().to_string(), "127.0.0.1:9901");
        assert!(plain.admin_token.is_none());
        let text = "listen: 127.0.0.1:0\nupstream: { url: \"http://a:1\" }\nadmin:\n  address: 0.0.0.0:9901\n  token_env: ADMIN_TOKEN\n";
        let full = parse(Path::new("t.yaml"), text, |name| {
            (name == "ADMIN_TOKEN").then(|| "s3cret".to_string())
        })
        .unwrap();
        assert_eq!(full.admin.unwrap().to_string(), "0.0.0.0:9901");
        assert_eq!(full.admin_token, Some(Secret("s3cret".into())));
        assert!(
            crate::summary::check(&full).contains("need the bearer token"),
            "{}",
            crate::summary::check(&full)
        );
        for env in [None, Some(String::new())] {
            let errors = parse(Path::new("t.yaml"), text, |_| env.clone())
                .expect_err("a missing token is refused")
                .0
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n");
            assert!(
                errors.contains("t.yaml:5:")
                    && errors.contains("admin.token_env: environment variable `ADMIN_TOKEN`"),
                "{errors}"
            );
        }
    }

    #[test]
    fn environment_is_substituted_before_parsing() {
        let c = parse(
            Path::new("t.yaml"),
            "listen: ${ADDR:-127.0.0.1:8081}\nupstream: { url: \"http://${APP}\" }\n",
            |name| (name == "APP").then(|| "10.1.2.3:3000".to_string()),
        )
        .unwrap();
        assert_eq!(c.listeners[0].address.to_string(), "127.0.0.1:8081");
        assert_eq!(c.upstream.authority.as_str(), "10.1.2.3:3000");
        let err = parse(
            Path::new("t.yaml"),
            "listen: a\nupstream: { url: \"${APP}\" }\n",
            |_| None,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "t.yaml:2:19: environment variable `APP` is not set: set it, or give a default with `${APP:-value}`");
    }

    #[test]
    fn yaml_syntax_errors_carry_position() {
        let errors = parse_err("listen: [127.0.0.1:8080\nupstream: {url: x}\n");
        assert!(errors[0].starts_with("t.yaml:"), "{}", errors[0]);
        assert!(!errors[0].contains(" at line "), "{}", errors[0]);
    }
}

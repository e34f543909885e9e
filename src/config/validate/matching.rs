//! Validation of what a route matches beyond path, methods and host: `match.case` and the
//! protocol `upgrades` it lets through. Kept apart from `routes` so that each reads on its own.

use super::validator::{is_plain_name, Validator};
use crate::config::model::{MatchCase, MethodOverride, DEFAULT_UPGRADES};
use crate::config::raw::RawMethodOverride;

/// `match.case`: `sensitive` (default) or `insensitive`.
pub(super) fn case(v: &mut Validator, path: &str, raw: Option<&str>) -> MatchCase {
    match raw.map(str::trim) {
        None | Some("sensitive") => MatchCase::Sensitive,
        Some("insensitive") => MatchCase::Insensitive,
        Some(other) => {
            v.error(
                &format!("{path}.match.case"),
                format!("`{other}` is not a case: write `sensitive` (the default, `/Login` is not `/login`) or `insensitive` (for apps that route `/LOGIN` to `/login`, such as Express)"),
            );
            MatchCase::Sensitive
        }
    }
}

/// The route's path prefix as it is compared: lower-cased when the route ignores case.
pub(super) fn path_prefix(prefix: Option<&String>, case: MatchCase) -> Option<String> {
    prefix.map(|p| match case {
        MatchCase::Sensitive => p.clone(),
        MatchCase::Insensitive => p.to_ascii_lowercase(),
    })
}

/// The route's host as it is compared: lower-case, without surrounding blanks or a trailing
/// dot (`api.example.com.` is the same name).
pub(super) fn host(raw: Option<&String>) -> Option<String> {
    raw.map(|h| {
        let h = h.trim().to_ascii_lowercase();
        match h.strip_suffix('.') {
            Some(without) => without.to_owned(),
            None => h,
        }
    })
}

/// `method_override`: `true` (the default: the override headers), `false`, or
/// `{ headers, query }` to read a query field (`_method`) too, or instead.
pub(super) fn method_override(
    v: &mut Validator,
    path: &str,
    raw: Option<&RawMethodOverride>,
) -> MethodOverride {
    match raw {
        None | Some(RawMethodOverride::On(true)) => MethodOverride::default(),
        Some(RawMethodOverride::On(false)) => MethodOverride {
            headers: false,
            query: None,
        },
        Some(RawMethodOverride::Fields(fields)) => {
            let query = fields.query.as_ref().and_then(|name| {
                let name = name.trim();
                if is_plain_name(name) {
                    Some(name.to_owned())
                } else {
                    v.error(
                        &format!("{path}.method_override.query"),
                        format!("`{name}` is not a query field name: write a name such as `_method` (letters, digits, `_`, `-`, `.`)"),
                    );
                    None
                }
            });
            MethodOverride {
                headers: fields.headers.unwrap_or(true),
                query,
            }
        }
    }
}

/// `upgrades`: protocol names (`websocket`), lower-cased; `websocket` alone when not given.
pub(super) fn upgrades(v: &mut Validator, path: &str, raw: Option<&[String]>) -> Vec<String> {
    let Some(raw) = raw else {
        return DEFAULT_UPGRADES.iter().map(|p| p.to_string()).collect();
    };
    let mut protocols = Vec::with_capacity(raw.len());
    for (i, name) in raw.iter().enumerate() {
        let name = name.trim().to_ascii_lowercase();
        let is_token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !is_token {
            v.error(
                &format!("{path}.upgrades[{i}]"),
                format!("`{name}` is not a protocol name (such as `websocket`); list names without versions"),
            );
        } else if !protocols.contains(&name) {
            protocols.push(name);
        }
    }
    protocols
}

#[cfg(test)]
mod tests {
    use crate::config::{parse, MatchCase};
    use std::path::Path;

    const HEAD: &str = "listen: 127.0.0.1:0\nupstream: { url: http://127.0.0.1:9 }\nroutes:\n";
    const LIMIT: &str = "    limits:\n      - { algorithm: fixed_window, limit: 5, period: 1m }\n";

    fn route(lines: &str) -> Result<crate::config::Config, String> {
        let yaml = format!("{HEAD}  - name: r\n{lines}{LIMIT}");
        parse(Path::new("t.yaml"), &yaml, |_| None).map_err(|e| e.to_string())
    }

    #[test]
    fn case_defaults_to_sensitive_and_an_insensitive_prefix_is_lower_cased() {
        let c = route("    match: { path_prefix: /Login }\n").unwrap();
        let r = &c.throttle.routes[0];
        assert_eq!(r.case, MatchCase::Sensitive);
        assert_eq!(r.path_prefix.as_deref(), Some("/Login"));
        let c = route("    match: { path_prefix: /Login, case: insensitive }\n").unwrap();
        let r = &c.throttle.routes[0];
        assert_eq!(r.case, MatchCase::Insensitive);
        assert_eq!(r.path_prefix.as_deref(), Some("/login"));
        let e = route("    match: { path_prefix: /x, case: ignore }\n").unwrap_err();
        assert!(
            e.contains("t.yaml:5:") && e.contains("routes[0].match.case"),
            "{e}"
        );
    }

    #[test]
    fn upgrades_default_to_websocket_and_must_be_protocol_names() {
        let c = route("").unwrap();
        assert_eq!(c.throttle.routes[0].upgrades, ["websocket"]);
        let c = route("    upgrades: [WebSocket, foo, websocket]\n").unwrap();
        assert_eq!(c.throttle.routes[0].upgrades, ["websocket", "foo"]);
        let c = route("    upgrades: []\n").unwrap();
        assert!(c.throttle.routes[0].upgrades.is_empty());
        let e = route("    upgrades: [websocket/13]\n").unwrap_err();
        assert!(e.contains("routes[0].upgrades[0]"), "{e}");
    }

    #[test]
    fn a_host_is_compared_without_its_trailing_dot() {
        let c = route("    match: { host: API.example.com. }\n").unwrap();
        assert_eq!(
            c.throttle.routes[0].host.as_deref(),
            Some("api.example.com")
        );
    }
}

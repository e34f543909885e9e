//! Validation of `usage`: the path a caller reads its own usage at. It is answered before
//! routing, so it takes precedence over every route; a path that would swallow the whole site
//! (`/`) or could never match a request's path is refused.

use super::validator::Validator;
use crate::config::model::Usage;
use crate::config::raw::RawUsage;

pub(super) fn usage(v: &mut Validator, raw: Option<&RawUsage>) -> Option<Usage> {
    let raw = raw?;
    let path = raw.path.as_str();
    let problem = if !path.starts_with('/') {
        Some("must start with `/` (for example /_quota)")
    } else if path == "/" {
        Some("`/` would answer every request to the site's root: use a path of its own, such as /_quota")
    } else if path.contains(['?', '#']) {
        Some("is matched against the request's path alone: leave out `?` and `#`")
    } else if path.parse::<http::uri::PathAndQuery>().is_err()
        || path.bytes().any(|b| b.is_ascii_whitespace() || b == b'%')
    {
        Some("is not a plain URL path: use letters, digits and `/_-.~` (no spaces or percent-escapes)")
    } else {
        None
    };
    match problem {
        Some(message) => {
            v.error("usage.path", message);
            None
        }
        None => Some(Usage {
            path: path.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{parse, Config, Usage};

    const BASE: &str = "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n";

    fn parsed(extra: &str) -> Result<Config, String> {
        parse(Path::new("t.yaml"), &format!("{BASE}{extra}"), |_| None).map_err(|e| e.to_string())
    }

    #[test]
    fn usage_is_off_unless_configured() {
        let off = parsed("").unwrap();
        assert_eq!(off.usage, None);
        assert!(!crate::summary::check(&off).contains("usage"));
        let on = parsed("usage: { path: /_quota }\n").unwrap();
        assert_eq!(
            on.usage,
            Some(Usage {
                path: "/_quota".into()
            })
        );
        // `check` says what the path does and its own rate.
        assert!(
            crate::summary::check(&on).contains(
                "\nusage     GET /_quota answers a caller its own usage (never forwarded; at most 10 per 10s per client address)\n"
            ),
            "{}",
            crate::summary::check(&on)
        );
    }

    #[test]
    fn a_path_that_cannot_work_is_refused_where_it_stands() {
        for (path, message) in [
            ("_quota", "must start with `/`"),
            ("/", "`/` would answer every request"),
            ("\"/_quota?x=1\"", "leave out `?` and `#`"),
            ("\"/my quota\"", "is not a plain URL path"),
            ("/%71uota", "is not a plain URL path"),
        ] {
            let error = parsed(&format!("usage:\n  path: {path}\n")).expect_err(path);
            assert!(
                error.contains("t.yaml:4:9: usage.path: ") && error.contains(message),
                "{path}: {error}"
            );
        }
        let error = parsed("usage: { path: /q, methods: [GET] }\n").expect_err("unknown field");
        assert!(error.contains("unknown field `methods`"), "{error}");
    }
}

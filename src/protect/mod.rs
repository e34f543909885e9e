//! `protect`: keeps the app alive under overload. Rate limits keep each caller fair; they do
//! not keep the app from drowning when it slows down or when many fair callers arrive at once.
//! Here an adaptive concurrency limit (`controller`) decides how many requests the app gets at
//! once, from its own latency and errors, and a priority gate (`gate`) holds the rest briefly,
//! serves the most important first and sheds the least important when it must.
//!
//! The proxy calls it after the limit stage (a caller over its quota never takes a slot) and
//! before forwarding; with no `protect` section none of this exists on the request path.
//! See docs/algorithms.md for the controller's rules and why.

mod controller;
mod gate;

pub use controller::{Cause, Cut, Paced, Reading, Sample, Settings, State};
pub use gate::{Admission, ProtectMetrics, Protector, Slot, Snapshot, Ticket};

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use crate::config::{parse, Config, Priority};

    fn config(extra: &str) -> Config {
        let yaml = format!("listen: 127.0.0.1:0\nupstream: {{ url: http://127.0.0.1:9 }}\n{extra}");
        parse(Path::new("t.yaml"), &yaml, |_| None).unwrap_or_else(|e| panic!("{e}"))
    }

    const ROUTES: &str = "identities:\n  key:\n    - header: X-Key\nroutes:\n  - name: urgent\n    match: { headers: { X-Priority: high } }\n    priority: high\n  - name: api\n    match: { path_prefix: /api/ }\n    key: key\n    priority: low\n    limits:\n      - { algorithm: fixed_window, limit: 5, period: 1m }\n    overrides:\n      - { values: [gold], priority: critical }\n";

    #[test]
    fn explain_shows_a_requests_priority_with_protect_only() {
        let explained = |config: &Config, path: &str, headers: &[&str]| {
            let described = crate::explain::Described {
                method: "GET".into(),
                url: path.into(),
                headers: headers.iter().map(|h| h.to_string()).collect(),
                peer: "192.0.2.1".parse().unwrap(),
            };
            let parts = crate::explain::request_parts(&described).unwrap();
            crate::explain::explain(config, &parts, described.peer)
        };
        let protected = config(&format!("protect: {{}}\n{ROUTES}"));
        let cases = [
            ("/x", &[][..], Priority::Normal),
            ("/x", &["X-Priority: high"][..], Priority::High),
            ("/api/a", &["X-Key: k"][..], Priority::Low),
            ("/api/a", &["X-Key: gold"][..], Priority::Critical),
        ];
        for (path, headers, priority) in cases {
            let explanation = explained(&protected, path, headers);
            assert_eq!(explanation.priority, Some(priority), "{path} {headers:?}");
            assert!(explanation
                .text()
                .contains(&format!("\npriority  {priority} (")));
            assert_eq!(explanation.json()["priority"], priority.as_str());
        }
        let unprotected = config(ROUTES);
        let explanation = explained(&unprotected, "/x", &["X-Priority: high"]);
        assert_eq!(explanation.priority, None);
        assert!(explanation.json().get("priority").is_none());
    }

    #[tokio::test]
    async fn a_reload_keeps_the_learned_state_while_protect_stays() {
        let proxy = crate::proxy::Proxy::new(Arc::new(config("protect: { max_limit: 50 }\n")));
        let before = proxy.protector().expect("protect is on");
        proxy.reload(config("protect: { max_limit: 10, mode: shadow }\n"));
        let after = proxy.protector().expect("protect is on");
        assert!(Arc::ptr_eq(&before, &after), "the same controller and gate");
        let snapshot = after.snapshot();
        assert_eq!(snapshot.settings.max_limit, 10.0);
        assert_eq!(
            snapshot.limit, 10,
            "the learned limit within the new bounds"
        );
        assert_eq!(snapshot.mode, crate::config::ProtectMode::Shadow);
        proxy.reload(config(""));
        assert!(proxy.protector().is_none(), "off without the section");
        proxy.reload(config("protect: {}\n"));
        assert!(!Arc::ptr_eq(&before, &proxy.protector().unwrap()));
    }
}

//! Validation of an allow-list (the global `allow` or a route's): client addresses and
//! identity values whose callers are never limited.

use std::sync::Arc;

use super::identities::{lookup, parse_net};
use super::validator::Validator;
use crate::config::model::Allow;
use crate::config::raw::RawAllow;
use crate::identity::Identity;

pub(super) fn allow(
    v: &mut Validator,
    path: &str,
    raw: Option<&RawAllow>,
    identities: &[Arc<Identity>],
) -> Allow {
    let Some(raw) = raw else {
        return Allow::default();
    };
    let mut allow = Allow::default();
    for (i, text) in raw.client_ips.iter().enumerate() {
        match parse_net(text) {
            Some(net) => allow.client_ips.push(net),
            None => v.error(
                &format!("{path}.client_ips[{i}]"),
                format!(
                    "`{text}` is not a CIDR or IP address: write e.g. 10.0.0.0/8 or 192.168.1.10"
                ),
            ),
        }
    }
    for (name, values) in &raw.identities.0 {
        let at = format!("{path}.identities.{name}");
        if let Some(identity) = lookup(v, &at, name, identities) {
            allow.identities.push((identity, values.clone()));
        }
    }
    allow
}

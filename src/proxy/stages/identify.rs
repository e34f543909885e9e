//! The identify stage: who the caller is on a route (see `identity::caller`), and what
//! tollgate answers a caller an identity refuses: 401 for a bearer token refused by an
//! identity with `on_invalid: reject`, 400 for a request an identity cannot read one way.

use std::net::IpAddr;

use http::request::Parts;

use crate::answers::Answer;
use crate::identity::{self, caller::Caller};
use crate::proxy::record::RequestRecord;
use crate::proxy::runtime::Runtime;
use crate::routing::Routed;

/// The caller of `parts` on `routed`, its refused credentials counted in that route's metrics.
pub fn identify<'r>(
    runtime: &'r Runtime,
    parts: &'r Parts,
    peer: IpAddr,
    routed: Routed<'_>,
) -> Caller<'r> {
    identity::caller::identify(parts, peer, &runtime.config.throttle.trusted_proxies)
        .counting_refusals_in(&runtime.route_metrics[routed.index].refusals)
}

/// The identify stage's refusal of a caller (`refusal`, found as the limit stage keyed it),
/// recorded, and its answer: 401, or 400 for a request an identity cannot read one way.
pub fn refuse(refusal: identity::Refusal, record: &mut RequestRecord<'_>) -> Box<Answer<'static>> {
    record.identify_refused(refusal);
    Box::new(match refusal {
        // Not a refused token: a request the identity cannot read one way, malformed (400)
        // like the shapes refused before routing.
        identity::Refusal::Ambiguous(what) => Answer::Malformed(what.detail()),
        refusal => Answer::Unauthorized(refusal),
    })
}

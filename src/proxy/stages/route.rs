//! The route stage: the route of the request's own method, and the others a method it names
//! in an override reaches (counted too: the app may serve the request as that method).

use http::request::Parts;

use crate::proxy::record::RequestRecord;
use crate::proxy::runtime::Runtime;
use crate::routing::{self, Routed};

/// The routes a request is limited on.
pub struct Routes<'c> {
    /// Its own route (or, without one, the first an override reaches); None: unlimited.
    pub routed: Option<Routed<'c>>,
    /// The routes reached only by an override (empty without one: no allocation).
    pub also: Vec<Routed<'c>>,
}

/// The routes of `parts`, recorded (the request is counted in its route's metrics).
pub fn route<'a>(
    runtime: &'a Runtime,
    parts: &Parts,
    record: &mut RequestRecord<'a>,
) -> Routes<'a> {
    let (routed, also) = routing::routes_of(&runtime.config.throttle.routes, parts);
    record.routed(routed);
    Routes { routed, also }
}

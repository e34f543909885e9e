//! The limit stage: each route a request is limited on decides it (see `throttle`), the routes
//! reached only by an override first, so that a caller over one of them is refused before its
//! own route takes anything. A limited caller is recorded for the operators' `/limits/top` and
//! recent denials; every outcome feeds the record of callers' rates (`suggest`).

use std::net::IpAddr;

use http::request::Parts;

use super::identify;
use super::route::Routes;
use crate::answers::Answer;
use crate::proxy::exchange::Holdings;
use crate::proxy::record::RequestRecord;
use crate::proxy::runtime::Runtime;
use crate::routing::Routed;
use crate::throttle::{Admitted, LimitOutcome};

/// What tollgate answers instead of forwarding, boxed: the rare case stays out of the common
/// result's size.
pub type Refused<'a> = Box<Answer<'a>>;

/// The limit stage: the admitted request's obligations (None without a route), or the answer
/// to a refused one.
pub async fn limit<'a>(
    runtime: &'a Runtime,
    routes: Routes<'a>,
    parts: &Parts,
    peer: IpAddr,
    record: &mut RequestRecord<'a>,
) -> Result<Option<Admitted<'a>>, Refused<'a>> {
    let Some(routed) = routes.routed else {
        return Ok(None);
    };
    // A route without limits, tiers or allow lists: admitted as the store path below would
    // admit it (identity "none", nothing decided, nothing owed), without identifying the
    // caller or building the decision's future.
    if routes.also.is_empty() && runtime.limits.decides_nothing(routed.route) {
        let outcome = crate::throttle::admitted_undecided(
            &routed.route.limits,
            "none",
            crate::throttle::AdmitReason::Decided,
        );
        record.decided(&outcome);
        return match outcome {
            LimitOutcome::Admitted(admitted) => Ok(Some(admitted)),
            _ => unreachable!("admitted_undecided admits"),
        };
    }
    // Boxed: the rare case, whose future would otherwise size every request's.
    let also_held = match routes.also.is_empty() {
        true => Holdings::default(),
        false => Box::pin(limit_also(runtime, routes.also, parts, peer, record)).await?,
    };
    let caller = identify::identify(runtime, parts, peer, routed);
    let limiting = match runtime.limits.limit(routed.route, caller) {
        Ok(limiting) => limiting,
        Err(refusal) => return Err(identify::refuse(refusal, record)),
    };
    // A recorded trace times the store's call (its Redis span); boxed, as the rarer case
    // whose future would otherwise size every request's.
    let outcome = match record.round_trip() {
        Some(clock) => Box::pin(crate::traces::round_trip::timed(clock, limiting)).await,
        None => limiting.await,
    };
    record.decided(&outcome);
    record.store_cause(|| runtime.limits.stores().cause());
    let mut admitted = admitted_or_refused(runtime, outcome, routed, parts, peer)?;
    if !also_held.is_empty() {
        let mut held = Holdings::take_from(&mut admitted);
        held.join(also_held);
        admitted.leases = held.leases;
        admitted.settlement = held.settlement;
    }
    Ok(Some(admitted))
}

/// The routes reached only by an override, decided one by one: what they hold, or the answer
/// to the first that refuses (the request then counted on that route).
async fn limit_also<'a>(
    runtime: &'a Runtime,
    also: Vec<Routed<'a>>,
    parts: &Parts,
    peer: IpAddr,
    record: &mut RequestRecord<'a>,
) -> Result<Holdings, Refused<'a>> {
    let mut held = Holdings::default();
    for other in also {
        let caller = identify::identify(runtime, parts, peer, other);
        let decided = match runtime.limits.limit(other.route, caller) {
            Ok(limiting) => {
                let outcome = match record.round_trip() {
                    Some(clock) => crate::traces::round_trip::timed(clock, limiting).await,
                    None => limiting.await,
                };
                record.decided(&outcome);
                record.store_cause(|| runtime.limits.stores().cause());
                admitted_or_refused(runtime, outcome, other, parts, peer)
            }
            Err(refusal) => Err(identify::refuse(refusal, record)),
        };
        match decided {
            Ok(mut admitted) => held.join(Holdings::take_from(&mut admitted)),
            Err(refused) => {
                record.routed(Some(other));
                return Err(refused);
            }
        }
    }
    Ok(held)
}

/// An admitted request (its obligations counted in its route's metrics), or the answer to one
/// that was not; a limited caller is recorded for `/limits/top` and recent denials.
fn admitted_or_refused<'a>(
    runtime: &'a Runtime,
    outcome: LimitOutcome<'a>,
    routed: Routed<'_>,
    parts: &Parts,
    peer: IpAddr,
) -> Result<Admitted<'a>, Refused<'a>> {
    let throttle = &runtime.config.throttle;
    runtime.suggest.observe(&throttle.key_prefix, &outcome);
    match outcome {
        LimitOutcome::Admitted(admitted) => Ok(owed(runtime, admitted, routed)),
        LimitOutcome::Limited(limited) => {
            // Read here, on a denial only: the admitted path pays nothing for the networks.
            let client =
                crate::identity::client_ip(peer, &parts.headers, &throttle.trusted_proxies);
            let limit = crate::control::denials::refusing_limit(&limited);
            runtime.offenders.record_denial(
                &throttle.key_prefix,
                limited.set,
                &limited.key,
                limit.map(|l| l.name.as_str()),
                client,
            );
            runtime
                .offenders
                .recent()
                .record(&throttle.key_prefix, &limited);
            Err(Box::new(Answer::Limited(&throttle.response, limited)))
        }
        LimitOutcome::StoreUnavailable { .. } => Err(Box::new(Answer::StoreUnavailable)),
    }
}

/// An admitted request's obligations, counted in its route's metrics from now on (a
/// settlement dropped because the client left is counted too).
fn owed<'a>(runtime: &Runtime, mut admitted: Admitted<'a>, routed: Routed<'_>) -> Admitted<'a> {
    if let Some(settlement) = admitted.settlement.as_mut() {
        settlement.count_in(&runtime.route_metrics[routed.index].settlement);
    }
    admitted
}

//! What the request path runs on: the proxy's shared state ([`Inner`]) and everything built
//! from one configuration ([`Runtime`]), swapped whole on a reload while each request keeps
//! the snapshot it started with. The stages read it; none of them builds it.

use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio_util::task::TaskTracker;

use super::upstream::UpstreamClient;
use crate::config::Config;
use crate::control::offenders::Offenders;
use crate::control::{caller, sync};
use crate::metrics::{Metrics, RouteMetrics};
use crate::protect::Protector;
use crate::routing::Routed;
use crate::store::Stores;
use crate::throttle::LimitStage;

pub struct Inner {
    /// Swapped whole on a reload; each request keeps the snapshot it started with.
    pub runtime: ArcSwap<Runtime>,
    pub metrics: Arc<Metrics>,
    /// Upgraded (WebSocket) connections: hyper's graceful shutdown no longer sees them, so
    /// shutdown waits on this instead.
    pub tunnels: TaskTracker,
    /// Upstream exchanges (and response bodies) whose client left while they held
    /// something for the limits (see `exchange`): shutdown waits for them too.
    pub orphans: TaskTracker,
    /// The usage endpoint's own rate, kept over reloads.
    pub usage_rate: crate::usage::OwnRate,
    /// Trace export (`tracing`); None: off, and no request builds a span.
    pub tracing: Option<Arc<crate::traces::Tracing>>,
}

/// Everything built from one configuration.
pub struct Runtime {
    pub config: Arc<Config>,
    pub upstream: UpstreamClient,
    pub limits: LimitStage,
    /// Who is denied most (the admin's `/limits/top`); carried over reloads with the stores.
    pub offenders: Arc<Offenders>,
    /// Callers' peak rates per route (`/limits/suggest`); carried over reloads as the sketch.
    pub suggest: Arc<crate::suggest::Suggest>,
    /// The rounds of local-first limits, when any (the limit stage holds their engine).
    pub local_first: Option<Arc<sync::Sync>>,
    /// One per route, in route order.
    pub route_metrics: Vec<RouteMetrics>,
    pub unrouted_metrics: RouteMetrics,
    /// The app's protection (`protect`): carried over reloads with what it learned.
    pub protect: Option<Arc<Protector>>,
    /// The Redis node decisions go to, as traces name it.
    pub trace_redis: Option<Arc<str>>,
    /// Per route, in route order: whether an identity it uses (its limits', its tiers', its
    /// allow-list's or the global allow-list's) names a form field. None: no route does, and
    /// no request's body is read.
    pub reads_form: Option<Box<[bool]>>,
}

impl Runtime {
    pub fn new(config: Arc<Config>, metrics: &Metrics, previous: Option<&Runtime>) -> Runtime {
        let upstream = match previous {
            Some(p) if p.config.upstream == config.upstream => p.upstream.clone(),
            _ => UpstreamClient::new(&config.upstream, config.workers),
        };
        let throttle = &config.throttle;
        let stores = Stores::new(
            &throttle.store,
            throttle.on_error,
            previous.map(|p| p.limits.stores()),
        );
        if stores.is_shared() {
            let overrides = crate::control::overrides::hash_key(&throttle.key_prefix);
            stores.persistence().configure(throttle, overrides);
        }
        // The offenders sketch and the local-first rounds go on only with the stores they
        // counted on.
        let carried = previous.filter(|p| stores.carried_from(p.limits.stores()));
        // Registered whether or not a limit is local-first, so the dashboard's panels always
        // have their series.
        let sync_metrics = metrics.sync(throttle);
        let local_first = sync::carry_or_start(
            throttle,
            &stores,
            carried.and_then(|p| p.local_first.as_ref()),
            sync_metrics,
        );
        let offenders = carried.map_or_else(Arc::default, |p| p.offenders.clone());
        // With Redis, the sketch publishes for the fleet's `/limits/top` under this prefix.
        offenders.link(stores.shared_slot(), &throttle.key_prefix);
        // Carried only under the same key prefix: its caller hashes are keyed from it.
        let suggest = carried
            .filter(|p| p.suggest.prefix() == throttle.key_prefix)
            .map_or_else(
                || Arc::new(crate::suggest::Suggest::new(&throttle.key_prefix)),
                |p| p.suggest.clone(),
            );
        suggest.link(stores.shared_slot(), &throttle.key_prefix);
        let denials = caller::new_deny_cache(&stores, &throttle.key_prefix);
        let overrides = crate::control::overrides::new_overrides(&stores, throttle);
        let limits = LimitStage::new(
            throttle.clone(),
            stores,
            denials,
            local_first.as_ref().map(|rounds| rounds.engine.clone()),
        )
        .with_overrides(overrides);
        let route_metrics = config
            .throttle
            .routes
            .iter()
            .map(|r| metrics.route(&r.name))
            .collect();
        let protect = config.protect.as_ref().map(|settings| {
            match previous.and_then(|p| p.protect.as_ref()) {
                Some(carried) => {
                    carried.reconfigure(settings);
                    carried.clone()
                }
                None => Protector::new(settings, metrics.protect()),
            }
        });
        let reads_form = reads_form(&config);
        Runtime {
            reads_form,
            trace_redis: crate::traces::redis_node(&throttle.store),
            upstream,
            limits,
            protect,
            offenders,
            suggest,
            local_first,
            route_metrics,
            unrouted_metrics: metrics.route(crate::metrics::UNROUTED),
            config,
        }
    }
}

/// [`Runtime::reads_form`] of `config`.
fn reads_form(config: &Config) -> Option<Box<[bool]>> {
    use crate::identity::reads_form as reads;
    let throttle = &config.throttle;
    let keyed = |limits: &crate::config::LimitSet| {
        limits.iter().flat_map(|limit| &limit.key).any(|i| reads(i))
    };
    let global = throttle.allow.identities.iter().any(|(i, _)| reads(i));
    let per_route: Box<[bool]> = throttle
        .routes
        .iter()
        .map(|route| {
            global
                || keyed(&route.limits)
                || route.allow.identities.iter().any(|(i, _)| reads(i))
                || route
                    .tiers
                    .iter()
                    .any(|tier| reads(&tier.identity) || keyed(&tier.limits))
        })
        .collect();
    per_route.contains(&true).then_some(per_route)
}

impl Runtime {
    /// The metrics a request is counted in: its route's, or the unrouted ones.
    pub fn route_metrics(&self, routed: Option<Routed<'_>>) -> &RouteMetrics {
        match routed {
            Some(routed) => &self.route_metrics[routed.index],
            None => &self.unrouted_metrics,
        }
    }
}

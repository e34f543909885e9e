//! The identify stage of the request path: who is calling. A [`Caller`] is the request with
//! its client IP and one memo of the identities evaluated for it, shared by everything that
//! asks (allow-lists, tiers, store keys), so each identity is evaluated at most once per
//! request however many of them name it: a JWT that picks a tier and keys a limit is verified
//! once.
//!
//! A credential an identity refuses (see `Identity::identify`) is logged and counted once, when
//! that identity is evaluated; under `on_invalid: reject` the caller is then rejected
//! ([`Caller::rejected`]), which the limit stage answers with 401. A request an identity cannot
//! read one way ([`super::Ambiguity`]) is rejected whatever `on_invalid` says, and answered 400.
//!
//! Identities are told apart by address: the configuration holds each one in a single `Arc`
//! that every allow-list, tier and limit naming it shares, and it outlives the request.

use std::net::IpAddr;
use std::sync::Arc;

use http::request::Parts;

use metrics::Counter;

use super::client_ip::{client_ip, key_address, TrustedProxies, DEFAULT_IPV6_PREFIX};
use super::{Identified, Identity, OnInvalid, Refusal};

/// Counters of refused credentials, by what the identity's `on_invalid` made of them.
#[derive(Clone)]
pub struct RefusalCounters {
    /// Keyed by client IP for the request.
    pub client_ip: Counter,
    /// Answered 401.
    pub reject: Counter,
}

/// Identities remembered without a vector: enough for a tier or allow-list identity beside the
/// one a route's limits are keyed on.
const INLINE: usize = 2;

/// What the identify stage adds to a routed request: the client IP and the identities
/// evaluated so far.
pub struct Caller<'r> {
    pub request: &'r Parts,
    /// The client's address (X-Forwarded-For resolved behind trusted proxies): what
    /// allow-lists compare.
    pub ip: IpAddr,
    /// The address its client_ip keys are made of (IPv6 grouped by `client_ip.ipv6_prefix`).
    key_ip: IpAddr,
    /// The first identities evaluated, by address (see the module docs).
    inline: [Option<(usize, Identified)>; INLINE],
    /// Any beyond those.
    more: Vec<(usize, Identified)>,
    /// Where refused credentials are counted.
    refusals: Option<&'r RefusalCounters>,
    /// Why the caller's credential was refused by an identity whose `on_invalid` is `reject`.
    rejected: Option<Refusal>,
    #[cfg(test)]
    evaluations: usize,
}

/// Identifies the caller of `request`, which came from `peer`: its client IP now, each identity
/// when it is first asked for.
pub fn identify<'r>(request: &'r Parts, peer: IpAddr, trusted: &TrustedProxies) -> Caller<'r> {
    let ip = client_ip(peer, &request.headers, trusted);
    Caller::grouped(request, ip, trusted.ipv6_prefix())
}

impl<'r> Caller<'r> {
    /// The caller of `request` whose client IP is `ip` (IPv6 keyed by its /64).
    pub fn new(request: &'r Parts, ip: IpAddr) -> Caller<'r> {
        Caller::grouped(request, ip, DEFAULT_IPV6_PREFIX)
    }

    /// The caller of `request` whose client IP is `ip`, IPv6 keyed by its first
    /// `ipv6_prefix` bits.
    pub fn grouped(request: &'r Parts, ip: IpAddr, ipv6_prefix: u8) -> Caller<'r> {
        Caller {
            request,
            ip,
            key_ip: key_address(ip, ipv6_prefix),
            inline: [None, None],
            more: Vec::new(),
            refusals: None,
            rejected: None,
            #[cfg(test)]
            evaluations: 0,
        }
    }

    /// The address the caller's client_ip keys are made of.
    pub fn key_ip(&self) -> IpAddr {
        self.key_ip
    }

    /// How `identity` identifies the caller: evaluated on the first call, remembered after.
    pub fn identified(&mut self, identity: &Arc<Identity>) -> &Identified {
        let id = Arc::as_ptr(identity) as usize;
        let at = match self.position(id) {
            Some(at) => at,
            None => {
                #[cfg(test)]
                {
                    self.evaluations += 1;
                }
                let identified = identity.identify(self.request, self.key_ip);
                if let Some(why) = identified.refused {
                    self.refused(identity, why);
                }
                match self.inline.iter().position(Option::is_none) {
                    Some(free) => {
                        self.inline[free] = Some((id, identified));
                        free
                    }
                    None => {
                        self.more.push((id, identified));
                        INLINE + self.more.len() - 1
                    }
                }
            }
        };
        match self.inline.get(at) {
            Some(slot) => &slot.as_ref().expect("a filled slot").1,
            None => &self.more[at - INLINE].1,
        }
    }

    /// The caller as before, its refused credentials counted in `counters`.
    pub fn counting_refusals_in(mut self, counters: &'r RefusalCounters) -> Self {
        self.refusals = Some(counters);
        self
    }

    /// Why the caller is to be refused (401): a credential refused by an identity whose
    /// `on_invalid` is `reject`, among the identities evaluated so far; or (400) a value an
    /// identity cannot read one way ([`Refusal::Ambiguous`]).
    pub fn rejected(&self) -> Option<Refusal> {
        self.rejected
    }

    fn refused(&mut self, identity: &Identity, why: Refusal) {
        if let Refusal::Ambiguous(what) = why {
            // Not a credential refused but a request no app reads one way: refused (400)
            // whatever `on_invalid` says, and not counted as a refused credential.
            tracing::info!(
                identity = %identity.name,
                reason = what.as_str(),
                client_ip = %self.ip,
                "ambiguous identity refused"
            );
            self.rejected.get_or_insert(why);
            return;
        }
        tracing::info!(
            identity = %identity.name,
            reason = why.as_str(),
            on_invalid = identity.on_invalid.as_str(),
            client_ip = %self.ip,
            "credential refused"
        );
        match identity.on_invalid {
            OnInvalid::ClientIp => {
                if let Some(counters) = self.refusals {
                    counters.client_ip.increment(1);
                }
            }
            OnInvalid::Reject => {
                if let Some(counters) = self.refusals {
                    counters.reject.increment(1);
                }
                self.rejected.get_or_insert(why);
            }
        }
    }

    fn position(&self, id: usize) -> Option<usize> {
        let inline = self
            .inline
            .iter()
            .map_while(Option::as_ref)
            .position(|(seen, _)| *seen == id);
        inline.or_else(|| {
            self.more
                .iter()
                .position(|(seen, _)| *seen == id)
                .map(|at| INLINE + at)
        })
    }

    /// How many identities were evaluated (each at most once).
    #[cfg(test)]
    pub fn evaluations(&self) -> usize {
        self.evaluations
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{OnInvalid, Source};

    #[test]
    fn each_identity_is_evaluated_once_however_often_it_is_asked_for() {
        let request = http::Request::get("/x")
            .header("x-user", "alice")
            .header("x-team", "red")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let by = |name: &'static str| {
            Arc::new(Identity {
                name: name.into(),
                sources: vec![Source::Header(http::HeaderName::from_static(name))],
                on_invalid: OnInvalid::default(),
                display: None,
            })
        };
        let (user, team, org) = (by("x-user"), by("x-team"), by("x-org"));
        let mut caller = Caller::new(&request, "192.0.2.1".parse().unwrap());
        for _ in 0..3 {
            assert_eq!(caller.identified(&user).key_part, "header=alice");
            assert_eq!(caller.identified(&team).key_part, "header=red");
            assert_eq!(caller.identified(&org).source_kind, "client_ip");
        }
        assert_eq!(caller.evaluations(), 3);
        // The same identity in another Arc is another identity (configurations share one).
        caller.identified(&by("x-user"));
        assert_eq!(caller.evaluations(), 4);
    }
}

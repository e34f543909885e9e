//! The forward stage: the request as the upstream receives it (`outbound`), sent through
//! `exchange` so that what it holds for its limits (and its overload slot) stays held until the
//! app answered, even if the client leaves first, and the upstream's answer as the client
//! receives it (`inbound`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri, Version};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::body::{self, LimitedBody, ProxyBody};
use crate::config::{Config, HostMode, Upstream};
use crate::error::ProxyError;
use crate::protect::Slot;
use crate::proxy::answer_body::AnswerBody;
use crate::proxy::exchange::{self, Holdings, UntilHead};
use crate::proxy::headers::{self, Found};
use crate::proxy::record::RequestRecord;
use crate::proxy::runtime::{Inner, Runtime};
use crate::proxy::upstream;
use crate::routing::Routed;
use crate::throttle::settle::Delivery;
use crate::throttle::Admitted;

/// What the server knows about the connection a request came in on.
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    pub tls: bool,
}

/// The request as it came in, to be forwarded.
pub struct Incoming<'r, B> {
    pub parts: Parts,
    pub body: B,
    /// The one pass over its headers (see `headers::scan`).
    pub found: Found,
    pub conn: ConnInfo,
    /// Its route (None: forwarded unlimited).
    pub routed: Option<Routed<'r>>,
}

impl<'r, B> Incoming<'r, B> {
    pub fn new(
        parts: Parts,
        body: B,
        found: Found,
        conn: ConnInfo,
        routed: Option<Routed<'r>>,
    ) -> Self {
        Incoming {
            parts,
            body,
            found,
            conn,
            routed,
        }
    }
}

/// The forward stage's result.
pub struct Forwarded {
    /// The upstream's answer as the client receives it, or why there is none.
    pub response: Result<Response<AnswerBody>, ProxyError>,
    /// What the request still holds for its limits: settled and released by the respond stage.
    pub holdings: Holdings,
    /// How the exchange ended, for the settlement.
    pub outcome: Delivery,
}

/// Forwards `incoming` on its route, holding what `admitted` holds for its limits and the
/// overload `slot` until the app answered.
pub async fn forward<B>(
    inner: &Inner,
    runtime: &Runtime,
    incoming: Incoming<'_, B>,
    admitted: Option<&mut Admitted<'_>>,
    slot: Option<Slot>,
    record: &mut RequestRecord<'_>,
) -> Forwarded
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<body::BoxError>,
{
    let config = &runtime.config;
    let routed = incoming.routed;
    // Without a route nothing happened since the start worth a clock read of its own.
    let upstream_started = match routed {
        Some(_) => Instant::now(),
        None => record.started(),
    };
    let mut holdings = admitted.map_or_else(Holdings::default, Holdings::take_from);
    // The slot is the app's until its head arrives, not until the body ends.
    holdings.until_head = slot.map(|slot| Box::new(slot) as Box<dyn UntilHead>);
    let peer_is_trusted = config
        .throttle
        .trusted_proxies
        .contains(incoming.conn.peer.ip());
    let upgrades = routed.map(|r| &r.route.upgrades[..]);
    let (response, outcome) = match outbound(config, incoming, peer_is_trusted, upgrades) {
        Ok((mut upstream_request, returning)) => {
            record.sending(upstream_request.headers_mut());
            let sending = runtime.upstream.send(upstream_request);
            let drain_for = runtime.upstream.timeout();
            let answered;
            (answered, holdings) =
                exchange::exchange(sending, holdings, &inner.orphans, drain_for).await;
            let outcome = exchange::outcome_of(&answered);
            (inbound(&inner.tunnels, returning, answered), outcome)
        }
        Err(error) => (Err(error), Delivery::NotSent),
    };
    let status = response.as_ref().ok().map(Response::status);
    record.forwarded(upstream_started.elapsed(), status);
    Forwarded {
        response,
        holdings,
        outcome,
    }
}

/// The upstream's answer as the client receives it: a refused oversized upload as 413, a
/// switch of protocols with its tunnel started, hop-by-hop headers removed.
fn inbound(
    tunnels: &TaskTracker,
    returning: Returning,
    answered: Result<Response<upstream::UpstreamBody>, ProxyError>,
) -> Result<Response<AnswerBody>, ProxyError> {
    let mut response = match answered {
        Ok(response) => response,
        Err(error) => {
            return Err(match returning.exceeded {
                Some((flag, limit)) if flag.load(Ordering::Acquire) => {
                    ProxyError::BodyTooLarge { limit }
                }
                _ => error,
            })
        }
    };

    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        // Only to a protocol the request was let through with: anything else would be a
        // tunnel nobody allowed.
        let allowed = returning
            .upgrade
            .as_ref()
            .is_some_and(|offered| crate::upgrade::answers(response.headers(), offered));
        if !allowed {
            return Err(ProxyError::Upstream(
                "the upstream switched to a protocol the request was not allowed".into(),
            ));
        }
        if let Some(client_upgrade) = returning.client_upgrade {
            crate::upgrade::spawn_tunnel(tunnels, client_upgrade, &mut response);
        }
        let (parts, _) = response.into_parts();
        return Ok(Response::from_parts(
            parts,
            AnswerBody::Right(body::empty()),
        ));
    }

    let (mut parts, incoming) = response.into_parts();
    let mut found = headers::scan(&parts.headers);
    // As on the way out: the body is still in any coding besides chunked.
    let codings = match returning.client_http11 {
        true => headers::codings_besides_chunked(&parts.headers, &found),
        false => None,
    };
    headers::remove_hop_by_hop(&mut parts.headers, false, &mut found);
    if let Some(codings) = codings {
        parts.headers.insert(header::TRANSFER_ENCODING, codings);
    }
    Ok(Response::from_parts(parts, AnswerBody::Left(incoming)))
}

/// What the way back needs to know about the request that went out.
struct Returning {
    /// The client's side of a protocol upgrade, for the tunnel.
    client_upgrade: Option<crate::upgrade::ClientSide>,
    /// The `Upgrade` protocols forwarded, if the request was forwarded as an upgrade.
    upgrade: Option<HeaderValue>,
    /// The client speaks HTTP/1.1, the one version with transfer codings.
    client_http11: bool,
    /// With `max_request_body`: raised when the request body passed it on its way out.
    exceeded: Option<(Arc<AtomicBool>, u64)>,
}

/// The request as the upstream receives it: a declared oversized body refused before anything
/// is sent, the origin-form target, an upgrade only to the protocols `upgrades` allows (the
/// route's; websocket without a route), the headers as [`outbound_headers`] writes them, the
/// body bounded by `max_request_body` while it streams.
fn outbound<B>(
    config: &Config,
    incoming: Incoming<'_, B>,
    peer_is_trusted: bool,
    upgrades: Option<&[String]>,
) -> Result<(Request<ProxyBody>, Returning), ProxyError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<body::BoxError>,
{
    let Incoming {
        mut parts,
        body,
        mut found,
        conn,
        routed: _,
    } = incoming;
    let upstream = &config.upstream;

    // Refuse a declared oversized body before anything reaches the upstream.
    let limit = config.max_request_body;
    if let Some(limit) = limit {
        if content_length(&parts.headers).is_some_and(|length| length > limit) {
            return Err(ProxyError::BodyTooLarge { limit });
        }
    }

    let client_http11 = parts.version == Version::HTTP_11;
    let asks_upgrade = client_http11 && headers::is_upgrade_request(&parts.headers, &found);
    // A request left with no allowed protocol goes on as a plain request.
    let upgrade_to = match upgrades {
        _ if !asks_upgrade => None,
        Some(allowed) => crate::upgrade::restrict(&mut parts.headers, allowed),
        None => crate::upgrade::restrict(&mut parts.headers, crate::config::DEFAULT_UPGRADES),
    };
    let upgrade = upgrade_to.is_some();
    if upgrade && upstream.http2 {
        return Err(ProxyError::BadRequest(
            "protocol upgrades need an HTTP/1.1 upstream",
        ));
    }
    let client_upgrade = crate::upgrade::client_side(&mut parts, upgrade);

    // The client's Host (read before the target loses its authority).
    let client_host = found.host.take().or_else(|| {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    parts.uri = origin_form(std::mem::take(&mut parts.uri))?;
    parts.version = if upstream.http2 {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    };
    let forwarded_for = ForwardedFor {
        conn,
        peer_is_trusted,
        client_host,
    };
    outbound_headers(&mut parts.headers, found, upstream, upgrade, forwarded_for);

    let (body, exceeded) = match limit {
        Some(limit) => {
            let (body, flag) = LimitedBody::new(body, limit);
            (body::boxed(body), Some((flag, limit)))
        }
        None => (body::boxed(body), None),
    };
    let returning = Returning {
        client_upgrade,
        upgrade: upgrade_to,
        client_http11,
        exceeded,
    };
    Ok((Request::from_parts(parts, body), returning))
}

/// Whom the upstream is told the request came from (the X-Forwarded-* headers and Host).
struct ForwardedFor {
    conn: ConnInfo,
    peer_is_trusted: bool,
    /// The client's Host, or the authority of its target.
    client_host: Option<HeaderValue>,
}

/// The request's headers as the upstream receives them: hop-by-hop headers removed (transfer
/// codings other than chunked kept, an allowed upgrade's kept), X-Forwarded-* added, Host as
/// configured.
fn outbound_headers(
    headers: &mut http::HeaderMap,
    mut found: Found,
    upstream: &Upstream,
    upgrade: bool,
    forwarded_for: ForwardedFor,
) {
    // Whether the Host is the request's one and only Host line (then preserving it needs no
    // rewrite).
    let sole_host_line = found.host_lines == 1;
    // hyper decoded the chunked coding only; the others belong to the body it forwards.
    let codings = match upstream.http2 {
        false => headers::codings_besides_chunked(headers, &found),
        true => None,
    };
    headers::remove_hop_by_hop(headers, upgrade, &mut found);
    if let Some(codings) = codings {
        // hyper's client frames the body as chunked again and keeps this value.
        headers.insert(header::TRANSFER_ENCODING, codings);
    }
    // Room for the three X-Forwarded headers at once: hyper sizes the map for the
    // headers it parsed, and growing it twice rehashes it twice.
    headers.reserve(3);
    let ForwardedFor {
        conn,
        peer_is_trusted,
        client_host,
    } = forwarded_for;
    headers::add_forwarded(
        headers,
        &found,
        conn.peer.ip(),
        if conn.tls { "https" } else { "http" },
        client_host.as_ref(),
        peer_is_trusted,
    );
    match (upstream.host, client_host) {
        // The client's one Host line goes on as it is.
        (HostMode::Preserve, Some(_)) if !upstream.http2 && sole_host_line => {}
        (HostMode::Preserve, Some(host)) if !upstream.http2 => {
            headers.insert(header::HOST, host);
        }
        // hyper sets Host (HTTP/1.1) or :authority (HTTP/2) from the URI.
        _ => {
            headers.remove(header::HOST);
        }
    }
}

fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The request's own path and query, as HTTP/1.1 sends it to an origin server; the upstream
/// client adds the upstream's scheme and authority where its protocol needs them.
fn origin_form(uri: Uri) -> Result<Uri, ProxyError> {
    // Already origin-form (what HTTP/1.1 clients send): forwarded as it is, without a copy.
    if uri.scheme().is_none() && uri.authority().is_none() && uri.path().starts_with('/') {
        return Ok(uri);
    }
    let path_and_query = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    if !path_and_query.as_str().starts_with('/') {
        // `OPTIONS *` and absolute-form oddities: nothing sensible to forward.
        return Err(ProxyError::BadRequest("the request target must be a path"));
    }
    Ok(Uri::from(path_and_query))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_gets_the_path_and_query_whatever_form_the_target_had() {
        let forwarded = |target: &str| origin_form(target.parse().unwrap()).map(|u| u.to_string());
        // Origin-form, what HTTP/1.1 clients send, goes on as it is.
        assert_eq!(forwarded("/a/b?c=d").unwrap(), "/a/b?c=d");
        assert_eq!(forwarded("/").unwrap(), "/");
        // Absolute-form (proxies' requests) loses the scheme and authority.
        assert_eq!(forwarded("http://example.com/a?b=c").unwrap(), "/a?b=c");
        assert_eq!(forwarded("http://example.com").unwrap(), "/");
        // `OPTIONS *` has no path to forward.
        assert!(matches!(forwarded("*"), Err(ProxyError::BadRequest(_))));
    }
}

//! Header rewriting between client and upstream: what a proxy must remove (hop-by-hop headers,
//! RFC 9110 §7.6.1) and what it adds (X-Forwarded-For/-Proto/-Host).
//!
//! Hop-by-hop headers describe one connection, not the message; forwarding them confuses the
//! next hop and the h2 crate refuses to send them at all, so they go in both directions. An
//! upgrade (WebSocket) is the one case that keeps `Connection: upgrade` and `Upgrade`.
//!
//! `Connection` may name further headers as hop-by-hop, but never those the message's framing
//! and routing rest on or those tollgate sets ([`NEVER_NAMED`]): `Connection: host` would
//! otherwise send the upstream a Host other than the one the route matched. Such names are
//! ignored, as nginx does.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::identity::client_ip::IpText;

/// Headers that are hop-by-hop whatever `Connection` says.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
];

/// Headers a `Connection` option cannot remove: the message's target and framing, and what
/// tollgate itself sets (X-Forwarded-*; `Forwarded`, which a trusted proxy in front may set
/// and the app may read instead; `TE: trailers`, which RFC 9110 §10.1.4 has senders name in
/// Connection, and which is handled below either way).
const NEVER_NAMED: [&str; 8] = [
    "host",
    "content-length",
    "transfer-encoding",
    "te",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "forwarded",
];

pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// What one pass over a message's headers found. Every question put to a `HeaderMap` hashes
/// the name asked about, present or not, and most requests carry none of the names the proxy
/// asks about: one pass over the names present (compared as strings, no hashing) answers them
/// all, and the map is asked only about names that are there.
#[derive(Debug, Default)]
pub struct Found {
    /// Bit i set: `HOP_BY_HOP[i]` is present.
    hop_by_hop: u8,
    te: bool,
    /// A Connection line names a header (an option other than keep-alive and close).
    connection_names: bool,
    /// Bits: X-Forwarded-For (1), -Proto (2), -Host (4) present.
    forwarded: u8,
    /// Whether a Content-Type line is present (gRPC is told by it).
    pub content_type: bool,
    /// What the `Accept` lines ask of tollgate's own answers (see `answers`).
    pub accept: crate::answers::Accept,
    /// The first Host line.
    pub host: Option<HeaderValue>,
    /// How many Host lines there are (2 means two or more).
    pub host_lines: u8,
}

impl Found {
    /// How tollgate's own answers are put to the request with `headers`: gRPC to a gRPC call
    /// (see `grpc`), else as its `Accept` lines ask (see `answers`).
    pub fn answer_form(&self, headers: &HeaderMap) -> crate::answers::Form {
        let grpc = self.content_type && crate::grpc::is_grpc(headers);
        crate::answers::Form::of(grpc, self.accept)
    }
}

const CONNECTION_BIT: u8 = 1 << 0;
const TRANSFER_ENCODING_BIT: u8 = 1 << 3;
const UPGRADE_BIT: u8 = 1 << 4;
const FORWARDED_FOR: u8 = 1;
const FORWARDED_PROTO: u8 = 2;
const FORWARDED_HOST: u8 = 4;

/// One pass over `headers`; see [`Found`]. Names the `http` crate knows (most of them) are
/// told apart by comparing their tags; only the others are compared as strings.
pub fn scan(headers: &HeaderMap) -> Found {
    let mut found = Found::default();
    for (name, value) in headers {
        let hop_by_hop = if *name == header::HOST {
            if found.host.is_none() {
                found.host = Some(value.clone());
            }
            found.host_lines = (found.host_lines + 1).min(2);
            continue;
        } else if *name == header::CONTENT_TYPE {
            found.content_type = true;
            continue;
        } else if *name == header::TE {
            found.te = true;
            continue;
        } else if *name == header::ACCEPT {
            found.accept.read(value.as_bytes());
            continue;
        } else if *name == header::CONNECTION {
            found.connection_names |= value.to_str().is_ok_and(names_headers);
            0
        } else if *name == header::TRANSFER_ENCODING {
            3
        } else if *name == header::UPGRADE {
            4
        } else if *name == header::PROXY_AUTHENTICATE {
            5
        } else if *name == header::PROXY_AUTHORIZATION {
            6
        } else {
            match name.as_str() {
                "x-forwarded-for" => found.forwarded |= FORWARDED_FOR,
                "x-forwarded-proto" => found.forwarded |= FORWARDED_PROTO,
                "x-forwarded-host" => found.forwarded |= FORWARDED_HOST,
                "keep-alive" => found.hop_by_hop |= 1 << 1,
                "proxy-connection" => found.hop_by_hop |= 1 << 2,
                _ => {}
            }
            continue;
        };
        found.hop_by_hop |= 1 << hop_by_hop;
    }
    found
}

/// True when `headers` ask to switch protocols (an HTTP/1.1 `Connection: upgrade` with an
/// `Upgrade` header).
pub fn is_upgrade_request(headers: &HeaderMap, found: &Found) -> bool {
    found.hop_by_hop & UPGRADE_BIT != 0
        && found.hop_by_hop & CONNECTION_BIT != 0
        && connection_has_token(headers, "upgrade")
}

/// Whether a Connection value names a header. Headers named in Connection are hop-by-hop for
/// this message only. Nearly every HTTP/1.1 peer sends `keep-alive` or `close` there, options
/// that name no header (or one removed anyway): names are built (an allocation) only for any
/// other token.
fn names_headers(value: &str) -> bool {
    value.split(',').map(str::trim).any(|t| {
        !t.is_empty() && !t.eq_ignore_ascii_case("keep-alive") && !t.eq_ignore_ascii_case("close")
    })
}

fn connection_has_token(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// The request's `Transfer-Encoding` when it names a coding besides `chunked` (`gzip,
/// chunked`): hyper's server decoded the chunked framing only, so the body it passes on is
/// still in those codings and the upstream must be told. None for plain `chunked` (or none).
pub fn codings_besides_chunked(headers: &HeaderMap, found: &Found) -> Option<HeaderValue> {
    if found.hop_by_hop & TRANSFER_ENCODING_BIT == 0 {
        return None;
    }
    let codings: Vec<&str> = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    if codings.iter().all(|t| t.eq_ignore_ascii_case("chunked")) {
        return None;
    }
    HeaderValue::from_str(&codings.join(", ")).ok()
}

/// Removes hop-by-hop headers (as `found` by [`scan`]). With `keep_upgrade`, `Connection:
/// upgrade` and `Upgrade` stay so the next hop can switch protocols too. `TE: trailers` is kept
/// on requests (gRPC needs it); every other TE value is hop-by-hop. `found` stays true to the
/// headers for the forwarding facts (X-Forwarded-*, Content-Type) and keeps the Host seen
/// before.
pub fn remove_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool, found: &mut Found) {
    if found.hop_by_hop == 0 && !found.te {
        return;
    }
    let mut named_removed = false;
    if found.connection_names {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| !t.eq_ignore_ascii_case("keep-alive"))
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .filter(|name| !NEVER_NAMED.contains(&name.as_str()))
            .collect();
        for name in named {
            if keep_upgrade && name == header::UPGRADE {
                continue;
            }
            named_removed |= headers.remove(&name).is_some();
        }
    }
    let upgrade = keep_upgrade
        .then(|| headers.get(header::UPGRADE).cloned())
        .flatten();
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if found.hop_by_hop & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    if found.te {
        let te_trailers = headers
            .get_all(header::TE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("trailers"));
        headers.remove(header::TE);
        if te_trailers {
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        }
    }
    if let Some(upgrade) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, upgrade);
    }
    if named_removed {
        // Connection may name any header, X-Forwarded-* too: look again (rare).
        let again = scan(headers);
        found.forwarded = again.forwarded;
        found.content_type = again.content_type;
    }
}

/// Appends `peer` to X-Forwarded-For (folding any earlier lines into one, in order) and sets
/// X-Forwarded-Proto and X-Forwarded-Host, asking the map only about what [`scan`] found. When
/// the peer is a trusted proxy its own X-Forwarded-Proto/-Host are kept: it saw the client, we
/// did not.
pub fn add_forwarded(
    headers: &mut HeaderMap,
    found: &Found,
    peer: IpAddr,
    proto: &'static str,
    host: Option<&HeaderValue>,
    peer_is_trusted: bool,
) {
    let peer = peer.to_canonical();
    let mut chain: Option<String> = None;
    if found.forwarded & FORWARDED_FOR != 0 {
        for value in headers.get_all(&X_FORWARDED_FOR) {
            let Ok(value) = value.to_str() else { continue };
            let value = value.trim();
            if value.is_empty() {
                continue;
            }
            let chain = chain.get_or_insert_with(|| String::with_capacity(64));
            chain.push_str(value);
            chain.push_str(", ");
        }
    }
    let value = match chain {
        Some(mut chain) => {
            chain.push_str(IpText::default().write(peer));
            HeaderValue::from_str(&chain).ok()
        }
        // Most requests arrive without one: the peer's address alone.
        None => Some(peer_value(peer)),
    };
    if let Some(value) = value {
        headers.insert(&X_FORWARDED_FOR, value);
    }
    if !(peer_is_trusted && found.forwarded & FORWARDED_PROTO != 0) {
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    }
    if !(peer_is_trusted && found.forwarded & FORWARDED_HOST != 0) {
        match host {
            Some(host) => {
                headers.insert(&X_FORWARDED_HOST, host.clone());
            }
            None if found.forwarded & FORWARDED_HOST != 0 => {
                headers.remove(&X_FORWARDED_HOST);
            }
            None => {}
        }
    }
}

/// `peer` as a header value. A serving thread meets the same few peers over and over (a
/// sidecar's one ingress, a load balancer's handful of addresses, a client's keep-alive
/// requests), so the value made for the last peer is kept: a repeat costs a reference count
/// instead of formatting the address and allocating the value.
fn peer_value(peer: IpAddr) -> HeaderValue {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(IpAddr, HeaderValue)>> =
            const { std::cell::RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((ip, value)) if *ip == peer => value.clone(),
        _ => {
            // An address's text is always a valid header value.
            let value = HeaderValue::from_str(IpText::default().write(peer))
                .unwrap_or_else(|_| HeaderValue::from_static(""));
            *last = Some((peer, value.clone()));
            value
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    /// Scans and removes, as the proxy does.
    fn strip(h: &mut HeaderMap, keep_upgrade: bool) {
        let mut found = scan(h);
        remove_hop_by_hop(h, keep_upgrade, &mut found);
    }

    /// Scans and adds X-Forwarded-*, as the proxy does.
    fn forward(
        h: &mut HeaderMap,
        peer: IpAddr,
        proto: &'static str,
        host: Option<&HeaderValue>,
        trusted: bool,
    ) {
        let found = scan(h);
        add_forwarded(h, &found, peer, proto, host, trusted);
    }

    fn names(h: &HeaderMap) -> Vec<String> {
        let mut n: Vec<String> = h.keys().map(|k| k.to_string()).collect();
        n.sort();
        n
    }

    #[test]
    fn removes_standard_and_connection_named_headers() {
        let mut h = map(&[
            ("connection", "close, X-Secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
            ("proxy-authenticate", "Basic"),
            ("te", "gzip"),
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
            ("x-kept", "yes"),
        ]);
        strip(&mut h, false);
        assert_eq!(names(&h), ["set-cookie", "x-kept"]);
        let cookies: Vec<_> = h.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
    }

    #[test]
    fn each_hop_by_hop_header_alone_is_removed() {
        // Alone, so the quick "nothing to remove" pass must notice each of them itself.
        for name in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
            "upgrade",
            "proxy-authorization",
            "proxy-authenticate",
            "te",
        ] {
            let mut h = map(&[(name, "x"), ("x-kept", "yes")]);
            strip(&mut h, false);
            assert_eq!(names(&h), ["x-kept"], "{name}");
        }
        let mut h = map(&[("x-kept", "yes"), ("host", "a")]);
        strip(&mut h, false);
        assert_eq!(names(&h), ["host", "x-kept"]);
    }

    /// The keep-alive option (any case, anywhere in the list) goes with its header; the other
    /// options still name headers to remove.
    #[test]
    fn keep_alive_option_removes_its_header_and_others_named_beside_it() {
        let mut h = map(&[
            ("connection", "Keep-Alive"),
            ("keep-alive", "timeout=5"),
            ("x-kept", "yes"),
        ]);
        strip(&mut h, false);
        assert_eq!(names(&h), ["x-kept"]);
        let mut h = map(&[
            ("connection", " x-hop ,KEEP-ALIVE, x-other"),
            ("x-hop", "1"),
            ("x-other", "2"),
            ("x-kept", "yes"),
        ]);
        strip(&mut h, false);
        assert_eq!(names(&h), ["x-kept"]);
        // A header named on a second Connection line, after one that names none.
        let mut h = map(&[
            ("connection", "close"),
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("x-kept", "yes"),
        ]);
        strip(&mut h, false);
        assert_eq!(names(&h), ["x-kept"]);
    }

    /// A trusted peer's X-Forwarded-Proto named in its Connection header stays: Connection
    /// cannot remove what tollgate sets (or keeps from a trusted peer).
    #[test]
    fn a_forwarded_header_named_in_connection_stays() {
        let mut h = map(&[
            ("connection", "x-forwarded-proto"),
            ("x-forwarded-proto", "https"),
            ("host", "a"),
            ("host", "b"),
        ]);
        let mut found = scan(&h);
        assert_eq!(found.host_lines, 2);
        assert_eq!(found.host.clone().unwrap(), "a");
        remove_hop_by_hop(&mut h, false, &mut found);
        let ip = "10.0.0.1".parse().unwrap();
        add_forwarded(&mut h, &found, ip, "http", None, true);
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "https");
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1");
        assert_eq!(scan(&map(&[("host", "a")])).host_lines, 1);
        assert!(scan(&map(&[("content-type", "application/grpc")])).content_type);
    }

    #[test]
    fn te_trailers_survives_for_grpc() {
        let mut h = map(&[("te", "trailers, deflate")]);
        strip(&mut h, false);
        assert_eq!(h.get("te").unwrap(), "trailers");
        // Named in Connection, as RFC 9110 asks of its senders.
        let mut h = map(&[("connection", "TE"), ("te", "trailers")]);
        strip(&mut h, false);
        assert_eq!(h.get("te").unwrap(), "trailers");
    }

    #[test]
    fn upgrade_requests_keep_connection_upgrade() {
        let mut h = map(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "abc"),
        ]);
        assert!(is_upgrade_request(&h, &scan(&h)));
        strip(&mut h, true);
        assert_eq!(h.get("connection").unwrap(), "upgrade");
        assert_eq!(h.get("upgrade").unwrap(), "websocket");
        assert_eq!(h.get("sec-websocket-key").unwrap(), "abc");
        let h = map(&[("upgrade", "websocket")]);
        assert!(!is_upgrade_request(&h, &scan(&h)));
    }

    #[test]
    fn forwarded_for_is_added_when_absent_and_ipv6_kept_whole() {
        let mut h = map(&[("x-forwarded-for", "  ")]);
        forward(&mut h, "2001:db8::1".parse().unwrap(), "https", None, false);
        assert_eq!(h.get("x-forwarded-for").unwrap(), "2001:db8::1");
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "https");
        assert!(h.get("x-forwarded-host").is_none());
    }

    #[test]
    fn forwarded_for_names_each_peer_though_the_last_one_is_kept() {
        // One thread, peers alternating and repeating: the kept value must follow the peer.
        let peers = [
            "10.0.0.1",
            "10.0.0.2",
            "10.0.0.2",
            "::ffff:10.0.0.1",
            "2001:db8::7",
        ];
        let expected = [
            "10.0.0.1",
            "10.0.0.2",
            "10.0.0.2",
            "10.0.0.1",
            "2001:db8::7",
        ];
        for (peer, expected) in peers.iter().zip(expected) {
            let mut h = HeaderMap::new();
            forward(&mut h, peer.parse().unwrap(), "http", None, false);
            assert_eq!(h.get("x-forwarded-for").unwrap(), expected, "peer {peer}");
        }
    }

    #[test]
    fn forwarded_for_is_appended_in_order() {
        let mut h = map(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2, 3.3.3.3"),
            ("x-forwarded-proto", "https"),
        ]);
        let host = HeaderValue::from_static("example.com");
        forward(
            &mut h,
            "10.0.0.9".parse().unwrap(),
            "http",
            Some(&host),
            false,
        );
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(
            h.get("x-forwarded-for").unwrap(),
            "1.1.1.1, 2.2.2.2, 3.3.3.3, 10.0.0.9"
        );
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
        assert_eq!(h.get("x-forwarded-host").unwrap(), "example.com");
    }

    #[test]
    fn trusted_peers_keep_their_proto_and_host_and_mapped_ipv4_is_plain() {
        let mut h = map(&[
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "public.example"),
        ]);
        let host = HeaderValue::from_static("internal");
        forward(
            &mut h,
            "::ffff:10.0.0.1".parse().unwrap(),
            "http",
            Some(&host),
            true,
        );
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1");
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "https");
        assert_eq!(h.get("x-forwarded-host").unwrap(), "public.example");
    }

    #[test]
    fn connection_cannot_remove_framing_routing_or_forwarding_headers() {
        let mut h = map(&[
            (
                "connection",
                "Host, Content-Length, X-Forwarded-For, x-forwarded-host, Forwarded, x-forwarded-proto, x-hop",
            ),
            ("host", "api.example.com"),
            ("content-length", "3"),
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-host", "a"),
            ("x-forwarded-proto", "https"),
            ("forwarded", "for=1.1.1.1"),
            ("x-hop", "1"),
        ]);
        strip(&mut h, false);
        assert_eq!(
            names(&h),
            [
                "content-length",
                "forwarded",
                "host",
                "x-forwarded-for",
                "x-forwarded-host",
                "x-forwarded-proto"
            ]
        );
        assert_eq!(h.get("host").unwrap(), "api.example.com");
    }

    #[test]
    fn transfer_codings_besides_chunked_are_told_apart() {
        let codings = |values: &[&str]| {
            let pairs: Vec<(&str, &str)> =
                values.iter().map(|v| ("transfer-encoding", *v)).collect();
            let h = map(&pairs);
            codings_besides_chunked(&h, &scan(&h)).map(|v| v.to_str().unwrap().to_owned())
        };
        assert_eq!(
            codings(&["gzip, chunked"]).as_deref(),
            Some("gzip, chunked")
        );
        assert_eq!(
            codings(&["gzip", "chunked"]).as_deref(),
            Some("gzip, chunked")
        );
        assert_eq!(codings(&["chunked"]), None);
        assert_eq!(codings(&["Chunked"]), None);
        assert_eq!(codings(&[]), None);
    }
}

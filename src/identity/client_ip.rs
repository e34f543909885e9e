//! Working out the real client address behind trusted reverse proxies.
//!
//! The TCP peer is the only address nobody can forge, so it is the answer unless the peer is a
//! proxy we were told to trust. Only then is `X-Forwarded-For` consulted, walked from the right
//! (the hop our trusted proxy appended) towards the left (what the client itself claimed),
//! stopping at the first address that is not another trusted proxy. Anything we cannot parse
//! stops the walk at the last hop that was vouched for, so a client-written value can never
//! become its identity. The walk works on the header bytes in place (no per-entry allocation)
//! and is capped, because the header is attacker-sized.
//!
//! Keys group IPv6 clients by network: one host usually holds a whole /64 (SLAAC, privacy
//! addresses), so a key per address would let one client take 2^64 keys. A client_ip key is
//! made from the address with only its first `ipv6_prefix` bits ([`key_address`]); IPv4 and
//! IPv4-mapped IPv6 are keyed whole. Allow-lists and trusted proxies compare the full address.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::header::{HeaderMap, HeaderName};
use ipnet::{IpNet, Ipv4Net};

/// Most `X-Forwarded-For` entries examined; no sane deployment chains more proxies than this,
/// and the cap bounds the work a hostile header can cause.
pub const MAX_HOPS: usize = 64;

/// `http` has no constant for this de-facto standard header.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Longest single entry we try to parse: the longest textual IPv6 with brackets and a port is
/// well below this, so anything longer is garbage and skipped without parsing.
const MAX_ENTRY_LEN: usize = 64;

/// The bits of an IPv6 client address its keys keep by default (`client_ip.ipv6_prefix`).
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// How the client address is read (`client_ip:`): the networks whose hosts are trusted to
/// append honest `X-Forwarded-For` entries, and how IPv6 clients are grouped in keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
    ipv6_prefix: u8,
}

impl Default for TrustedProxies {
    fn default() -> Self {
        Self::none()
    }
}

/// The address client_ip keys are made from: IPv4 (and IPv4-mapped IPv6, as IPv4) whole, IPv6
/// with only its first `prefix` bits (the rest zero).
pub fn key_address(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) if prefix < 128 => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
        ip => ip,
    }
}

/// An identity value as operators give it (`tollgate limits`, the admin endpoints): an IPv6
/// address becomes its key address (see [`key_address`]) so that it finds the keys requests
/// from it were counted on; any other value is unchanged.
pub fn key_value(raw: &[u8], prefix: u8) -> Cow<'_, [u8]> {
    let ip = std::str::from_utf8(raw)
        .ok()
        .and_then(|text| text.trim().parse::<IpAddr>().ok());
    match ip {
        Some(ip @ IpAddr::V6(_)) if ip.to_canonical().is_ipv6() => {
            Cow::Owned(key_address(ip, prefix).to_string().into_bytes())
        }
        _ => Cow::Borrowed(raw),
    }
}

impl TrustedProxies {
    /// Trust these networks. IPv4-mapped IPv6 networks (`::ffff:10.0.0.0/104`) are stored as
    /// their IPv4 equivalent, because addresses are compared in canonical (IPv4) form.
    pub fn new(nets: Vec<IpNet>) -> Self {
        let nets = nets.into_iter().map(canonical_net).collect();
        Self {
            nets,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Trust nobody: the peer address is always the client.
    pub fn none() -> Self {
        Self::new(Vec::new())
    }

    /// Keys of IPv6 clients keep the first `prefix` bits of the address (0–128).
    pub fn with_ipv6_prefix(mut self, prefix: u8) -> Self {
        self.ipv6_prefix = prefix.min(128);
        self
    }

    pub fn ipv6_prefix(&self) -> u8 {
        self.ipv6_prefix
    }

    /// Whether `ip` (mapped IPv4 is treated as IPv4) lies in a trusted network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|net| net.contains(&ip))
    }

    /// The trusted networks, in canonical form.
    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }

    /// Whether no proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }
}

/// `::ffff:a.b.c.d/n` with n >= 96 becomes `a.b.c.d/(n-96)`; every other net is unchanged.
fn canonical_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net {
        if let (Some(v4), true) = (v6.addr().to_ipv4_mapped(), v6.prefix_len() >= 96) {
            if let Ok(n) = Ipv4Net::new(v4, v6.prefix_len() - 96) {
                return IpNet::V4(n);
            }
        }
    }
    net
}

/// The client address: the peer, unless the peer is a trusted proxy; then X-Forwarded-For
/// (all X-Forwarded-For header lines, in order, comma-separated) is walked right to left and
/// the first address that is not a trusted proxy is the client. Unparseable entries stop the
/// walk: the last trusted hop we passed (or the peer) is the client (an attacker-controlled
/// value must never become the identity). IPv4-mapped IPv6 (::ffff:a.b.c.d) is treated as
/// the IPv4 address, both for the peer and for entries; entries may carry a port
/// ("1.2.3.4:5678", "[::1]:80") or be quoted / have spaces — accept those; anything else is
/// unparseable. Never panics, never allocates proportional to a hostile header beyond one pass,
/// and caps the walk at 64 hops.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &TrustedProxies) -> IpAddr {
    let peer = peer.to_canonical();
    if !trusted.contains(peer) {
        return peer;
    }
    // The last address vouched for by a trusted hop; what we answer if the walk stops early.
    let mut candidate = peer;
    let mut hops = 0usize;
    // Header lines concatenate in order, so the rightmost entry is the last entry of the
    // last line: iterate lines backwards and entries within each line backwards.
    for line in headers.get_all(X_FORWARDED_FOR).iter().rev() {
        for entry in line.as_bytes().rsplit(|&b| b == b',') {
            hops += 1;
            if hops > MAX_HOPS {
                return candidate;
            }
            let Some(ip) = parse_entry(entry) else {
                return candidate;
            };
            if !trusted.contains(ip) {
                return ip;
            }
            candidate = ip;
        }
    }
    // Every hop was a trusted proxy: the leftmost one is the best we know.
    candidate
}

/// One `X-Forwarded-For` entry as an address: optional surrounding spaces and quotes, then
/// `ip`, `ip:port`, `[ipv6]` or `[ipv6]:port`. Mapped IPv4 comes back as IPv4.
fn parse_entry(entry: &[u8]) -> Option<IpAddr> {
    let entry = entry.trim_ascii();
    let entry = match entry {
        [b'"', inner @ .., b'"'] => inner.trim_ascii(),
        _ => entry,
    };
    if entry.is_empty() || entry.len() > MAX_ENTRY_LEN {
        return None;
    }
    let text = std::str::from_utf8(entry).ok()?;
    let ip = if let Ok(ip) = text.parse::<IpAddr>() {
        ip
    } else if let Ok(sock) = text.parse::<SocketAddr>() {
        sock.ip()
    } else if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        // Bracketed IPv6 without a port; brackets around IPv4 are not a real form.
        IpAddr::V6(inner.parse().ok()?)
    } else {
        return None;
    };
    Some(ip.to_canonical())
}

/// An address as text without the formatting machinery for the common IPv4 case (this runs
/// for every forwarded request, and for every request keyed by client IP); IPv6 goes through
/// `Display`.
#[derive(Default)]
pub struct IpText {
    buf: [u8; 15],
    v6: String,
}

impl IpText {
    pub fn write(&mut self, ip: IpAddr) -> &str {
        match ip {
            IpAddr::V4(v4) => {
                let mut len = 0;
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        self.buf[len] = b'.';
                        len += 1;
                    }
                    let mut digits = itoa::Buffer::new();
                    let digits = digits.format(octet).as_bytes();
                    self.buf[len..len + digits.len()].copy_from_slice(digits);
                    len += digits.len();
                }
                // Only ASCII digits and dots were written.
                std::str::from_utf8(&self.buf[..len]).unwrap_or_default()
            }
            IpAddr::V6(v6) => {
                self.v6 = v6.to_string();
                &self.v6
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_text_matches_display() {
        for ip in [
            "0.0.0.0",
            "1.2.3.4",
            "10.0.0.9",
            "255.255.255.255",
            "192.168.100.7",
            "::1",
            "2001:db8::8:800:200c:417a",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(IpText::default().write(ip), ip.to_string());
        }
    }

    use http::header::HeaderValue;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn xff(lines: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(X_FORWARDED_FOR, HeaderValue::from_str(l).unwrap());
        }
        h
    }

    fn trusted(nets: &[&str]) -> TrustedProxies {
        TrustedProxies::new(nets.iter().map(|n| n.parse().unwrap()).collect())
    }

    #[test]
    fn no_xff_is_the_peer() {
        let t = trusted(&["10.0.0.0/8"]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &HeaderMap::new(), &t),
            ip("10.0.0.1")
        );
        assert_eq!(
            client_ip(ip("8.8.8.8"), &HeaderMap::new(), &t),
            ip("8.8.8.8")
        );
    }

    #[test]
    fn untrusted_peer_ignores_spoofed_xff() {
        let t = trusted(&["10.0.0.0/8"]);
        let h = xff(&["1.1.1.1, 10.0.0.5"]);
        assert_eq!(client_ip(ip("203.0.113.9"), &h, &t), ip("203.0.113.9"));
        assert_eq!(
            client_ip(ip("203.0.113.9"), &h, &TrustedProxies::none()),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn trusted_peer_gives_rightmost_untrusted() {
        let t = trusted(&["10.0.0.0/8"]);
        // The client claims to be 6.6.6.6; 1.2.3.4 is what our proxy saw.
        let h = xff(&["6.6.6.6, 1.2.3.4"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &t), ip("1.2.3.4"));
    }

    #[test]
    fn chain_of_trusted_proxies() {
        let t = trusted(&["10.0.0.0/8", "192.168.0.0/16"]);
        let h = xff(&["6.6.6.6, 1.2.3.4, 192.168.1.1, 10.1.1.1"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &t), ip("1.2.3.4"));
    }

    #[test]
    fn all_trusted_gives_leftmost() {
        let t = trusted(&["10.0.0.0/8"]);
        let h = xff(&["10.9.9.9, 10.1.1.1"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &t), ip("10.9.9.9"));
    }

    #[test]
    fn malformed_entries_stop_at_last_trusted_hop() {
        let t = trusted(&["10.0.0.0/8"]);
        // Garbage right after the peer: the peer is the client.
        assert_eq!(
            client_ip(ip("10.0.0.1"), &xff(&["1.2.3.4, bogus"]), &t),
            ip("10.0.0.1")
        );
        // Garbage after a trusted hop: that hop.
        let h = xff(&["1.2.3.4, not-an-ip, 10.2.2.2"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &t), ip("10.2.2.2"));
        // Empty entries, zone ids, hostnames, bracketed IPv4 and overlong entries are all
        // unparseable.
        for bad in [
            "",
            " ",
            "1.2.3.4,",
            "fe80::1%eth0",
            "example.com",
            "[1.2.3.4]",
            "unknown",
        ] {
            assert_eq!(
                client_ip(ip("10.0.0.1"), &xff(&[bad]), &t),
                ip("10.0.0.1"),
                "{bad:?}"
            );
        }
        // Surrounding spaces of any length are fine; an overlong entry itself is not.
        let padded = format!("{}1.2.3.4{}", " ".repeat(100), " ".repeat(100));
        assert_eq!(
            client_ip(ip("10.0.0.1"), &xff(&[&padded]), &t),
            ip("1.2.3.4")
        );
        let long = format!("1.2.3.4{}", "0".repeat(100));
        assert_eq!(
            client_ip(ip("10.0.0.1"), &xff(&[&long]), &t),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn ports_brackets_quotes_ipv6_and_mapped() {
        let t = trusted(&["10.0.0.0/8", "fd00::/8"]);
        let p = ip("10.0.0.1");
        assert_eq!(client_ip(p, &xff(&["1.2.3.4:5678"]), &t), ip("1.2.3.4"));
        assert_eq!(
            client_ip(p, &xff(&["[2001:db8::1]:80"]), &t),
            ip("2001:db8::1")
        );
        assert_eq!(
            client_ip(p, &xff(&["[2001:db8::1]"]), &t),
            ip("2001:db8::1")
        );
        assert_eq!(client_ip(p, &xff(&["2001:db8::1"]), &t), ip("2001:db8::1"));
        assert_eq!(client_ip(p, &xff(&["\"1.2.3.4\""]), &t), ip("1.2.3.4"));
        assert_eq!(client_ip(p, &xff(&[" \" [::1]:80 \" "]), &t), ip("::1"));
        assert_eq!(client_ip(p, &xff(&["::ffff:1.2.3.4"]), &t), ip("1.2.3.4"));
        // A mapped trusted entry is trusted like its IPv4 form and passed over.
        assert_eq!(
            client_ip(p, &xff(&["5.5.5.5, ::ffff:10.3.3.3"]), &t),
            ip("5.5.5.5")
        );
        // Mapped peer.
        assert_eq!(
            client_ip(ip("::ffff:10.0.0.1"), &xff(&["1.2.3.4"]), &t),
            ip("1.2.3.4")
        );
        assert_eq!(
            client_ip(ip("::ffff:8.8.8.8"), &HeaderMap::new(), &t),
            ip("8.8.8.8")
        );
        // IPv6 trusted proxies.
        assert_eq!(
            client_ip(ip("fd00::1"), &xff(&["1.2.3.4, fd00::2"]), &t),
            ip("1.2.3.4")
        );
    }

    #[test]
    fn mapped_trusted_net_is_canonicalised() {
        let t = trusted(&["::ffff:10.0.0.0/104"]);
        assert!(t.contains(ip("10.1.2.3")));
        assert!(t.contains(ip("::ffff:10.1.2.3")));
        assert!(!t.contains(ip("11.0.0.1")));
    }

    #[test]
    fn multiple_header_lines_are_one_list() {
        let t = trusted(&["10.0.0.0/8"]);
        let h = xff(&["6.6.6.6, 1.2.3.4", "10.5.5.5"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &t), ip("1.2.3.4"));
        let h = xff(&["10.7.7.7", "10.5.5.5"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &t), ip("10.7.7.7"));
        let h = xff(&["1.2.3.4", "junk", "10.5.5.5"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &t), ip("10.5.5.5"));
    }

    #[test]
    fn ten_kilobyte_header_is_capped() {
        let t = trusted(&["10.0.0.0/8"]);
        // ~10 KB of trusted hops with a client far to the left: the walk gives up after
        // MAX_HOPS at the last trusted hop instead of reaching it.
        let mut line = String::from("1.2.3.4");
        while line.len() < 10 * 1024 {
            line.push_str(", 10.1.1.1");
        }
        line.push_str(", 10.2.2.2");
        let got = client_ip(ip("10.0.0.1"), &xff(&[&line]), &t);
        assert!(t.contains(got), "{got}");
        // ~10 KB of junk from an untrusted peer is ignored outright.
        let junk = "x".repeat(10 * 1024);
        assert_eq!(client_ip(ip("8.8.8.8"), &xff(&[&junk]), &t), ip("8.8.8.8"));
        // And behind a trusted peer it is one unparseable entry.
        assert_eq!(
            client_ip(ip("10.0.0.1"), &xff(&[&junk]), &t),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn within_the_cap_the_client_is_found() {
        let t = trusted(&["10.0.0.0/8"]);
        let mut line = String::from("1.2.3.4");
        for _ in 0..MAX_HOPS - 1 {
            line.push_str(", 10.1.1.1");
        }
        assert_eq!(client_ip(ip("10.0.0.1"), &xff(&[&line]), &t), ip("1.2.3.4"));
        line.insert_str(0, "5.5.5.5, ");
        line = line.replacen("1.2.3.4", "10.9.9.9", 1);
        // 65 entries: the 65th (5.5.5.5) is past the cap.
        assert_eq!(
            client_ip(ip("10.0.0.1"), &xff(&[&line]), &t),
            ip("10.9.9.9")
        );
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(
            lines in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..4),
            peer_trusted in any::<bool>(),
        ) {
            let t = trusted(&["10.0.0.0/8", "::/0"]);
            let mut h = HeaderMap::new();
            for l in &lines {
                if let Ok(v) = HeaderValue::from_bytes(l) {
                    h.append(X_FORWARDED_FOR, v);
                }
            }
            let peer = if peer_trusted { ip("10.0.0.1") } else { ip("8.8.8.8") };
            let got = client_ip(peer, &h, &t);
            if !peer_trusted {
                prop_assert_eq!(got, peer);
            }
        }

        #[test]
        fn never_panics_on_address_like_text(
            line in "[0-9a-f:.\\[\\]\" ,%]{0,200}",
        ) {
            let t = trusted(&["10.0.0.0/8", "2001:db8::/32"]);
            if let Ok(v) = HeaderValue::from_str(&line) {
                let mut h = HeaderMap::new();
                h.insert(X_FORWARDED_FOR, v);
                let _ = client_ip(ip("10.0.0.1"), &h, &t);
            }
        }
    }

    #[test]
    fn keys_group_ipv6_by_prefix_and_keep_ipv4_whole() {
        assert_eq!(
            key_address(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), 64),
            ip("2001:db8:1:2::")
        );
        assert_eq!(key_address(ip("2001:db8:1:2::7"), 48), ip("2001:db8:1::"));
        assert_eq!(key_address(ip("2001:db8::7"), 128), ip("2001:db8::7"));
        assert_eq!(key_address(ip("2001:db8::7"), 0), ip("::"));
        assert_eq!(key_address(ip("10.1.2.3"), 64), ip("10.1.2.3"));
        // IPv4-mapped IPv6 is IPv4, whole.
        assert_eq!(key_address(ip("::ffff:10.1.2.3"), 64), ip("10.1.2.3"));
        assert_eq!(
            key_value(b"2001:db8:1:2::99", 64).as_ref(),
            b"2001:db8:1:2::"
        );
        assert_eq!(key_value(b"10.1.2.3", 64).as_ref(), b"10.1.2.3");
        assert_eq!(key_value(b"alice", 64).as_ref(), b"alice");
    }
}

//! X-Forwarded-For parsing on arbitrary header lines: never panics, and the answer is always
//! the peer, an address the header names, or (behind trusted proxies) one of those.
#![no_main]

use std::net::IpAddr;

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tollgate::identity::{client_ip, TrustedProxies};

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for line in data.split(|&b| b == b'\n') {
        if let Ok(value) = HeaderValue::from_bytes(line) {
            headers.append("x-forwarded-for", value);
        }
    }
    let trusted = TrustedProxies::new(vec![
        "10.0.0.0/8".parse().unwrap(),
        "2001:db8::/32".parse().unwrap(),
    ]);
    let trusted_peer: IpAddr = "10.1.2.3".parse().unwrap();
    let untrusted_peer: IpAddr = "198.51.100.7".parse().unwrap();
    // An untrusted peer is always the client, whatever the header says.
    assert_eq!(
        client_ip(untrusted_peer, &headers, &trusted),
        untrusted_peer
    );
    let ip = client_ip(trusted_peer, &headers, &trusted);
    if let (true, IpAddr::V4(v4)) = (ip != trusted_peer, ip) {
        // An IPv4 answer other than the peer is written in the header (IPv6 has too many
        // spellings for a text check).
        let text = String::from_utf8_lossy(data);
        assert!(text.contains(&v4.to_string()), "{ip} not in {text:?}");
    }
});

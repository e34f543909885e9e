//! Identity extraction and key building on arbitrary requests: whatever the client sends,
//! the key fragment is bounded, free of key separators and hash-tag braces, and two different
//! raw values never share a fragment.
#![no_main]

use std::net::IpAddr;

use http::{HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tollgate::identity::key::key_part;
use tollgate::identity::{Identity, JwtVerifier, OnInvalid, Source};

fn assert_key_safe(part: &str) {
    assert!(part.len() <= 80, "{part} too long");
    assert!(
        part.bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'{' | b'}' | b':' | b'|')),
        "{part:?} has an unsafe byte"
    );
}

fuzz_target!(|data: &[u8]| {
    // Layout: the request target, then header values, split on 0x00.
    let mut fields = data.split(|&b| b == 0);
    let target = fields.next().unwrap_or_default();
    let mut builder = http::Request::builder();
    if let Ok(target) = std::str::from_utf8(target) {
        if target.parse::<http::Uri>().is_ok() {
            builder = builder.uri(target);
        }
    }
    let names = ["x-user-id", "cookie", "authorization", "x-forwarded-for"];
    for (value, name) in fields.zip(names.iter().cycle()) {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            builder = builder.header(HeaderName::from_static(name), value);
        }
    }
    let Ok(request) = builder.body(()) else {
        return;
    };
    let (parts, ()) = request.into_parts();
    let verifier =
        JwtVerifier::hmac(b"fuzz-secret", jsonwebtoken::Algorithm::HS256, "sub").unwrap();
    let identity = Identity {
        name: "fuzz".into(),
        sources: vec![
            Source::Jwt(verifier),
            Source::Header(HeaderName::from_static("x-user-id")),
            Source::Cookie("sid".into()),
            Source::Query("user".into()),
            Source::PathSegment(2),
            Source::Bearer,
            Source::ClientIp,
        ],
        on_invalid: OnInvalid::default(),
        display: None,
    };
    let peer: IpAddr = "203.0.113.9".parse().unwrap();
    for i in 0..identity.sources.len() {
        let one = Identity {
            name: "one".into(),
            sources: vec![identity.sources[i].clone()],
            on_invalid: OnInvalid::default(),
            display: None,
        };
        assert_key_safe(&one.identify(&parts, peer).key_part);
    }
    assert_key_safe(&identity.identify(&parts, peer).key_part);

    // key_part itself: injective on the two halves of the input.
    let (a, b) = data.split_at(data.len() / 2);
    let (pa, pb) = (key_part(a), key_part(b));
    assert_key_safe(&pa);
    assert_key_safe(&pb);
    assert_eq!(a == b, pa == pb, "{a:?} / {b:?}");
});

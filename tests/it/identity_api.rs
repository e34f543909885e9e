//! The identity module's public API, used exactly as the proxy and limit engine will use it:
//! a request behind a trusted proxy is resolved to its client IP, then keyed by an identity.

use std::net::IpAddr;

use http::HeaderName;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use tollgate::identity::jwt::{JwtConfigError, JwtVerifier};
use tollgate::identity::key::{hashed_part, key_part};
use tollgate::identity::{
    builtin, client_ip, Identified, Identity, OnInvalid, Source, TrustedProxies,
};

const RSA_PUBLIC: &[u8] = include_bytes!("../fixtures/identity/rsa_public.pem");
const RSA_PRIVATE: &[u8] = include_bytes!("../fixtures/identity/rsa_private.pem");

fn request(uri: &str, headers: &[(&str, &str)]) -> http::request::Parts {
    let mut b = http::Request::builder().uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).unwrap().into_parts().0
}

#[test]
fn proxy_then_identity_end_to_end() {
    let trusted = TrustedProxies::new(vec!["10.0.0.0/8".parse().unwrap()]);
    assert!(trusted.contains("10.1.1.1".parse().unwrap()));
    assert!(!TrustedProxies::none().contains("10.1.1.1".parse().unwrap()));

    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let token = encode(
        &Header::new(Algorithm::RS256),
        &serde_json::json!({"sub": "tenant-42", "exp": exp, "iss": "idp"}),
        &EncodingKey::from_rsa_pem(RSA_PRIVATE).unwrap(),
    )
    .unwrap();
    let verifier = JwtVerifier::public_key_pem(RSA_PUBLIC, Algorithm::RS256, "sub")
        .unwrap()
        .with_issuer(Some("idp".into()))
        .with_audience(None)
        .with_leeway(0);
    assert_eq!(verifier.algorithm(), Algorithm::RS256);
    assert_eq!(verifier.claim(), "sub");

    let identity = Identity {
        name: "tenant".into(),
        sources: vec![
            Source::Jwt(verifier),
            Source::Header(HeaderName::from_static("x-tenant")),
            Source::PathSegment(2),
        ],
        on_invalid: OnInvalid::default(),
        display: None,
    };
    let auth = format!("Bearer {token}");
    let req = request(
        "/t/acme/items",
        &[
            ("x-forwarded-for", "6.6.6.6, 198.51.100.4"),
            ("authorization", &auth),
        ],
    );
    let ip = client_ip("10.0.0.2".parse().unwrap(), &req.headers, &trusted);
    assert_eq!(ip, "198.51.100.4".parse::<IpAddr>().unwrap());

    let id: Identified = identity.identify(&req, ip);
    assert_eq!(id.source, 0);
    assert_eq!(id.source_kind, "jwt");
    assert_eq!(id.key_part, "jwt=tenant-42");
    let (same, shown) = identity.identify_shown(&req, ip);
    assert_eq!((same, shown.as_str()), (id, "tenant-42"));

    // Without the token the path segment answers; without anything, the client IP.
    let id = identity.identify(&request("/t/acme/items", &[]), ip);
    assert_eq!(
        (id.source, id.source_kind, id.key_part.as_str()),
        (2, "path_segment", "path_segment=acme")
    );
    let id = identity.identify(&request("/", &[]), ip);
    assert_eq!((id.source, id.source_kind), (usize::MAX, "client_ip"));
    assert_eq!(id.key_part, "client_ip=198.51.100.4");

    // The caller joins parts with `|` and `:` and wraps a hash tag: nothing can break out.
    let hostile = identity.identify(&request("/t/%7Bx%7D%7C%3A/items", &[]), ip);
    assert!(!hostile.key_part.contains(['{', '}', '|', ':', ' ']));
    let redis_key = format!("tg:{{{}|{}}}:v1", identity.name, hostile.key_part);
    assert_eq!(redis_key.matches('{').count(), 1);
    assert_eq!(redis_key.matches('}').count(), 1);
}

#[test]
fn builtins_and_key_helpers() {
    let ip: IpAddr = "192.0.2.1".parse().unwrap();
    let req = request("/", &[]);
    let g = builtin("global").unwrap().identify(&req, ip);
    assert_eq!((g.source_kind, g.key_part.as_str()), ("global", "*"));
    let c = builtin("client_ip").unwrap().identify(&req, ip);
    assert_eq!((c.source, c.source_kind), (0, "client_ip"));
    assert!(builtin("nope").is_none());

    assert_eq!(key_part(b"abc"), "=abc");
    assert!(key_part(b"{abc}").starts_with('#'));
    assert!(hashed_part(b"abc").starts_with('#'));

    let err: JwtConfigError = JwtVerifier::hmac(b"", Algorithm::HS256, "sub").unwrap_err();
    assert!(!err.to_string().is_empty());
}

//! Validation of who a caller is: `client_ip.trusted_proxies`, the `identities` section (each
//! identity's sources, JWT verifiers with their secrets or key files read now), and the
//! lookups of identity names elsewhere in the file (`key`, a tier's `identity`, allow-lists).

use std::sync::Arc;
use std::time::Duration;

use super::validator::{is_plain_name, Validator};
use crate::config::raw::{
    indexmap_free::OrderedMap, RawClientIp, RawIdentity, RawJwt, RawKey, RawSource,
};
use crate::identity::{self, Display, Identity, JwtVerifier, OnInvalid, Source, TrustedProxies};

pub(super) fn trusted_proxies(v: &mut Validator, raw: Option<&RawClientIp>) -> TrustedProxies {
    let Some(raw) = raw else {
        return TrustedProxies::none();
    };
    let mut nets = Vec::new();
    for (i, text) in raw.trusted_proxies.iter().enumerate() {
        let text = text.trim();
        match parse_net(text) {
            Some(net) => nets.push(net),
            None => v.error(
                &format!("client_ip.trusted_proxies[{i}]"),
                format!("`{text}` is not a CIDR or IP address: write e.g. 10.0.0.0/8, 192.168.1.10 or fd00::/8"),
            ),
        }
    }
    let mut trusted = TrustedProxies::new(nets);
    if let Some(prefix) = raw.ipv6_prefix {
        if prefix > 128 {
            v.error(
                "client_ip.ipv6_prefix",
                format!("`{prefix}` is not an IPv6 prefix length: write 0 to 128 (64, the default, keys a client by its /64 network; 128 by its whole address)"),
            );
        }
        trusted = trusted.with_ipv6_prefix(prefix.min(128));
    }
    trusted
}

/// A CIDR, or a single address as a host network.
pub(super) fn parse_net(text: &str) -> Option<ipnet::IpNet> {
    let text = text.trim();
    text.parse::<ipnet::IpNet>().ok().or_else(|| {
        text.parse::<std::net::IpAddr>()
            .ok()
            .map(ipnet::IpNet::from)
    })
}

/// The built-in identities, then the file's, in file order.
pub(super) fn identities(v: &mut Validator, raw: OrderedMap<RawIdentity>) -> Vec<Arc<Identity>> {
    let mut out: Vec<Arc<Identity>> = ["client_ip", "global"]
        .iter()
        .filter_map(|n| identity::builtin(n).map(Arc::new))
        .collect();
    for (name, raw) in raw.0 {
        let path = format!("identities.{name}");
        if !is_plain_name(&name) {
            v.error(
                &path,
                format!("identity name `{name}` may use only letters, digits, `_`, `-` and `.`"),
            );
        }
        if identity::builtin(&name).is_some() {
            v.error(
                &path,
                format!("`{name}` is built in and cannot be redefined; pick another name"),
            );
            continue;
        }
        let sources_path = if raw.mapping {
            format!("{path}.sources")
        } else {
            path.clone()
        };
        if raw.sources.is_empty() {
            v.error(&sources_path, "needs at least one source (header, query, form, cookie, bearer, jwt, path_segment, client_ip)");
        }
        let on_invalid = on_invalid(v, &path, raw.on_invalid.as_deref(), &raw.sources);
        let display = display(v, &path, raw.display.as_deref());
        let sources = raw
            .sources
            .into_iter()
            .enumerate()
            .filter_map(|(i, s)| source(v, &format!("{sources_path}[{i}]"), s))
            .collect();
        out.push(Arc::new(Identity {
            name,
            sources,
            on_invalid,
            display,
        }));
    }
    out
}

/// `on_invalid`: what a credential the identity refuses means. Only a `jwt` source refuses
/// credentials, so it is an error on an identity without one.
fn on_invalid(
    v: &mut Validator,
    path: &str,
    raw: Option<&str>,
    sources: &[RawSource],
) -> OnInvalid {
    let Some(text) = raw else {
        return OnInvalid::default();
    };
    let at = format!("{path}.on_invalid");
    let value = match text {
        "reject" => OnInvalid::Reject,
        "client_ip" => OnInvalid::ClientIp,
        other => {
            v.error(
                &at,
                format!("`{other}` is not an on_invalid: write `reject` (answer 401) or `client_ip` (key the caller by its client IP)"),
            );
            return OnInvalid::default();
        }
    };
    if !sources.iter().any(|s| matches!(s, RawSource::Jwt(_))) {
        v.error(
            &at,
            "only a `jwt` source refuses credentials: remove on_invalid, or add a jwt source",
        );
    }
    value
}

/// `display`: how the identity's values are shown (None: by source).
fn display(v: &mut Validator, path: &str, raw: Option<&str>) -> Option<Display> {
    let text = raw?;
    let display = Display::parse(text);
    if display.is_none() {
        v.error(
            &format!("{path}.display"),
            format!(
                "`{text}` is not a display: write {} (how the identity's values are shown in the admin API, the console and logs)",
                Display::ALLOWED
            ),
        );
    }
    display
}

fn source(v: &mut Validator, path: &str, raw: RawSource) -> Option<Source> {
    Some(match raw {
        RawSource::Header(name) => match http::HeaderName::from_bytes(name.trim().as_bytes()) {
            Ok(name) => Source::Header(name),
            Err(_) => {
                v.error(
                    &format!("{path}.header"),
                    format!("`{name}` is not a valid header name"),
                );
                return None;
            }
        },
        RawSource::Query(name) if !name.is_empty() => Source::Query(name),
        RawSource::Form(name) if !name.is_empty() => Source::Form(name),
        RawSource::Cookie(name) if !name.is_empty() => Source::Cookie(name),
        RawSource::Query(_) | RawSource::Form(_) | RawSource::Cookie(_) => {
            v.error(path, "needs a parameter, field or cookie name");
            return None;
        }
        RawSource::Bearer => Source::Bearer,
        RawSource::PathSegment(0) => {
            v.error(
                &format!("{path}.path_segment"),
                "segments count from 1: for /t/<id>/..., <id> is 2",
            );
            return None;
        }
        RawSource::PathSegment(n) => Source::PathSegment(n),
        RawSource::ClientIp => Source::ClientIp,
        RawSource::Jwt(raw) => return jwt(v, &format!("{path}.jwt"), raw).map(Source::Jwt),
    })
}

fn jwt(v: &mut Validator, path: &str, raw: RawJwt) -> Option<JwtVerifier> {
    let claim = raw.claim.unwrap_or_else(|| "sub".into());
    let leeway = v.duration_or_zero(
        &format!("{path}.leeway"),
        raw.leeway.as_deref(),
        Duration::ZERO,
    );
    if leeway.subsec_nanos() != 0 {
        v.error(
            &format!("{path}.leeway"),
            "JWT times are whole seconds: write the leeway in seconds, e.g. 30s",
        );
    }
    let verifier = match (&raw.secret_env, &raw.public_key_file) {
        (Some(var), None) => {
            let algorithm = jwt_algorithm(v, path, raw.algorithm.as_deref(), "HS256", true)?;
            let Some(secret) = v.env(var) else {
                v.error(
                    &format!("{path}.secret_env"),
                    format!("environment variable `{var}` (the HMAC secret) is not set"),
                );
                return None;
            };
            JwtVerifier::hmac(secret.as_bytes(), algorithm, &claim)
        }
        (None, Some(file)) => {
            let algorithm = jwt_algorithm(v, path, raw.algorithm.as_deref(), "RS256", false)?;
            let file = v.relative(file);
            let pem = match std::fs::read(&file) {
                Ok(pem) => pem,
                Err(e) => {
                    v.error(
                        &format!("{path}.public_key_file"),
                        format!("cannot read {}: {e}", file.display()),
                    );
                    return None;
                }
            };
            JwtVerifier::public_key_pem(&pem, algorithm, &claim)
        }
        _ => {
            v.error(path, "give exactly one of `secret_env` (HS256/384/512: the env var holding the secret) or `public_key_file` (RS*/PS*/ES*/EdDSA: a PEM public key)");
            return None;
        }
    };
    match verifier {
        Ok(verifier) => Some(
            verifier
                .with_issuer(raw.issuer)
                .with_audience(raw.audience)
                .with_leeway(leeway.as_secs()),
        ),
        Err(e) => {
            v.error(path, e.to_string());
            None
        }
    }
}

fn jwt_algorithm(
    v: &mut Validator,
    path: &str,
    name: Option<&str>,
    default: &str,
    hmac: bool,
) -> Option<jsonwebtoken::Algorithm> {
    let name = name.unwrap_or(default);
    let allowed: &[&str] = if hmac {
        &["HS256", "HS384", "HS512"]
    } else {
        &[
            "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
        ]
    };
    if !allowed.contains(&name) {
        v.error(
            &format!("{path}.algorithm"),
            format!(
                "`{name}` is not allowed with {}: use one of {}",
                if hmac {
                    "secret_env"
                } else {
                    "public_key_file"
                },
                allowed.join(", ")
            ),
        );
        return None;
    }
    name.parse().ok()
}

/// The identity called `name`, or the problem reported at `path` with the names defined.
pub(super) fn lookup(
    v: &mut Validator,
    path: &str,
    name: &str,
    identities: &[Arc<Identity>],
) -> Option<Arc<Identity>> {
    let found = identities.iter().find(|i| i.name == name).cloned();
    if found.is_none() {
        let known: Vec<&str> = identities.iter().map(|i| i.name.as_str()).collect();
        v.error(
            path,
            format!(
                "unknown identity `{name}`: defined are {}",
                known.join(", ")
            ),
        );
    }
    found
}

/// A `key`: one identity name or a list of them, each defined.
pub(super) fn key(
    v: &mut Validator,
    path: &str,
    raw: &RawKey,
    identities: &[Arc<Identity>],
) -> Option<Vec<Arc<Identity>>> {
    let names = raw.names();
    if names.is_empty() {
        v.error(path, "needs at least one identity name");
        return None;
    }
    names
        .iter()
        .map(|name| lookup(v, path, name, identities))
        .collect()
}

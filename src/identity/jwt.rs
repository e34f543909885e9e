//! Verified JWT claims as a caller identity.
//!
//! A claim is only worth keying on if the token is genuine, otherwise anyone could mint a
//! token naming someone else and spend (or dodge) that user's budget. So the signature is
//! checked with one pinned algorithm (the header's `alg` must equal it, which refuses
//! `alg: none` and the HS256-with-the-RSA-public-key "algorithm confusion" trick), `exp` is
//! required, `nbf` is honoured, and issuer/audience are checked when configured. A token that
//! fails any check is refused, with the reason ([`Refusal`]): a credential that is present but
//! refused never lets the identity fall through to a weaker source (see `Identity::identify`
//! and its `on_invalid`).
//!
//! Where jsonwebtoken reads a token more strictly than the apps' libraries (PyJWT reads a
//! numeric-string `exp` with `int()`, JSON parsers keep the last of a member named twice,
//! base64 is decoded leniently), a token it refuses for that is verified and checked again as
//! they read it: a token the app accepts must not be refused here, or under `on_invalid:
//! client_ip` each address would get a quota of its own for its owner.
//!
//! Leeway defaults to 0 seconds: the proxy and the issuer are expected to keep NTP time. Raise
//! it with [`JwtVerifier::with_leeway`] if clocks drift.

use std::fmt;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use super::ambiguity::Ambiguity;

/// Tokens longer than this are refused before any parsing, so a hostile header cannot make us
/// base64-decode and JSON-parse megabytes per request.
pub const MAX_TOKEN_LEN: usize = 8 * 1024;

/// Why a verifier could not be built from configuration.
#[derive(Debug, thiserror::Error)]
pub enum JwtConfigError {
    /// The algorithm cannot be used with this kind of key (e.g. RS256 with a shared secret).
    #[error("algorithm {algorithm:?} cannot be used with {key_kind}")]
    UnsupportedAlgorithm {
        algorithm: Algorithm,
        key_kind: &'static str,
    },
    /// An empty HMAC secret would let anyone sign tokens.
    #[error("the HMAC secret is empty")]
    EmptySecret,
    /// The PEM could not be read as a public key of the algorithm's family.
    #[error("invalid {family} public key PEM: {source}")]
    InvalidKey {
        family: &'static str,
        #[source]
        source: jsonwebtoken::errors::Error,
    },
    /// The claim name is empty.
    #[error("the JWT claim name is empty")]
    EmptyClaim,
}

/// Why a bearer token was refused as a JWT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Longer than [`MAX_TOKEN_LEN`]: refused unparsed.
    Oversized,
    /// Not a JWT: its structure, base64 or JSON is broken.
    Malformed,
    /// The header names another algorithm than the pinned one (`none` included).
    Algorithm,
    /// The signature does not verify with the configured key.
    Signature,
    /// Past its `exp`.
    Expired,
    /// Before its `nbf`.
    NotYetValid,
    /// A claim the checks require is missing (`exp`; `iss` or `aud` when configured).
    MissingClaim,
    /// `iss` is not the configured issuer.
    Issuer,
    /// `aud` does not contain the configured audience.
    Audience,
    /// The identity's claim is missing, empty, or not a string or number.
    NoIdentityClaim,
    /// Not a refused token but a request the identity cannot read one way: it carries more
    /// than one value where the identity reads one (see [`Ambiguity`]). Always answered
    /// 400, whatever `on_invalid` says: apps would pick different values than tollgate.
    Ambiguous(Ambiguity),
}

impl Refusal {
    /// The kind of source that refused, as logs name sources: a `jwt` source refuses a token;
    /// an ambiguity names the source that met it.
    pub fn source_kind(self) -> &'static str {
        match self {
            Refusal::Ambiguous(what) => what.source_kind(),
            _ => "jwt",
        }
    }

    /// As logs, metrics and the 401's `error_description` name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Oversized => "oversized",
            Refusal::Malformed => "malformed",
            Refusal::Algorithm => "algorithm",
            Refusal::Signature => "bad_signature",
            Refusal::Expired => "expired",
            Refusal::NotYetValid => "not_yet_valid",
            Refusal::MissingClaim => "missing_required_claim",
            Refusal::Issuer => "wrong_issuer",
            Refusal::Audience => "wrong_audience",
            Refusal::NoIdentityClaim => "no_identity_claim",
            Refusal::Ambiguous(what) => what.as_str(),
        }
    }

    fn of(error: &jsonwebtoken::errors::Error) -> Refusal {
        use jsonwebtoken::errors::ErrorKind;
        match error.kind() {
            ErrorKind::InvalidSignature => Refusal::Signature,
            ErrorKind::ExpiredSignature => Refusal::Expired,
            ErrorKind::ImmatureSignature => Refusal::NotYetValid,
            ErrorKind::MissingRequiredClaim(_) => Refusal::MissingClaim,
            ErrorKind::InvalidIssuer => Refusal::Issuer,
            ErrorKind::InvalidAudience => Refusal::Audience,
            ErrorKind::InvalidAlgorithm
            | ErrorKind::InvalidAlgorithmName
            | ErrorKind::MissingAlgorithm => Refusal::Algorithm,
            _ => Refusal::Malformed,
        }
    }
}

/// Verifies tokens with one pinned algorithm and key and extracts one claim.
#[derive(Clone)]
pub struct JwtVerifier {
    claim: String,
    algorithm: Algorithm,
    // Boxed: key and validation are a few hundred bytes, and `Source::Jwt` holds a verifier
    // inline, so this keeps every `Source` small.
    checks: Box<Checks>,
}

#[derive(Clone)]
struct Checks {
    key: DecodingKey,
    validation: Validation,
    issuer: Option<String>,
    audience: Option<String>,
    leeway: u64,
}

// By hand, so key material never ends up in logs or panic messages.
impl fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("claim", &self.claim)
            .field("algorithm", &self.algorithm)
            .field("issuer", &self.checks.issuer)
            .field("audience", &self.checks.audience)
            .field("leeway", &self.checks.leeway)
            .finish_non_exhaustive()
    }
}

impl JwtVerifier {
    /// HMAC (HS256 default, HS384, HS512) with a shared secret.
    pub fn hmac(secret: &[u8], algorithm: Algorithm, claim: &str) -> Result<Self, JwtConfigError> {
        if !matches!(
            algorithm,
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512
        ) {
            return Err(JwtConfigError::UnsupportedAlgorithm {
                algorithm,
                key_kind: "an HMAC secret",
            });
        }
        if secret.is_empty() {
            return Err(JwtConfigError::EmptySecret);
        }
        Self::build(DecodingKey::from_secret(secret), algorithm, claim)
    }

    /// RS256/RS384/RS512/PS256/PS384/PS512/ES256/ES384/EdDSA with a PEM public key.
    pub fn public_key_pem(
        pem: &[u8],
        algorithm: Algorithm,
        claim: &str,
    ) -> Result<Self, JwtConfigError> {
        use Algorithm::*;
        let (family, key) = match algorithm {
            RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => {
                ("RSA", DecodingKey::from_rsa_pem(pem))
            }
            ES256 | ES384 => ("EC", DecodingKey::from_ec_pem(pem)),
            EdDSA => ("Ed25519", DecodingKey::from_ed_pem(pem)),
            HS256 | HS384 | HS512 => {
                return Err(JwtConfigError::UnsupportedAlgorithm {
                    algorithm,
                    key_kind: "a public key",
                })
            }
        };
        let key = key.map_err(|source| JwtConfigError::InvalidKey { family, source })?;
        Self::build(key, algorithm, claim)
    }

    fn build(key: DecodingKey, algorithm: Algorithm, claim: &str) -> Result<Self, JwtConfigError> {
        if claim.is_empty() {
            return Err(JwtConfigError::EmptyClaim);
        }
        let mut verifier = Self {
            claim: claim.to_owned(),
            algorithm,
            checks: Box::new(Checks {
                key,
                validation: Validation::new(algorithm),
                issuer: None,
                audience: None,
                leeway: 0,
            }),
        };
        verifier.rebuild_validation();
        Ok(verifier)
    }

    /// Require this `iss` (the claim must then be present). `None` = not checked.
    pub fn with_issuer(mut self, iss: Option<String>) -> Self {
        self.checks.issuer = iss;
        self.rebuild_validation();
        self
    }

    /// Require this `aud` (the claim must then be present and contain it). `None` = `aud` is
    /// not checked at all: a rate limiter only needs to know who the caller is, not whether the
    /// token was minted for us.
    pub fn with_audience(mut self, aud: Option<String>) -> Self {
        self.checks.audience = aud;
        self.rebuild_validation();
        self
    }

    /// Clock-skew allowance for `exp` and `nbf`, in seconds (default 0).
    pub fn with_leeway(mut self, secs: u64) -> Self {
        self.checks.leeway = secs;
        self.rebuild_validation();
        self
    }

    /// The pinned algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The claim whose value is the identity.
    pub fn claim(&self) -> &str {
        &self.claim
    }

    fn rebuild_validation(&mut self) {
        // One algorithm only: jsonwebtoken refuses any token whose header names another.
        let mut v = Validation::new(self.algorithm);
        v.leeway = self.checks.leeway;
        v.validate_exp = true;
        v.validate_nbf = true;
        let mut required = vec!["exp"];
        // jsonwebtoken only compares iss/aud when the token carries them, so a configured
        // check must also make the claim mandatory or omitting it would bypass the check.
        if let Some(iss) = &self.checks.issuer {
            v.set_issuer(&[iss]);
            required.push("iss");
        }
        match &self.checks.audience {
            Some(aud) => {
                v.set_audience(&[aud]);
                required.push("aud");
            }
            None => v.validate_aud = false,
        }
        v.set_required_spec_claims(&required);
        self.checks.validation = v;
    }

    /// The claim's value as a string (string claims as is, numbers in their JSON text), or None
    /// when the token is refused (see [`JwtVerifier::check`]).
    pub fn verify(&self, token: &str) -> Option<String> {
        self.check(token).ok()
    }

    /// The claim's value as a string (string claims as is, numbers in their JSON text), or why
    /// the token is refused: malformed, a bad signature, a wrong/`none` algorithm, expired
    /// (`exp` required), not yet valid (`nbf` checked when present), oversized, or without
    /// the claim (empty strings and other JSON types (bool, null, array, object) count as
    /// missing).
    pub fn check(&self, token: &str) -> Result<String, Refusal> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(Refusal::Oversized);
        }
        if token.is_empty() {
            return Err(Refusal::Malformed);
        }
        let decoded = jsonwebtoken::decode::<Map<String, Value>>(
            token,
            &self.checks.key,
            &self.checks.validation,
        );
        let claims = match decoded {
            Ok(data) => data.claims,
            // What jsonwebtoken reads more strictly than the apps' libraries (a numeric-string
            // `exp`, a claim named twice, base64 PyJWT decodes): verified and checked again as
            // they read it, so that a token an app accepts is not refused here (under
            // `on_invalid: client_ip` that would give each address a quota of its own).
            Err(error) if Self::rereadable(&error, token) => self.check_as_apps_read(token)?,
            Err(error) => return Err(Refusal::of(&error)),
        };
        match claims.get(&self.claim) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(Value::Number(n)) => Ok(n.to_string()),
            _ => Err(Refusal::NoIdentityClaim),
        }
    }
}

impl JwtVerifier {
    /// Whether jsonwebtoken refused `error` for a reading stricter than the apps' libraries:
    /// base64 they decode, JSON with a member named twice (JSON parsers keep the last), a
    /// required claim in a form they accept (`"exp": "1767225600"`, which PyJWT reads with
    /// `int()`), a signature spelled otherwise than canonically (jsonwebtoken compares an
    /// HMAC's text). Other signature, algorithm, time and issuer/audience refusals are final.
    fn rereadable(error: &jsonwebtoken::errors::Error, token: &str) -> bool {
        use jsonwebtoken::errors::ErrorKind;
        match error.kind() {
            ErrorKind::Base64(_)
            | ErrorKind::Json(_)
            | ErrorKind::Utf8(_)
            | ErrorKind::MissingRequiredClaim(_) => true,
            ErrorKind::InvalidSignature => {
                use base64::Engine as _;
                let signature = token.rsplit('.').next().unwrap_or_default();
                lenient_base64(signature).is_some_and(|bytes| {
                    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes) != signature
                })
            }
            _ => false,
        }
    }

    /// The token's claims read as PyJWT and JSON parsers read them, with every check of
    /// [`JwtVerifier::check`]: exactly three parts; the header's `alg` (the last, if named
    /// twice) the pinned algorithm; the signature verified with the pinned algorithm and key;
    /// `exp` required and `nbf` checked (numbers, or strings of digits as Python's `int()`
    /// reads them), `iss`/`aud` when configured. Base64 is decoded leniently (padding or
    /// none, non-canonical trailing bits, `+` and `/` for `-` and `_`): the header and payload
    /// are signed as written, so only the signature's spelling can vary, and its bytes are
    /// what is verified.
    fn check_as_apps_read(&self, token: &str) -> Result<Map<String, Value>, Refusal> {
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Refusal::Malformed);
        };
        let json = |part: &str| -> Result<Map<String, Value>, Refusal> {
            let bytes = lenient_base64(part).ok_or(Refusal::Malformed)?;
            serde_json::from_slice(&bytes).map_err(|_| Refusal::Malformed)
        };
        let alg = match json(header)?.get("alg") {
            Some(Value::String(alg)) => alg.parse::<Algorithm>().ok(),
            _ => None,
        };
        if alg != Some(self.algorithm) {
            return Err(Refusal::Algorithm);
        }
        let signature = lenient_base64(signature).ok_or(Refusal::Malformed)?;
        let canonical = {
            use base64::Engine as _;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signature)
        };
        let message = &token[..header.len() + 1 + payload.len()];
        let verified = jsonwebtoken::crypto::verify(
            &canonical,
            message.as_bytes(),
            &self.checks.key,
            self.algorithm,
        );
        if !matches!(verified, Ok(true)) {
            return Err(Refusal::Signature);
        }
        let claims = json(payload)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()) as i128;
        let leeway = self.checks.leeway as i128;
        let exp = claims.get("exp").ok_or(Refusal::MissingClaim)?;
        if numeric_date(exp).ok_or(Refusal::Malformed)? < now - leeway {
            return Err(Refusal::Expired);
        }
        if let Some(nbf) = claims.get("nbf") {
            if numeric_date(nbf).ok_or(Refusal::Malformed)? > now + leeway {
                return Err(Refusal::NotYetValid);
            }
        }
        if let Some(issuer) = &self.checks.issuer {
            match claims.get("iss") {
                None => return Err(Refusal::MissingClaim),
                Some(Value::String(iss)) if iss == issuer => {}
                Some(_) => return Err(Refusal::Issuer),
            }
        }
        if let Some(audience) = &self.checks.audience {
            let ours = |v: &Value| matches!(v, Value::String(aud) if aud == audience);
            match claims.get("aud") {
                None => return Err(Refusal::MissingClaim),
                Some(Value::Array(auds)) if auds.iter().any(ours) => {}
                Some(aud) if ours(aud) => {}
                Some(_) => return Err(Refusal::Audience),
            }
        }
        Ok(claims)
    }
}

/// Base64url as PyJWT decodes it: padded or not, `+` and `/` read as `-` and `_`, trailing
/// bits that a canonical encoding would have zeroed ignored. None when it is no base64.
fn lenient_base64(part: &str) -> Option<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    use base64::Engine as _;
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    let text: String = part
        .chars()
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect();
    LENIENT.decode(text).ok()
}

/// A NumericDate as PyJWT's `int()` reads it: a JSON number (its fraction dropped), or a
/// string of ASCII digits with an optional sign, surrounding whitespace and single `_` between
/// digits. None for anything else.
fn numeric_date(value: &Value) -> Option<i128> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.is_finite())
                    .map(|f| f.trunc() as i128)
            }),
        Value::String(text) => {
            let text = text.trim();
            let (negative, digits) = match text.as_bytes().first() {
                Some(b'-') => (true, &text[1..]),
                Some(b'+') => (false, &text[1..]),
                _ => (false, text),
            };
            let well_formed = !digits.is_empty()
                && !digits.starts_with('_')
                && !digits.ends_with('_')
                && !digits.contains("__")
                && digits.bytes().all(|b| b.is_ascii_digit() || b == b'_');
            if !well_formed {
                return None;
            }
            let value: i128 = digits.replace('_', "").parse().ok()?;
            Some(if negative { -value } else { value })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;
    use std::time::{SystemTime, UNIX_EPOCH};

    const RSA_PRIVATE: &[u8] = include_bytes!("../../tests/fixtures/identity/rsa_private.pem");
    const RSA_PUBLIC: &[u8] = include_bytes!("../../tests/fixtures/identity/rsa_public.pem");
    const SECRET: &[u8] = b"test-secret-of-reasonable-length";

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn hs256(claims: &Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            claims,
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap()
    }

    fn hmac_verifier() -> JwtVerifier {
        JwtVerifier::hmac(SECRET, Algorithm::HS256, "sub").unwrap()
    }

    fn b64(v: &Value) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
    }

    /// An HS256 token of raw header and payload JSON text (members named twice, strings
    /// where numbers belong), signed with `key`.
    fn raw_hs256(header: &str, payload: &str, key: &[u8]) -> String {
        let message = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(payload)
        );
        let signature = jsonwebtoken::crypto::sign(
            message.as_bytes(),
            &EncodingKey::from_secret(key),
            Algorithm::HS256,
        )
        .unwrap();
        format!("{message}.{signature}")
    }

    /// What PyJWT and JSON parsers accept is accepted too: a numeric-string `exp`/`nbf`
    /// (Python's `int()`), a claim named twice (the last), base64 with padding or with
    /// non-canonical trailing bits in the signature. Every check still holds on that path.
    #[test]
    fn tokens_the_apps_libraries_accept_are_accepted() {
        let v = hmac_verifier();
        let head = r#"{"alg":"HS256","typ":"JWT"}"#;
        let exp = now() + 300;
        let ok = |payload: String| v.check(&raw_hs256(head, &payload, SECRET));
        assert_eq!(
            ok(format!(r#"{{"sub":"victim","exp":"{exp}"}}"#)).as_deref(),
            Ok("victim")
        );
        assert_eq!(
            ok(format!(r#"{{"sub":"victim","exp":" +{exp} "}}"#)).as_deref(),
            Ok("victim")
        );
        assert_eq!(
            ok(format!(r#"{{"sub":"fresh","exp":{exp},"sub":"victim"}}"#)).as_deref(),
            Ok("victim")
        );
        assert_eq!(
            ok(format!(
                r#"{{"sub":"victim","exp":"{exp}","nbf":"{}"}}"#,
                now() - 5
            ))
            .as_deref(),
            Ok("victim")
        );
        // Refused on that path as on the other.
        assert_eq!(
            ok(format!(r#"{{"sub":"victim","exp":"{}"}}"#, now() - 10)),
            Err(Refusal::Expired)
        );
        assert_eq!(
            ok(format!(
                r#"{{"sub":"victim","exp":"{exp}","nbf":"{}"}}"#,
                now() + 100
            )),
            Err(Refusal::NotYetValid)
        );
        assert_eq!(
            ok(r#"{"sub":"victim","exp":"soon"}"#.into()),
            Err(Refusal::Malformed)
        );
        assert_eq!(
            ok(r#"{"sub":"victim","exp":"1__0"}"#.into()),
            Err(Refusal::Malformed)
        );
        assert_eq!(
            ok(r#"{"sub":"victim","sub":"again"}"#.into()),
            Err(Refusal::MissingClaim)
        );
        let forged = raw_hs256(
            head,
            &format!(r#"{{"sub":"victim","exp":"{exp}"}}"#),
            b"forger",
        );
        assert_eq!(v.check(&forged), Err(Refusal::Signature));
        for header in [
            r#"{"alg":"HS256","alg":"none"}"#,
            r#"{"alg":"HS384"}"#,
            r#"{}"#,
        ] {
            let token = raw_hs256(
                header,
                &format!(r#"{{"sub":"victim","exp":{exp}}}"#),
                SECRET,
            );
            assert_eq!(v.check(&token), Err(Refusal::Algorithm), "{header}");
        }
        let last_alg = raw_hs256(
            r#"{"alg":"none","alg":"HS256"}"#,
            &format!(r#"{{"sub":"victim","exp":{exp}}}"#),
            SECRET,
        );
        assert_eq!(v.check(&last_alg).as_deref(), Ok("victim"));
        // The signature spelled otherwise: padded, `+`/`/`, non-canonical last character.
        let token = hs256(&json!({"sub": "victim", "exp": exp}));
        let (message, signature) = token.rsplit_once('.').unwrap();
        let padded = format!("{message}.{signature}=");
        assert_eq!(v.check(&padded).as_deref(), Ok("victim"));
        let slashed = format!(
            "{message}.{}",
            signature.replace('-', "+").replace('_', "/")
        );
        assert_eq!(v.check(&slashed).as_deref(), Ok("victim"));
        // 32 bytes are 43 characters, the last holding 2 bits of padding: set one.
        let last = signature.chars().last().unwrap();
        let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let index = alphabet.find(last).unwrap();
        let bumped = alphabet.chars().nth(index | 1).unwrap();
        let mut tweaked = signature.to_owned();
        tweaked.pop();
        tweaked.push(bumped);
        if bumped != last {
            assert_eq!(
                v.check(&format!("{message}.{tweaked}")).as_deref(),
                Ok("victim")
            );
        }
        // Another signature is still another signature.
        let mut other = signature.to_owned();
        other.replace_range(..1, if signature.starts_with('A') { "B" } else { "A" });
        assert_eq!(
            v.check(&format!("{message}.{other}")),
            Err(Refusal::Signature)
        );
    }

    #[test]
    fn valid_hs256_gives_the_claim() {
        let v = hmac_verifier();
        let t = hs256(&json!({"sub": "alice", "exp": now() + 300}));
        assert_eq!(v.verify(&t).as_deref(), Some("alice"));
        assert_eq!(v.algorithm(), Algorithm::HS256);
        assert_eq!(v.claim(), "sub");
    }

    #[test]
    fn other_hmac_sizes_work_and_are_pinned() {
        let v = JwtVerifier::hmac(SECRET, Algorithm::HS512, "sub").unwrap();
        let claims = json!({"sub": "alice", "exp": now() + 300});
        let t512 = encode(
            &Header::new(Algorithm::HS512),
            &claims,
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap();
        assert_eq!(v.verify(&t512).as_deref(), Some("alice"));
        // Same secret, other HMAC size: refused because the algorithm is pinned.
        assert_eq!(v.verify(&hs256(&claims)), None);
    }

    #[test]
    fn valid_rs256_gives_the_claim() {
        let v = JwtVerifier::public_key_pem(RSA_PUBLIC, Algorithm::RS256, "sub").unwrap();
        let t = encode(
            &Header::new(Algorithm::RS256),
            &json!({"sub": "bob", "exp": now() + 300}),
            &EncodingKey::from_rsa_pem(RSA_PRIVATE).unwrap(),
        )
        .unwrap();
        assert_eq!(v.verify(&t).as_deref(), Some("bob"));
    }

    #[test]
    fn valid_es256_gives_the_claim() {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let v =
            JwtVerifier::public_key_pem(kp.public_key_pem().as_bytes(), Algorithm::ES256, "sub")
                .unwrap();
        let enc = EncodingKey::from_ec_pem(kp.serialize_pem().as_bytes()).unwrap();
        let t = encode(
            &Header::new(Algorithm::ES256),
            &json!({"sub": "carol", "exp": now() + 300}),
            &enc,
        )
        .unwrap();
        assert_eq!(v.verify(&t).as_deref(), Some("carol"));
        // A different P-256 key's token is refused.
        let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let forged = encode(
            &Header::new(Algorithm::ES256),
            &json!({"sub": "carol", "exp": now() + 300}),
            &EncodingKey::from_ec_pem(other.serialize_pem().as_bytes()).unwrap(),
        )
        .unwrap();
        assert_eq!(v.verify(&forged), None);
    }

    #[test]
    fn forged_signature_is_refused() {
        let v = hmac_verifier();
        let forged = encode(
            &Header::new(Algorithm::HS256),
            &json!({"sub": "alice", "exp": now() + 300}),
            &EncodingKey::from_secret(b"some-other-secret"),
        )
        .unwrap();
        assert_eq!(v.verify(&forged), None);
        // Payload swapped under a genuine signature.
        let good = hs256(&json!({"sub": "alice", "exp": now() + 300}));
        let parts: Vec<&str> = good.split('.').collect();
        let evil = b64(&json!({"sub": "mallory", "exp": now() + 300}));
        let swapped = format!("{}.{}.{}", parts[0], evil, parts[2]);
        assert_eq!(v.verify(&swapped), None);
    }

    #[test]
    fn expired_missing_exp_and_future_nbf_are_refused() {
        let v = hmac_verifier();
        assert_eq!(
            v.verify(&hs256(&json!({"sub": "a", "exp": now() - 10}))),
            None
        );
        assert_eq!(v.verify(&hs256(&json!({"sub": "a"}))), None);
        let early = hs256(&json!({"sub": "a", "exp": now() + 300, "nbf": now() + 100}));
        assert_eq!(v.verify(&early), None);
        let ok = hs256(&json!({"sub": "a", "exp": now() + 300, "nbf": now() - 100}));
        assert_eq!(v.verify(&ok).as_deref(), Some("a"));
        // Leeway lets a just-expired token through.
        let lenient = hmac_verifier().with_leeway(60);
        assert_eq!(
            lenient
                .verify(&hs256(&json!({"sub": "a", "exp": now() - 10})))
                .as_deref(),
            Some("a")
        );
    }

    #[test]
    fn alg_none_is_refused() {
        let v = hmac_verifier();
        let payload = b64(&json!({"sub": "alice", "exp": now() + 300}));
        for header in [
            json!({"alg": "none", "typ": "JWT"}),
            json!({"alg": "None"}),
            json!({"alg": "NONE"}),
        ] {
            let h = b64(&header);
            assert_eq!(v.verify(&format!("{h}.{payload}.")), None);
            assert_eq!(v.verify(&format!("{h}.{payload}")), None);
        }
    }

    #[test]
    fn algorithm_confusion_is_refused() {
        // The attacker knows the RSA public key and uses its PEM as an HMAC secret.
        let v = JwtVerifier::public_key_pem(RSA_PUBLIC, Algorithm::RS256, "sub").unwrap();
        let t = encode(
            &Header::new(Algorithm::HS256),
            &json!({"sub": "admin", "exp": now() + 300}),
            &EncodingKey::from_secret(RSA_PUBLIC),
        )
        .unwrap();
        assert_eq!(v.verify(&t), None);
    }

    #[test]
    fn malformed_tokens_are_refused() {
        let v = hmac_verifier();
        let good = hs256(&json!({"sub": "alice", "exp": now() + 300}));
        let parts: Vec<&str> = good.split('.').collect();
        for bad in [
            "".to_owned(),
            "not-a-jwt".to_owned(),
            "a.b.c".to_owned(),
            format!("{}.!!!not base64!!!.{}", parts[0], parts[2]),
            format!("{}.{}.{}", "%%%", parts[1], parts[2]),
            format!("{}.{}.{}", parts[0], parts[1], "***"),
            format!("{}.{}", parts[0], parts[1]),
            format!("{good}.extra"),
        ] {
            assert_eq!(v.verify(&bad), None, "{bad}");
        }
    }

    #[test]
    fn oversized_token_is_refused_unparsed() {
        let v = hmac_verifier();
        let pad = "x".repeat(MAX_TOKEN_LEN);
        let big = hs256(&json!({"sub": "alice", "exp": now() + 300, "pad": pad}));
        assert!(big.len() > MAX_TOKEN_LEN);
        assert_eq!(v.verify(&big), None);
    }

    #[test]
    fn issuer_and_audience_when_configured() {
        let v = hmac_verifier()
            .with_issuer(Some("https://idp.example".into()))
            .with_audience(Some("tollgate".into()));
        let exp = now() + 300;
        let good = json!({"sub": "a", "exp": exp, "iss": "https://idp.example", "aud": "tollgate"});
        assert_eq!(v.verify(&hs256(&good)).as_deref(), Some("a"));
        let list_aud =
            json!({"sub": "a", "exp": exp, "iss": "https://idp.example", "aud": ["x", "tollgate"]});
        assert_eq!(v.verify(&hs256(&list_aud)).as_deref(), Some("a"));
        for bad in [
            json!({"sub": "a", "exp": exp, "iss": "https://evil.example", "aud": "tollgate"}),
            json!({"sub": "a", "exp": exp, "iss": "https://idp.example", "aud": "other"}),
            json!({"sub": "a", "exp": exp, "aud": "tollgate"}),
            json!({"sub": "a", "exp": exp, "iss": "https://idp.example"}),
        ] {
            assert_eq!(v.verify(&hs256(&bad)), None, "{bad}");
        }
        // Unconfigured: neither is checked.
        let plain = hmac_verifier();
        let any = json!({"sub": "a", "exp": exp, "iss": "whoever", "aud": "someone-else"});
        assert_eq!(plain.verify(&hs256(&any)).as_deref(), Some("a"));
    }

    #[test]
    fn numeric_missing_and_odd_claims() {
        let v = JwtVerifier::hmac(SECRET, Algorithm::HS256, "uid").unwrap();
        let exp = now() + 300;
        assert_eq!(
            v.verify(&hs256(&json!({"uid": 42, "exp": exp}))).as_deref(),
            Some("42")
        );
        assert_eq!(
            v.verify(&hs256(&json!({"uid": 1.5, "exp": exp})))
                .as_deref(),
            Some("1.5")
        );
        assert_eq!(v.verify(&hs256(&json!({"sub": "a", "exp": exp}))), None);
        assert_eq!(v.verify(&hs256(&json!({"uid": "", "exp": exp}))), None);
        assert_eq!(v.verify(&hs256(&json!({"uid": true, "exp": exp}))), None);
        assert_eq!(v.verify(&hs256(&json!({"uid": null, "exp": exp}))), None);
    }

    /// Each refusal names its reason (logs, the metric and the 401 show it).
    #[test]
    fn a_refusal_says_why() {
        let v = hmac_verifier();
        let exp = now() + 300;
        let forged = encode(
            &Header::new(Algorithm::HS256),
            &json!({"sub": "a", "exp": exp}),
            &EncodingKey::from_secret(b"some-other-secret"),
        )
        .unwrap();
        let pad = "x".repeat(MAX_TOKEN_LEN);
        let other_size = encode(
            &Header::new(Algorithm::HS384),
            &json!({"sub": "a", "exp": exp}),
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap();
        let none = format!(
            "{}.{}.",
            b64(&json!({"alg": "none"})),
            b64(&json!({"sub": "a", "exp": exp}))
        );
        for (token, why) in [
            (forged, Refusal::Signature),
            (
                hs256(&json!({"sub": "a", "exp": now() - 10})),
                Refusal::Expired,
            ),
            (
                hs256(&json!({"sub": "a", "exp": exp, "nbf": now() + 100})),
                Refusal::NotYetValid,
            ),
            (hs256(&json!({"sub": "a"})), Refusal::MissingClaim),
            (
                hs256(&json!({"sub": "", "exp": exp})),
                Refusal::NoIdentityClaim,
            ),
            (hs256(&json!({"exp": exp})), Refusal::NoIdentityClaim),
            (
                hs256(&json!({"sub": "a", "exp": exp, "pad": pad})),
                Refusal::Oversized,
            ),
            ("not-a-jwt".to_owned(), Refusal::Malformed),
            // `none` is no algorithm jsonwebtoken knows: read again, it is no pinned one.
            (none, Refusal::Algorithm),
            (other_size, Refusal::Algorithm),
        ] {
            assert_eq!(v.check(&token), Err(why), "{token:.40}");
        }
        assert_eq!(
            v.check(&hs256(&json!({"sub": "a", "exp": exp}))).as_deref(),
            Ok("a")
        );
    }

    #[test]
    fn config_errors() {
        assert!(matches!(
            JwtVerifier::hmac(SECRET, Algorithm::RS256, "sub"),
            Err(JwtConfigError::UnsupportedAlgorithm { .. })
        ));
        assert!(matches!(
            JwtVerifier::hmac(b"", Algorithm::HS256, "sub"),
            Err(JwtConfigError::EmptySecret)
        ));
        assert!(matches!(
            JwtVerifier::hmac(SECRET, Algorithm::HS256, ""),
            Err(JwtConfigError::EmptyClaim)
        ));
        assert!(matches!(
            JwtVerifier::public_key_pem(RSA_PUBLIC, Algorithm::HS256, "sub"),
            Err(JwtConfigError::UnsupportedAlgorithm { .. })
        ));
        assert!(matches!(
            JwtVerifier::public_key_pem(b"not a pem", Algorithm::RS256, "sub"),
            Err(JwtConfigError::InvalidKey { .. })
        ));
        // An RSA key offered for an EC algorithm.
        assert!(matches!(
            JwtVerifier::public_key_pem(RSA_PUBLIC, Algorithm::ES256, "sub"),
            Err(JwtConfigError::InvalidKey { .. })
        ));
        let shown = format!("{:?}", hmac_verifier());
        assert!(!shown.contains("test-secret"), "{shown}");
    }
}

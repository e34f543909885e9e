//! Who is calling: turns a request into the identity a throttling rule is keyed on.
//!
//! An identity is an ordered list of sources (a header, a query parameter, a cookie, a bearer
//! token, a verified JWT claim, a path segment, the client IP). The first source that is
//! present wins, and if none is, the request falls back to its client IP so every request
//! always lands in some bucket. A credential that is present but refused (a bearer token no
//! `jwt` source of the identity accepts) never falls through to a weaker source: the caller is
//! keyed by its client IP, or refused with 401, as the identity's `on_invalid` says.
//!
//! A request that carries more than one value where an identity reads one (two credentials in
//! `Authorization`, two `X-User` lines or a comma list in one, two cookies or query parameters of
//! the identity's name) cannot be read one way: apps join, split and pick such values
//! differently, so whichever tollgate keyed on, an app could serve another caller. When such a
//! source is reached the request is refused, 400, whatever `on_invalid` says ([`Ambiguity`]).
//!
//! Every value is passed through [`key::key_part`] before it reaches a store key, because all
//! of these values except the client IP are written by the client. The key fragment also names the kind of source that answered, so a client cannot
//! put a victim's IP address into, say, an API-key header and drain that victim's bucket.

pub mod ambiguity;
pub mod caller;
pub mod client_ip;
pub mod display;
pub mod jwt;
pub mod key;

use std::borrow::Cow;
use std::net::IpAddr;

use http::header::{AUTHORIZATION, COOKIE};
use http::HeaderName;

pub use ambiguity::Ambiguity;
pub use client_ip::{client_ip, TrustedProxies};
pub use display::Display;
pub use jwt::{JwtConfigError, JwtVerifier, Refusal};

/// One place an identity value can come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// The value of that header, if present and non-empty; two lines or a comma are
    /// [`Ambiguity::Header`].
    Header(HeaderName),
    /// `name=value` in the query string, percent-decoded (form rules), `name[]=` and
    /// `name[0]=` too; empty = absent; the name twice is [`Ambiguity::Query`].
    Query(String),
    /// A field of an `application/x-www-form-urlencoded` request body, read as a `query` source
    /// reads the query string ([`FormBody`]: the proxy reads the body, bounded, only on routes
    /// whose identities name a form field); absent without such a body.
    Form(String),
    /// Cookie of that name from any Cookie header line, decoded as apps decode it
    /// ([`decode_cookie`]); empty = absent; the name twice is [`Ambiguity::Cookie`], a spelling
    /// apps decode differently [`Ambiguity::CookieSpelling`].
    Cookie(String),
    /// The token of `Authorization: Bearer <token>` (scheme case-insensitive); its value is
    /// always hashed into the key, never stored raw. More than one credential is
    /// [`Ambiguity::Credentials`], a byte outside ASCII [`Ambiguity::CredentialBytes`].
    Bearer,
    /// A verified claim of the bearer token; an unverifiable token counts as absent.
    Jwt(JwtVerifier),
    /// 1-based path segment: for `/t/abc/x`, 1 = "t", 2 = "abc"; missing/empty = absent.
    /// The segment is percent-decoded so `/t/%61bc` cannot dodge the bucket of `/t/abc`.
    PathSegment(usize),
    /// The client address; always present.
    ClientIp,
    /// One bucket for everyone (key part `*`); always present. Used by the built-in "global".
    Global,
}

impl Source {
    /// Short machine name of the source kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Header(_) => "header",
            Source::Query(_) => "query",
            Source::Form(_) => "form",
            Source::Cookie(_) => "cookie",
            Source::Bearer => "bearer",
            Source::Jwt(_) => "jwt",
            Source::PathSegment(_) => "path_segment",
            Source::ClientIp => "client_ip",
            Source::Global => "global",
        }
    }

    /// How values read from it are shown unless the identity's `display` says otherwise:
    /// `digest` for credentials (bearer tokens; headers, query parameters and cookies whose
    /// name says they hold one, [`display::is_credential_name`]), `clear` for the rest.
    pub fn default_display(&self) -> Display {
        match self {
            Source::Header(name) if display::is_credential_name(name.as_str()) => Display::Digest,
            Source::Query(name) | Source::Form(name) | Source::Cookie(name)
                if display::is_credential_name(name) =>
            {
                Display::Digest
            }
            Source::Bearer => Display::Digest,
            _ => Display::Clear,
        }
    }

    /// Human description for logs and `explain` output, e.g. "header x-user-id".
    pub fn describe(&self) -> String {
        match self {
            Source::Header(name) => format!("header {name}"),
            Source::Query(name) => format!("query {name}"),
            Source::Form(name) => format!("form field {name}"),
            Source::Cookie(name) => format!("cookie {name}"),
            Source::Bearer => "bearer token".to_owned(),
            Source::Jwt(v) => format!("jwt claim {}", v.claim()),
            Source::PathSegment(n) => format!("path segment {n}"),
            Source::ClientIp => "client ip".to_owned(),
            Source::Global => "global".to_owned(),
        }
    }

    /// This source's answer for the request, None when it is absent, or why a credential that
    /// is present was refused (a bearer token a `jwt` source does not accept). `shown` (only
    /// `explain` asks) receives the value as logs may show it.
    fn extract(
        &self,
        req: &http::request::Parts,
        client_ip: IpAddr,
        shown: Option<&mut String>,
    ) -> Result<Option<Identified>, Refusal> {
        let kind = self.kind();
        if let Source::Jwt(verifier) = self {
            let Some(token) = bearer(&req.headers)? else {
                return Ok(None);
            };
            // A token that is not valid UTF-8 cannot be a JWT.
            let token = std::str::from_utf8(token).map_err(|_| Refusal::Malformed)?;
            let claim = verifier.check(token)?;
            return Ok(Some(Identified::readable(kind, claim.as_bytes(), shown)));
        }
        Ok(match self {
            Source::Header(name) => {
                header(&req.headers, name)?.map(|v| Identified::readable(kind, v, shown))
            }
            Source::Query(name) => match req.uri.query() {
                Some(query) => query_param_once(query.as_bytes(), name, Ambiguity::Query)?
                    .and_then(|value| {
                        non_empty(&value).map(|v| Identified::readable(kind, v, shown))
                    }),
                None => None,
            },
            Source::Form(name) => match req.extensions.get::<FormBody>() {
                Some(FormBody(body)) => {
                    query_param_once(body, name, Ambiguity::Form)?.and_then(|value| {
                        non_empty(&value).map(|v| Identified::readable(kind, v, shown))
                    })
                }
                None => None,
            },
            Source::Cookie(name) => cookie(&req.headers, name.as_bytes())?
                .map(|v| Identified::readable(kind, &v, shown)),
            Source::Bearer => bearer(&req.headers)?.map(|token| {
                let mut key_part = String::with_capacity(kind.len() + 44);
                key_part.push_str(kind);
                key::push_hashed_forms(token, &mut key_part, shown);
                Identified {
                    source: 0,
                    source_kind: kind,
                    key_part,
                    refused: None,
                }
            }),
            Source::Jwt(_) => unreachable!("answered above"),
            Source::PathSegment(n) => path_segment(req.uri.path(), *n).and_then(|segment| {
                let decoded = percent_decode(segment.as_bytes(), false);
                non_empty(&decoded).map(|v| Identified::readable(kind, v, shown))
            }),
            Source::ClientIp => Some(Identified::ip(client_ip, shown)),
            Source::Global => Some(Identified::global(shown)),
        })
    }
}

/// What an identity does with a caller whose credential is present but refused (`on_invalid`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnInvalid {
    /// Key the caller by its client IP for this request (never by a later, weaker source).
    #[default]
    ClientIp,
    /// Refuse the request: 401.
    Reject,
}

impl OnInvalid {
    /// As the file spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnInvalid::ClientIp => "client_ip",
            OnInvalid::Reject => "reject",
        }
    }
}

/// A named, ordered list of sources.
#[derive(Debug, Clone)]
pub struct Identity {
    pub name: String,
    pub sources: Vec<Source>,
    /// What a refused credential means (see the module docs).
    pub on_invalid: OnInvalid,
    /// How its values are shown (`display`); None: by source ([`Display::default_for`]).
    pub display: Option<Display>,
}

/// The result: which source answered and the value, already made safe for a store key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identified {
    /// Index into `sources`, or `usize::MAX` for the client-IP fallback.
    pub source: usize,
    /// [`Source::kind`] of the answering source ("client_ip" for the fallback).
    pub source_kind: &'static str,
    /// `<source_kind><key::key_part(value)>`, e.g. `header=alice`, `client_ip=10.1.2.3`,
    /// `bearer#<digest>`; `*` for the global identity. Contains no `{`, `}`, `:`, `|` or
    /// whitespace, and is at most 77 bytes.
    pub key_part: String,
    /// Why the caller's credential was refused, when it was: the caller is then keyed by its
    /// client IP (`source` is the fallback's), or refused, as the identity's `on_invalid` says
    /// ([`Refusal::Ambiguous`]: always refused, 400).
    pub refused: Option<Refusal>,
}

impl Identified {
    /// Whether the caller's value is `raw`. Compared in key form, so sources whose values are
    /// only ever kept hashed (bearer tokens) compare too.
    pub fn is_value(&self, raw: &[u8]) -> bool {
        if self.source_kind == "global" {
            return false;
        }
        let Some(part) = self.key_part.strip_prefix(self.source_kind) else {
            return false;
        };
        part == key::key_part(raw) || part == key::hashed_part(raw)
    }

    /// The key part is written once, into a string of its final size: this runs for every
    /// limited request.
    fn readable(kind: &'static str, value: &[u8], shown: Option<&mut String>) -> Self {
        // Room for the readable form (up to 65 bytes) or the hashed one (44).
        let mut key_part = String::with_capacity(kind.len() + 1 + value.len().clamp(43, 64));
        key_part.push_str(kind);
        key::push_key_part(value, &mut key_part);
        if let Some(shown) = shown {
            *shown = key::display_value(value);
        }
        Identified {
            source: 0,
            source_kind: kind,
            key_part,
            refused: None,
        }
    }

    fn ip(ip: IpAddr, shown: Option<&mut String>) -> Self {
        let mut text = client_ip::IpText::default();
        let text = text.write(ip.to_canonical());
        let mut key_part = String::with_capacity("client_ip".len() + 44);
        key_part.push_str("client_ip");
        // IPv6 text contains `:`, so it is hashed like any other unsafe value.
        key::push_key_part(text.as_bytes(), &mut key_part);
        if let Some(shown) = shown {
            // Our own formatting of a parsed address: always safe to log as is.
            text.clone_into(shown);
        }
        Identified {
            source: 0,
            source_kind: "client_ip",
            key_part,
            refused: None,
        }
    }

    fn global(shown: Option<&mut String>) -> Self {
        if let Some(shown) = shown {
            "*".clone_into(shown);
        }
        Identified {
            source: 0,
            source_kind: "global",
            key_part: "*".to_owned(),
            refused: None,
        }
    }
}

impl Identity {
    /// Tries the sources in order; the first present wins. If none is present the request is
    /// keyed by the client IP (source_kind "client_ip", fallback). A bearer token a `jwt`
    /// source refuses leaves only the identity's later `jwt` sources to try (another issuer
    /// may accept it); if none does, the caller is keyed by its client IP with the refusal
    /// noted (`refused`), never by a weaker source the client chooses.
    pub fn identify(&self, req: &http::request::Parts, client_ip: IpAddr) -> Identified {
        self.identify_into(req, client_ip, None)
    }

    /// [`Identity::identify`], and the value as logs and `explain` show it: as is when short
    /// and safe, else `sha256:<first 12 hex>`; bearer tokens always hashed; client IPs always
    /// shown. Kept apart because the request path never shows it.
    pub fn identify_shown(
        &self,
        req: &http::request::Parts,
        client_ip: IpAddr,
    ) -> (Identified, String) {
        let mut shown = String::new();
        let identified = self.identify_into(req, client_ip, Some(&mut shown));
        (identified, shown)
    }

    fn identify_into(
        &self,
        req: &http::request::Parts,
        client_ip: IpAddr,
        mut shown: Option<&mut String>,
    ) -> Identified {
        let mut refused = None;
        for (index, source) in self.sources.iter().enumerate() {
            if refused.is_some() && !matches!(source, Source::Jwt(_)) {
                continue;
            }
            match source.extract(req, client_ip, shown.as_deref_mut()) {
                Ok(Some(mut found)) => {
                    found.source = index;
                    return found;
                }
                Ok(None) => {}
                // Nothing to key on that every app would agree with: refused whatever else the
                // request carries.
                Err(why @ Refusal::Ambiguous(_)) => {
                    refused = Some(why);
                    break;
                }
                Err(why) => {
                    refused.get_or_insert(why);
                }
            }
        }
        let mut fallback = Identified::ip(client_ip, shown);
        fallback.source = usize::MAX;
        fallback.refused = refused;
        fallback
    }
}

impl Identity {
    /// The key parts a caller presenting the raw value `raw` can have under this identity, one
    /// per way it may have been identified (each source in order, then the client-IP fallback
    /// when `raw` is an address), without duplicates. The same bytes the request path writes:
    /// operators name a caller by value (`tollgate limits get`) and find its keys with these.
    pub fn key_parts_for_value(&self, raw: &[u8]) -> Vec<String> {
        let ip = std::str::from_utf8(raw)
            .ok()
            .and_then(|text| text.trim().parse::<IpAddr>().ok());
        let mut parts: Vec<String> = Vec::new();
        let mut add = |part: String| {
            if !parts.contains(&part) {
                parts.push(part);
            }
        };
        for source in &self.sources {
            let kind = source.kind();
            match source {
                Source::Header(_)
                | Source::Query(_)
                | Source::Form(_)
                | Source::Cookie(_)
                | Source::Jwt(_)
                | Source::PathSegment(_) => {
                    if !raw.is_empty() {
                        add(Identified::readable(kind, raw, None).key_part);
                    }
                }
                Source::Bearer => {
                    if !raw.is_empty() {
                        let mut part = kind.to_owned();
                        key::push_hashed_forms(raw, &mut part, None);
                        add(part);
                    }
                }
                Source::ClientIp => {
                    if let Some(ip) = ip {
                        add(Identified::ip(ip, None).key_part);
                    }
                }
                Source::Global => add(Identified::global(None).key_part),
            }
        }
        let always_present = self
            .sources
            .iter()
            .any(|s| matches!(s, Source::ClientIp | Source::Global));
        if let (Some(ip), false) = (ip, always_present) {
            add(Identified::ip(ip, None).key_part);
        }
        parts
    }
}

/// How a key part (`header=alice`, `bearer#<digest>`, `*`) is shown in logs and `explain`:
/// the source kind and the value (readable values as is, hashed ones as `sha256:<12 hex>` from
/// the same digest). A client IPv6 address is kept hashed in keys, so it shows as a digest too.
pub fn shown_from_key_part(part: &str) -> (&str, String) {
    if part == "*" {
        return ("global", "*".to_owned());
    }
    if let Some(at) = part.find('=') {
        return (&part[..at], part[at + 1..].to_owned());
    }
    if let Some(at) = part.find('#') {
        use base64::Engine as _;
        let digest = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(&part[at + 1..]);
        let shown = match digest {
            Ok(digest) if digest.len() >= 6 => {
                let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
                format!("sha256:{hex}")
            }
            _ => "sha256:?".to_owned(),
        };
        return (&part[..at], shown);
    }
    ("unknown", part.to_owned())
}

/// Built-in identities, always defined: "client_ip" ([ClientIp]) and "global" (one bucket for
/// everyone: key_part "*", source_kind "global").
pub fn builtin(name: &str) -> Option<Identity> {
    let source = match name {
        "client_ip" => Source::ClientIp,
        "global" => Source::Global,
        _ => return None,
    };
    Some(Identity {
        name: name.to_owned(),
        sources: vec![source],
        on_invalid: OnInvalid::default(),
        display: None,
    })
}

fn non_empty(value: &[u8]) -> Option<&[u8]> {
    (!value.is_empty()).then_some(value)
}

/// The decoded value of the first `name=...` pair (form rules: `+` is a space, `%XX` a byte).
/// Decoding is to bytes, not lossy UTF-8, so distinct raw values stay distinct keys.
pub(crate) fn query_param(query: &str, name: &str) -> Option<Vec<u8>> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k.as_bytes(), true) == name.as_bytes())
                .then(|| percent_decode(v.as_bytes(), true))
        })
}

/// The decoded value of the one `name=...` pair (as [`query_param`]); the name twice (however
/// spelled: `user` and `us%65r` are one name) is [`Ambiguity::Query`], since apps take the first
/// (Flask), the last (Django, PHP) or both (Express).
///
/// `name[]=v` and `name[0]=v` (any digits) are the parameter too: Express's query parser and PHP
/// read them as the array `[v]`, which `String()` makes `v`; so `user[]=a&user=b` is the name
/// twice. Any other bracket form (`name[a]=v`, `name[][x]=v`) is a structure to those apps and
/// no value to others: ambiguous too.
/// A form body is read the same way; `twice` is what a second value is.
fn query_param_once(
    query: &[u8],
    name: &str,
    twice: Ambiguity,
) -> Result<Option<Vec<u8>>, Refusal> {
    let ambiguous = Err(Refusal::Ambiguous(twice));
    let mut found = None;
    for pair in query.split(|&b| b == b'&').filter(|pair| !pair.is_empty()) {
        let (k, v) = match pair.iter().position(|&b| b == b'=') {
            Some(at) => (&pair[..at], &pair[at + 1..]),
            None => (pair, &b""[..]),
        };
        let decoded;
        let k = match k.iter().any(|&b| b == b'%' || b == b'+') {
            true => {
                decoded = percent_decode(k, true);
                &decoded[..]
            }
            false => k,
        };
        let Some(rest) = k.strip_prefix(name.as_bytes()) else {
            continue;
        };
        match rest {
            [] => {}
            [b'[', index @ .., b']'] if index.iter().all(u8::is_ascii_digit) => {}
            [b'[', ..] => return ambiguous,
            _ => continue,
        }
        if found.is_some() {
            return ambiguous;
        }
        found = Some(percent_decode(v, true));
    }
    Ok(found)
}

/// The body of an `application/x-www-form-urlencoded` request, read (bounded) by the proxy
/// before its caller is identified, on a route whose identities name a form field
/// ([`Source::Form`]); kept in the request's extensions. The same bytes are forwarded.
#[derive(Debug, Clone)]
pub struct FormBody(pub bytes::Bytes);

/// Whether `identity` reads a form field: a request on its routes has its form body read.
pub fn reads_form(identity: &Identity) -> bool {
    identity
        .sources
        .iter()
        .any(|source| matches!(source, Source::Form(_)))
}

/// Every value of the query parameter `name`, decoded (form rules), in order.
pub(crate) fn query_values<'q>(
    query: &'q str,
    name: &'q str,
) -> impl Iterator<Item = Vec<u8>> + 'q {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter_map(move |pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k.as_bytes(), true) == name.as_bytes())
                .then(|| percent_decode(v.as_bytes(), true))
        })
}

/// `%XX` becomes the byte; with `plus_is_space`, `+` becomes a space (form rules). Broken
/// escapes are kept literally, as browsers and `form_urlencoded` do.
fn percent_decode(input: &[u8], plus_is_space: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        let b = input[i];
        if b == b'%' {
            if let (Some(hi), Some(lo)) = (
                input.get(i + 1).and_then(|&c| hex_value(c)),
                input.get(i + 2).and_then(|&c| hex_value(c)),
            ) {
                out.push(hi << 4 | lo);
                i += 3;
                continue;
            }
        }
        out.push(if plus_is_space && b == b'+' { b' ' } else { b });
        i += 1;
    }
    out
}

fn hex_value(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// The value of cookie `name` from any `Cookie` line (`a=1; b=2`), decoded as the apps behind
/// tollgate decode it ([`decode_cookie`]). Empty = absent. The name twice, in one line or across
/// lines, is [`Ambiguity::Cookie`] (Express and Flask take the first, Django the last).
/// Whitespace apps trim beyond ASCII's (U+00A0, U+0085 of a Latin-1 decoded header: JS `trim()`,
/// Python `strip()`) around the name or the value is [`Ambiguity::CookieSpelling`]: the name is
/// still found under it, so the spelling cannot hide a second value either.
fn cookie<'a>(headers: &'a http::HeaderMap, name: &[u8]) -> Result<Option<Cow<'a, [u8]>>, Refusal> {
    let mut found = None;
    for line in headers.get_all(COOKIE) {
        for pair in line.as_bytes().split(|&b| b == b';') {
            let Some(eq) = pair.iter().position(|&b| b == b'=') else {
                continue;
            };
            let (raw_name, raw_value) = (&pair[..eq], &pair[eq + 1..]);
            if trim_wide(raw_name) != name {
                continue;
            }
            if found.is_some() {
                return Err(Refusal::Ambiguous(Ambiguity::Cookie));
            }
            let value = raw_value.trim_ascii();
            if raw_name.trim_ascii() != name || trim_wide(raw_value) != value {
                return Err(Refusal::Ambiguous(Ambiguity::CookieSpelling));
            }
            found = Some(value);
        }
    }
    let Some(value) = found else {
        return Ok(None);
    };
    Ok(Some(decode_cookie(value)?).filter(|v| !v.is_empty()))
}

/// Whitespace as apps trim it around cookie names and values and method overrides: ASCII's, and the Latin-1 bytes of
/// U+0085 (Python) and U+00A0 (Python and JS).
pub(crate) fn trim_wide(mut bytes: &[u8]) -> &[u8] {
    let wide = |b: &u8| b.is_ascii_whitespace() || *b == 0x85 || *b == 0xa0;
    while let [first, rest @ ..] = bytes {
        if !wide(first) {
            break;
        }
        bytes = rest;
    }
    while let [rest @ .., last] = bytes {
        if !wide(last) {
            break;
        }
        bytes = rest;
    }
    bytes
}

/// A cookie value as the apps behind tollgate read it, so that every spelling of a value shares
/// its bucket; a spelling they read differently from each other is refused
/// ([`Ambiguity::CookieSpelling`]).
///
/// The key is Express's reading (the `cookie` module, then cookie-parser): the wrapping double
/// quotes dropped; percent escapes decoded when they all decode (`decodeURIComponent`: every
/// `%` starts an escape and the bytes are UTF-8, else the value stays as sent); then a `j:`
/// value is the JSON it holds. Python's readers (`http.cookies`, werkzeug, Starlette) drop the
/// wrapping quotes and decode backslash escapes inside them (`"victi\155"` is `victim`), and
/// do nothing else, so the key is a function of either reading except where the readings
/// conflict, which is refused: a backslash in a quoted value, an opening quote without a closing
/// one (`cookie` 0.x drops the last byte anyway), and a `j:` value that is not a JSON string
/// (an object or a number is no single value; JSON that `JSON.parse` and serde read
/// differently is no value either).
fn decode_cookie(raw: &[u8]) -> Result<Cow<'_, [u8]>, Refusal> {
    let spelling = || Refusal::Ambiguous(Ambiguity::CookieSpelling);
    // The common case: nothing any app decodes, all ASCII.
    if !raw
        .iter()
        .any(|&b| matches!(b, b'"' | b'%' | b'\\') || !b.is_ascii())
        && !raw.starts_with(b"j:")
    {
        return Ok(Cow::Borrowed(raw));
    }
    let value = match raw {
        [b'"', inner @ .., b'"'] => {
            if inner.contains(&b'\\') {
                return Err(spelling());
            }
            inner
        }
        [b'"', ..] => return Err(spelling()),
        _ => raw,
    };
    let text = cookie_text(value);
    if let Some(json) = text.strip_prefix("j:") {
        return match serde_json::from_str::<serde_json::Value>(json) {
            Ok(serde_json::Value::String(text)) if !text.is_empty() => {
                Ok(Cow::Owned(text.into_bytes()))
            }
            _ => Err(spelling()),
        };
    }
    Ok(Cow::Owned(text.into_bytes()))
}

/// A cookie value as the string an app holds, in UTF-8: each byte outside ASCII the Latin-1
/// character it is to Node and WSGI, and, when every `%` starts an escape and each run of
/// escapes is UTF-8, the escapes decoded (`decodeURIComponent`; otherwise nothing is decoded,
/// as Express keeps the value). So `\xe9`, `%C3%A9` and `%c3%a9` are one value.
fn cookie_text(value: &[u8]) -> String {
    let latin1 = |bytes: &[u8]| bytes.iter().map(|&b| char::from(b)).collect::<String>();
    let decoded = || -> Option<String> {
        let mut text = String::with_capacity(value.len());
        let mut at = 0;
        while at < value.len() {
            let start = at;
            while value.get(at) == Some(&b'%') {
                let hex = value.get(at + 1..at + 3)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                at += 3;
            }
            if at > start {
                let run: Vec<u8> = percent_encoding::percent_decode(&value[start..at]).collect();
                text.push_str(std::str::from_utf8(&run).ok()?);
            } else {
                text.push(char::from(value[at]));
                at += 1;
            }
        }
        Some(text)
    };
    match value.contains(&b'%') {
        true => decoded().unwrap_or_else(|| latin1(value)),
        false => latin1(value),
    }
}

/// The value of header `name`, if present and non-empty. Two lines, or a comma in the value,
/// are [`Ambiguity::Header`]: apps see the lines joined into a comma list (Node with `, `,
/// gunicorn and werkzeug with `,`) and may take its first element, its last or the whole.
/// `\xa0` or `\x85` around the value is [`Ambiguity::HeaderSpelling`] (Python and JS trim it).
fn header<'a>(
    headers: &'a http::HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'a [u8]>, Refusal> {
    let mut lines = headers.get_all(name).iter();
    let Some(value) = lines.next() else {
        return Ok(None);
    };
    if lines.next().is_some() || value.as_bytes().contains(&b',') {
        return Err(Refusal::Ambiguous(Ambiguity::Header));
    }
    let value = value.as_bytes();
    // The field's ASCII whitespace is gone already: anything more trimmed is `\xa0`/`\x85`.
    if trim_wide(value).len() != value.len() {
        return Err(Refusal::Ambiguous(Ambiguity::HeaderSpelling));
    }
    Ok(non_empty(value))
}

/// The token of the request's one credential when it is `Bearer <token>` (scheme
/// case-insensitive); None without `Authorization` or when its credential has another scheme.
///
/// `Authorization` holds one credential (RFC 9110 §11.6.2). A request with more than one (two
/// lines, which gunicorn and werkzeug join; or a comma list, `Basic eDp5, Bearer <token>`) is
/// [`Ambiguity::Credentials`]: flask-jwt-extended takes the first `Bearer` entry of such a list,
/// passport and Spring none, Node keeps the first line only. So is a `Bearer` credential
/// followed by a comma (`Bearer <token>, x=y`, which flask-jwt-extended reads as the token). A
/// comma that only separates one credential's auth-params (`Digest username="a", realm="b"`)
/// is one credential: an entry after a comma is a new credential unless it is `name=...`.
fn bearer(headers: &http::HeaderMap) -> Result<Option<&[u8]>, Refusal> {
    let ambiguous = Err(Refusal::Ambiguous(Ambiguity::Credentials));
    let mut lines = headers.get_all(AUTHORIZATION).iter();
    let Some(line) = lines.next() else {
        return Ok(None);
    };
    if lines.next().is_some() {
        return ambiguous;
    }
    // Credentials are ASCII; a byte outside it is read as whitespace by some apps (U+00A0 and
    // U+0085 of a Latin-1 decoded header) and as part of the scheme or token by others.
    if !line.as_bytes().is_ascii() {
        return Err(Refusal::Ambiguous(Ambiguity::CredentialBytes));
    }
    let value = line.as_bytes().trim_ascii();
    let has_comma = value.contains(&b',');
    if has_comma {
        // Entries that start a credential: the first non-empty one, and every later one that
        // is not an auth-param.
        let mut entries = value
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
            .filter(|entry| !entry.is_empty());
        let first = entries.next().unwrap_or_default();
        if entries.any(|entry| !is_auth_param(entry)) {
            return ambiguous;
        }
        return match is_bearer(first) {
            Some(_) => ambiguous,
            None => Ok(None),
        };
    }
    Ok(is_bearer(value))
}

/// The token of a `Bearer <token>` credential (scheme case-insensitive, non-empty token).
fn is_bearer(credential: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = credential.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || !matches!(rest.first(), Some(b' ' | b'\t')) {
        return None;
    }
    non_empty(rest.trim_ascii())
}

/// Whether a comma-separated entry of `Authorization` is an auth-param (`token BWS "=" ...`)
/// of the credential before it, rather than a credential of its own.
fn is_auth_param(entry: &[u8]) -> bool {
    let name_end = entry
        .iter()
        .position(|b| !is_tchar(*b))
        .unwrap_or(entry.len());
    name_end > 0 && entry[name_end..].trim_ascii_start().first() == Some(&b'=')
}

/// An RFC 9110 token character.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// 1-based path segment; `/t//x` has an empty segment 2.
fn path_segment(path: &str, n: usize) -> Option<&str> {
    let index = n.checked_sub(1)?;
    let path = path.strip_prefix('/').unwrap_or(path);
    path.split('/').nth(index).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod is_value_tests {
    use super::*;

    #[test]
    fn values_compare_in_key_form_for_every_source() {
        let parts = http::Request::get("/t/abc?token=q%20v")
            .header("x-user", "alice")
            .header("authorization", "Bearer secret-token")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let by = |source: Source| {
            Identity {
                name: "x".into(),
                sources: vec![source],
                on_invalid: OnInvalid::default(),
                display: None,
            }
            .identify(&parts, ip)
        };
        assert!(by(Source::Header(http::HeaderName::from_static("x-user"))).is_value(b"alice"));
        assert!(!by(Source::Header(http::HeaderName::from_static("x-user"))).is_value(b"alic"));
        assert!(by(Source::Query("token".into())).is_value(b"q v"));
        assert!(by(Source::Bearer).is_value(b"secret-token"));
        assert!(by(Source::PathSegment(2)).is_value(b"abc"));
        assert!(by(Source::ClientIp).is_value(b"10.0.0.1"));
        assert!(!by(Source::Global).is_value(b"*"));
    }

    #[test]
    fn key_parts_for_a_value_match_what_requests_produce() {
        let parts = http::Request::get("/t/abc")
            .header("x-user", "alice")
            .header("authorization", "Bearer secret-token")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let one = |source: Source| Identity {
            name: "x".into(),
            sources: vec![source],
            on_invalid: OnInvalid::default(),
            display: None,
        };
        let header = one(Source::Header(http::HeaderName::from_static("x-user")));
        assert_eq!(
            header.key_parts_for_value(b"alice"),
            vec![header.identify(&parts, ip).key_part]
        );
        let bearer = one(Source::Bearer);
        assert_eq!(
            bearer.key_parts_for_value(b"secret-token"),
            vec![bearer.identify(&parts, ip).key_part]
        );
        // An address also names the client-IP fallback.
        let by_ip = header.key_parts_for_value(b"10.0.0.1");
        assert_eq!(by_ip.len(), 2);
        assert_eq!(
            by_ip[1],
            one(Source::ClientIp).identify(&parts, ip).key_part
        );
        let bearer_part = bearer.identify(&parts, ip).key_part;
        let (kind, shown) = shown_from_key_part(&bearer_part);
        assert_eq!(
            (kind, shown),
            ("bearer", key::display_hash(b"secret-token"))
        );
        assert_eq!(
            shown_from_key_part("header=alice"),
            ("header", "alice".to_owned())
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

    const PEER: &str = "203.0.113.7";

    /// An identification with the value as logs show it, which the request path never asks for.
    #[derive(Debug)]
    struct Seen {
        source: usize,
        source_kind: &'static str,
        key_part: String,
        display: String,
    }

    impl Identity {
        fn seen(&self, req: &http::request::Parts, client_ip: IpAddr) -> Seen {
            let (id, display) = self.identify_shown(req, client_ip);
            // The request path's identification is the same, only without the shown value.
            assert_eq!(self.identify(req, client_ip), id);
            Seen {
                source: id.source,
                source_kind: id.source_kind,
                key_part: id.key_part,
                display,
            }
        }
    }

    fn peer() -> IpAddr {
        PEER.parse().unwrap()
    }

    fn parts(uri: &str, headers: &[(&str, &[u8])]) -> http::request::Parts {
        let mut b = http::Request::builder().uri(uri);
        for (name, value) in headers {
            b = b.header(*name, http::HeaderValue::from_bytes(value).unwrap());
        }
        b.body(()).unwrap().into_parts().0
    }

    fn one(source: Source) -> Identity {
        Identity {
            name: "test".into(),
            sources: vec![source],
            on_invalid: OnInvalid::default(),
            display: None,
        }
    }

    fn is_fallback(id: &Seen) -> bool {
        id.source == usize::MAX && id.source_kind == "client_ip" && id.display == PEER
    }

    /// Refused as ambiguous (keyed, if anything asked, by the client IP).
    fn is_ambiguous(ident: &Identity, req: &http::request::Parts, what: Ambiguity) -> bool {
        let id = ident.identify(req, peer());
        id.refused == Some(Refusal::Ambiguous(what))
            && id.source == usize::MAX
            && id.key_part == format!("client_ip={PEER}")
    }

    #[test]
    fn header_present_absent_empty() {
        let ident = one(Source::Header(HeaderName::from_static("x-user-id")));
        let id = ident.seen(&parts("/", &[("x-user-id", b"alice")]), peer());
        assert_eq!(id.source, 0);
        assert_eq!(id.source_kind, "header");
        assert_eq!(id.key_part, "header=alice");
        assert_eq!(id.display, "alice");
        // Two values (two lines, or a comma list in one) are refused, whatever `on_invalid`.
        let two = parts("/", &[("x-user-id", b"first"), ("x-user-id", b"second")]);
        assert!(is_ambiguous(&ident, &two, Ambiguity::Header));
        let list = parts("/", &[("x-user-id", b"first,second")]);
        assert!(is_ambiguous(&ident, &list, Ambiguity::Header));
        let empty_second = parts("/", &[("x-user-id", b"first"), ("x-user-id", b"")]);
        assert!(is_ambiguous(&ident, &empty_second, Ambiguity::Header));
        assert!(is_fallback(&ident.seen(&parts("/", &[]), peer())));
        assert!(is_fallback(
            &ident.seen(&parts("/", &[("x-user-id", b"")]), peer())
        ));
        // Unsafe values are hashed in both key and display.
        let id = ident.seen(&parts("/", &[("x-user-id", b"a:b{c}")]), peer());
        assert!(id.key_part.starts_with("header#"));
        assert!(id.display.starts_with("sha256:"));
        let id = ident.seen(&parts("/", &[("x-user-id", b"caf\xc3\xa9")]), peer());
        assert!(id.key_part.starts_with("header#"));
    }

    #[test]
    fn query_present_absent_empty_and_decoding() {
        let ident = one(Source::Query("user".into()));
        let q = |uri: &str| ident.seen(&parts(uri, &[]), peer());
        assert_eq!(q("/x?a=1&user=bob&b=2").display, "bob");
        // The name twice, however spelled, is refused.
        for twice in [
            "/x?a=1&user=bob&user=eve",
            "/x?user=bob&us%65r=eve",
            "/x?user=&user=eve",
        ] {
            assert!(
                is_ambiguous(&ident, &parts(twice, &[]), Ambiguity::Query),
                "{twice}"
            );
        }
        assert_eq!(q("/x?user=bob").key_part, "query=bob");
        assert!(is_fallback(&q("/x")));
        assert!(is_fallback(&q("/x?other=1")));
        assert!(is_fallback(&q("/x?user=")));
        assert!(is_fallback(&q("/x?user")));
        assert!(is_fallback(&q("/x?username=bob")));
        // Form decoding: %XX and + are decoded, in names too; broken escapes stay literal.
        assert_eq!(q("/x?user=b%6Fb").display, "bob");
        assert_eq!(q("/x?us%65r=bob").display, "bob");
        assert_eq!(q("/x?user=a%40b.c").display, "a@b.c");
        assert_eq!(
            q("/x?user=a+b").key_part,
            format!("query{}", key::key_part(b"a b"))
        );
        assert_eq!(
            q("/x?user=a%2").key_part,
            format!("query{}", key::key_part(b"a%2"))
        );
        // Invalid UTF-8 stays bytes, so two different values never share a key.
        assert_ne!(q("/x?user=%FF").key_part, q("/x?user=%FE").key_part);
    }

    #[test]
    fn percent_decoding_helper() {
        assert_eq!(percent_decode(b"a%20b+c", true), b"a b c");
        assert_eq!(percent_decode(b"a%20b+c", false), b"a b+c");
        assert_eq!(percent_decode(b"%", true), b"%");
        assert_eq!(percent_decode(b"%4", true), b"%4");
        assert_eq!(percent_decode(b"%zz%41", true), b"%zzA");
        assert_eq!(percent_decode(b"%ff", true), b"\xff");
    }

    #[test]
    fn cookie_present_absent_empty_multi_line() {
        let ident = one(Source::Cookie("sid".into()));
        let c = |lines: &[&[u8]]| {
            let hs: Vec<(&str, &[u8])> = lines.iter().map(|l| ("cookie", *l)).collect();
            ident.seen(&parts("/", &hs), peer())
        };
        assert_eq!(c(&[b"sid=abc"]).key_part, "cookie=abc");
        assert_eq!(c(&[b"a=1; sid=abc; b=2"]).display, "abc");
        assert_eq!(c(&[b"a=1", b"b=2; sid=xyz"]).display, "xyz");
        assert_eq!(c(&[b"sid=\"quoted\""]).display, "quoted");
        let ambiguous = |lines: &[&[u8]]| {
            let hs: Vec<(&str, &[u8])> = lines.iter().map(|l| ("cookie", *l)).collect();
            is_ambiguous(&ident, &parts("/", &hs), Ambiguity::Cookie)
        };
        assert!(ambiguous(&[b"sid=first", b"sid=second"]));
        assert!(ambiguous(&[b"sid=first; a=1; sid=second"]));
        assert!(ambiguous(&[b"sid=; sid=second"]));
        assert!(is_fallback(&c(&[])));
        assert!(is_fallback(&c(&[b"a=1; sidx=2; xsid=3"])));
        assert!(is_fallback(&c(&[b"sid="])));
        assert!(is_fallback(&c(&[b"sid=\"\""])));
        assert!(is_fallback(&c(&[b"sid"])));
    }

    /// Cookie values are keyed as apps decode them; spellings apps decode differently from
    /// each other are refused.
    #[test]
    fn cookie_values_are_keyed_decoded() {
        let ident = one(Source::Cookie("sid".into()));
        let key = |line: &[u8]| {
            ident
                .seen(&parts("/", &[("cookie", line)]), peer())
                .key_part
        };
        let plain = key(b"sid=victim");
        assert_eq!(plain, "cookie=victim");
        for same in [
            &b"sid=vic%74im"[..],
            b"sid=\"victim\"",
            b"sid=\"vic%74im\"",
            b"sid=j:\"victim\"",
            b"sid=j:\"victi\\u006d\"",
            b"sid=j%3A%22victim%22",
            b" sid = victim ",
        ] {
            assert_eq!(key(same), plain, "{}", String::from_utf8_lossy(same));
        }
        // Escapes that do not all decode, or decode to no UTF-8: kept as sent.
        assert_eq!(
            key(b"sid=a%zz%41"),
            format!("cookie{}", key::key_part(b"a%zz%41"))
        );
        assert_eq!(
            key(b"sid=a%ff"),
            format!("cookie{}", key::key_part(b"a%ff"))
        );
        assert_eq!(
            key(b"sid=s%3Aabc.sig"),
            format!("cookie{}", key::key_part(b"s:abc.sig"))
        );
        for refused in [
            &b"sid=\"victi\\155\""[..],
            b"sid=\"victim",
            b"sid=\"",
            b"sid=j:victim",
            b"sid=j:1",
            b"sid=j:\"\"",
            b"sid=j:{\"a\":1}",
            b"sid=victim\xa0",
            b"sid=\x85victim",
            b"\xa0sid=victim",
        ] {
            assert!(
                is_ambiguous(
                    &ident,
                    &parts("/", &[("cookie", refused)]),
                    Ambiguity::CookieSpelling
                ),
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
        assert!(is_ambiguous(
            &ident,
            &parts("/", &[("cookie", b"sid=a; \xa0sid=b")]),
            Ambiguity::Cookie
        ));
        // A byte outside ASCII is its Latin-1 character, as escapes decode it.
        assert_eq!(key(b"sid=caf\xe9"), key(b"sid=caf%C3%A9"));
        assert_eq!(key(b"sid=\xe9%41"), key(b"sid=\xe9A"));
        assert_eq!(key(b"sid=j%3A%22caf%C3%A9%22"), key(b"sid=caf\xe9"));
        assert!(key(b"sid=caf\xe9").starts_with("cookie#"));
        // An escape run that is no UTF-8 leaves every escape as sent.
        assert_eq!(
            key(b"sid=%41%E9"),
            format!("cookie{}", key::key_part(b"%41%E9"))
        );
    }

    /// `name[]` and `name[<digits>]` are the parameter; other bracket forms are ambiguous.
    #[test]
    fn bracket_forms_of_a_query_parameter() {
        let ident = one(Source::Query("user".into()));
        let key = |uri: &str| ident.seen(&parts(uri, &[]), peer()).key_part;
        for uri in [
            "/?user=v",
            "/?user[]=v",
            "/?user[0]=v",
            "/?user[12]=v",
            "/?user%5B%5D=v",
            "/?us%65r%5b3%5d=v",
            "/?users=x&user[]=v&userx[]=y",
        ] {
            assert_eq!(key(uri), "query=v", "{uri}");
        }
        for uri in [
            "/?user[]=v&user=w",
            "/?user[0]=v&user[1]=w",
            "/?user[a]=v",
            "/?user[][]=v",
            "/?user[0]x=v",
            "/?user[x=v",
        ] {
            assert!(
                is_ambiguous(&ident, &parts(uri, &[]), Ambiguity::Query),
                "{uri}"
            );
        }
        assert!(is_fallback(&ident.seen(&parts("/?users[]=v", &[]), peer())));
    }

    /// Latin-1 whitespace apps trim around a header identity's value is refused; inside it, or
    /// UTF-8, it is part of the value.
    #[test]
    fn unicode_whitespace_around_a_header_value_is_ambiguous() {
        let ident = one(Source::Header(HeaderName::from_static("x-user")));
        for value in [
            &b"victim\xa0"[..],
            b"\xa0victim",
            b"\x85victim",
            b"victim \x85",
        ] {
            assert!(
                is_ambiguous(
                    &ident,
                    &parts("/", &[("x-user", value)]),
                    Ambiguity::HeaderSpelling
                ),
                "{}",
                String::from_utf8_lossy(value)
            );
        }
        let seen = ident.seen(&parts("/", &[("x-user", b"vic\xa0tim")]), peer());
        assert!(seen.key_part.starts_with("header#"));
    }

    /// Credentials are ASCII: a byte outside it in `Authorization` is refused.
    #[test]
    fn non_ascii_authorization_is_ambiguous() {
        for ident in [
            one(Source::Bearer),
            one(Source::Jwt(
                JwtVerifier::hmac(b"s", Algorithm::HS256, "sub").unwrap(),
            )),
        ] {
            for value in [
                &b"Bearer\xa0abc"[..],
                b"\xa0Bearer abc",
                b"Bearer\x85abc",
                b"Bearer\xc2\xa0abc",
                b"Bearer abc\xa0",
                b"Basic \xe9",
            ] {
                assert!(
                    is_ambiguous(
                        &ident,
                        &parts("/", &[("authorization", value)]),
                        Ambiguity::CredentialBytes
                    ),
                    "{}",
                    String::from_utf8_lossy(value)
                );
            }
        }
    }

    #[test]
    fn bearer_is_always_hashed() {
        let ident = one(Source::Bearer);
        let b = |v: &[u8]| ident.seen(&parts("/", &[("authorization", v)]), peer());
        let id = b(b"Bearer abc");
        assert_eq!(id.source_kind, "bearer");
        // Even a short, safe token is never stored or shown raw.
        assert_eq!(id.key_part, format!("bearer{}", key::hashed_part(b"abc")));
        assert_eq!(id.display, key::display_hash(b"abc"));
        assert!(!id.key_part.contains("abc") && !id.display.contains("abc"));
        assert_eq!(b(b"bearer abc").key_part, id.key_part);
        assert_eq!(b(b"BEARER   abc").key_part, id.key_part);
        assert!(is_fallback(&b(b"Basic YWxhZGRpbjpvcGVuc2VzYW1l")));
        assert!(is_fallback(&b(b"Bearer")));
        assert!(is_fallback(&b(b"Bearer ")));
        assert!(is_fallback(&b(b"Bearerabc")));
        assert!(is_fallback(&ident.seen(&parts("/", &[]), peer())));
    }

    /// Issue 38: a bearer token hidden beside another credential. More than one credential in
    /// `Authorization` (two lines or a comma list), or a Bearer credential with a comma, is
    /// refused; one credential's auth-params are not a second credential.
    #[test]
    fn more_than_one_credential_is_ambiguous() {
        let secret = b"mod-test-secret";
        let jwt = Source::Jwt(JwtVerifier::hmac(secret, Algorithm::HS256, "sub").unwrap());
        for ident in [one(Source::Bearer), one(jwt)] {
            let auth = |lines: &[&[u8]]| {
                let hs: Vec<(&str, &[u8])> = lines.iter().map(|l| ("authorization", *l)).collect();
                parts("/", &hs)
            };
            for lines in [
                &[&b"Basic eDp5, Bearer abc"[..]][..],
                &[b"Bearer abc, Basic eDp5"],
                &[b"Bearer abc, Bearer def"],
                &[b"Basic eDp5,Bearer\tabc"],
                &[b"Digest username=\"a, Bearer abc, x\""],
                &[b"Bearer abc,"],
                &[b", Bearer abc"],
                &[b"Bearer abc, realm=x"],
                &[b"Basic eDp5, Negotiate"],
                &[b"Basic eDp5", b"Bearer abc"],
                &[b"Bearer abc", b"Bearer abc"],
                &[b"Basic eDp5", b"Basic eDp5"],
            ] {
                assert!(
                    is_ambiguous(&ident, &auth(lines), Ambiguity::Credentials),
                    "{:?} {lines:?}",
                    ident.sources[0].kind()
                );
            }
            // One credential, its auth-params after commas: not a bearer token, not ambiguous.
            for one_credential in [
                &b"Digest username=\"Mufasa\", realm=\"x@y\", nonce=\"n\", qop=auth"[..],
                b"AWS4-HMAC-SHA256 Credential=AKIA/20130524/us-east-1/s3/aws4_request, SignedHeaders=host;range, Signature=fe5f",
                b"Basic eDp5",
            ] {
                assert!(
                    is_fallback(&ident.seen(&auth(&[one_credential]), peer())),
                    "{one_credential:?}"
                );
                assert_eq!(ident.identify(&auth(&[one_credential]), peer()).refused, None);
            }
        }
        let id = one(Source::Bearer).seen(&parts("/", &[("authorization", b"Bearer abc")]), peer());
        assert_eq!(id.key_part, format!("bearer{}", key::hashed_part(b"abc")));
    }

    /// An ambiguous source refuses the request even when `on_invalid` is `client_ip`, and
    /// only when it is reached: an earlier source that answers leaves it unread.
    #[test]
    fn ambiguity_is_met_only_where_the_identity_reads() {
        let ident = Identity {
            name: "user".into(),
            sources: vec![
                Source::Bearer,
                Source::Header(HeaderName::from_static("x-user")),
            ],
            on_invalid: OnInvalid::ClientIp,
            display: None,
        };
        let both = parts(
            "/",
            &[
                ("authorization", b"Bearer abc"),
                ("x-user", b"a"),
                ("x-user", b"b"),
            ],
        );
        assert_eq!(ident.identify(&both, peer()).source, 0);
        let hidden = parts(
            "/",
            &[
                ("authorization", b"Basic eDp5, Bearer abc"),
                ("x-user", b"anything"),
            ],
        );
        assert!(is_ambiguous(&ident, &hidden, Ambiguity::Credentials));
        let header_only = parts("/", &[("x-user", b"a, b")]);
        assert!(is_ambiguous(&ident, &header_only, Ambiguity::Header));
    }

    #[test]
    fn jwt_source() {
        let secret = b"mod-test-secret";
        let verifier = JwtVerifier::hmac(secret, Algorithm::HS256, "sub").unwrap();
        let ident = one(Source::Jwt(verifier));
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 300;
        let token = |key: &[u8]| {
            encode(
                &Header::new(Algorithm::HS256),
                &serde_json::json!({"sub": "user-7", "exp": exp}),
                &EncodingKey::from_secret(key),
            )
            .unwrap()
        };
        let auth = format!("Bearer {}", token(secret));
        let id = ident.seen(&parts("/", &[("authorization", auth.as_bytes())]), peer());
        assert_eq!(id.source_kind, "jwt");
        assert_eq!(id.key_part, "jwt=user-7");
        assert_eq!(id.display, "user-7");
        let forged = format!("Bearer {}", token(b"wrong"));
        let id = ident.seen(&parts("/", &[("authorization", forged.as_bytes())]), peer());
        assert!(is_fallback(&id));
        assert!(is_fallback(&ident.seen(&parts("/", &[]), peer())));
        let junk = parts("/", &[("authorization", b"Bearer \xff\xfe")]);
        assert!(is_fallback(&ident.seen(&junk, peer())));
    }

    /// A refused token never falls through to a weaker source: the caller is keyed by its
    /// client IP with the refusal noted; a later `jwt` source (another issuer) may still
    /// accept it; without a token the next source is tried as always.
    #[test]
    fn a_refused_token_never_falls_through_to_a_weaker_source() {
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 300;
        let token = |key: &[u8]| {
            let token = encode(
                &Header::new(Algorithm::HS256),
                &serde_json::json!({"sub": "user-7", "exp": exp}),
                &EncodingKey::from_secret(key),
            )
            .unwrap();
            format!("Bearer {token}")
        };
        let jwt =
            |key: &[u8]| Source::Jwt(JwtVerifier::hmac(key, Algorithm::HS256, "sub").unwrap());
        let ident = Identity {
            name: "user".into(),
            sources: vec![
                jwt(b"issuer-a"),
                Source::Header(HeaderName::from_static("x-user")),
                Source::Bearer,
                jwt(b"issuer-b"),
            ],
            on_invalid: OnInvalid::Reject,
            display: None,
        };
        let forged = token(b"forger");
        let id = ident.seen(
            &parts(
                "/",
                &[("authorization", forged.as_bytes()), ("x-user", b"victim")],
            ),
            peer(),
        );
        assert!(is_fallback(&id));
        assert_eq!(id.key_part, format!("client_ip={PEER}"));
        let request = parts(
            "/",
            &[("authorization", forged.as_bytes()), ("x-user", b"victim")],
        );
        assert_eq!(
            ident.identify(&request, peer()).refused,
            Some(Refusal::Signature)
        );
        // The second issuer's token: identified by the later jwt source.
        let b = token(b"issuer-b");
        let request = parts(
            "/",
            &[("authorization", b.as_bytes()), ("x-user", b"victim")],
        );
        let id = ident.identify(&request, peer());
        assert_eq!(
            (id.source, id.key_part.as_str(), id.refused),
            (3, "jwt=user-7", None)
        );
        // No token: the header, as before.
        let id = ident.identify(&parts("/", &[("x-user", b"alice")]), peer());
        assert_eq!(
            (id.source, id.key_part.as_str(), id.refused),
            (1, "header=alice", None)
        );
    }

    #[test]
    fn path_segment_indexing() {
        let seg = |n: usize, uri: &str| one(Source::PathSegment(n)).seen(&parts(uri, &[]), peer());
        assert_eq!(seg(1, "/t/abc/x").display, "t");
        assert_eq!(seg(2, "/t/abc/x").display, "abc");
        assert_eq!(seg(3, "/t/abc/x?q=1").display, "x");
        assert_eq!(seg(2, "/t/abc/x").key_part, "path_segment=abc");
        assert!(is_fallback(&seg(4, "/t/abc/x")));
        assert!(is_fallback(&seg(0, "/t/abc/x")));
        assert!(is_fallback(&seg(2, "/t//x")));
        assert_eq!(seg(3, "/t//x").display, "x");
        assert!(is_fallback(&seg(2, "/t/")));
        assert!(is_fallback(&seg(1, "/")));
        // Encoded spellings of the same segment share a bucket.
        assert_eq!(seg(2, "/t/%61bc").key_part, seg(2, "/t/abc").key_part);
        assert!(seg(2, "/t/a%2Fb").key_part.starts_with("path_segment#"));
    }

    #[test]
    fn client_ip_source_and_fallback() {
        let ident = one(Source::ClientIp);
        let id = ident.seen(&parts("/", &[]), peer());
        assert_eq!((id.source, id.source_kind), (0, "client_ip"));
        assert_eq!(id.key_part, format!("client_ip={PEER}"));
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let id = ident.seen(&parts("/", &[]), v6);
        assert!(id.key_part.starts_with("client_ip#"));
        assert_eq!(id.display, "2001:db8::1");
        // Mapped IPv4 keys like plain IPv4.
        let mapped: IpAddr = "::ffff:203.0.113.7".parse().unwrap();
        assert_eq!(
            ident.seen(&parts("/", &[]), mapped).key_part,
            format!("client_ip={PEER}")
        );
    }

    #[test]
    fn order_and_fallback() {
        let ident = Identity {
            name: "user".into(),
            sources: vec![
                Source::Header(HeaderName::from_static("x-api-key")),
                Source::Cookie("sid".into()),
                Source::Query("user".into()),
            ],
            on_invalid: OnInvalid::default(),
            display: None,
        };
        let all = parts("/?user=q", &[("x-api-key", b"k"), ("cookie", b"sid=c")]);
        let id = ident.seen(&all, peer());
        assert_eq!(
            (id.source, id.source_kind, id.display.as_str()),
            (0, "header", "k")
        );
        let two = parts("/?user=q", &[("cookie", b"sid=c")]);
        let id = ident.seen(&two, peer());
        assert_eq!(
            (id.source, id.source_kind, id.display.as_str()),
            (1, "cookie", "c")
        );
        let id = ident.seen(&parts("/?user=q", &[("x-api-key", b"")]), peer());
        assert_eq!(
            (id.source, id.source_kind, id.display.as_str()),
            (2, "query", "q")
        );
        let id = ident.seen(&parts("/", &[]), peer());
        assert!(is_fallback(&id));
        assert_eq!(id.key_part, format!("client_ip={PEER}"));
        // No sources at all also falls back.
        let empty = Identity {
            name: "empty".into(),
            sources: vec![],
            on_invalid: OnInvalid::default(),
            display: None,
        };
        assert!(is_fallback(&empty.seen(&parts("/", &[]), peer())));
    }

    #[test]
    fn a_header_cannot_impersonate_an_ip() {
        let ident = one(Source::Header(HeaderName::from_static("x-api-key")));
        let spoof = ident.seen(&parts("/", &[("x-api-key", PEER.as_bytes())]), peer());
        let real = ident.seen(&parts("/", &[]), peer());
        assert_ne!(spoof.key_part, real.key_part);
    }

    #[test]
    fn builtins() {
        let ip = builtin("client_ip").unwrap();
        assert_eq!(ip.name, "client_ip");
        let id = ip.seen(&parts("/", &[("x-user-id", b"a")]), peer());
        assert_eq!((id.source, id.source_kind), (0, "client_ip"));
        let global = builtin("global").unwrap();
        let id = global.seen(&parts("/", &[]), peer());
        assert_eq!((id.source_kind, id.key_part.as_str()), ("global", "*"));
        let other: IpAddr = "198.51.100.1".parse().unwrap();
        assert_eq!(global.seen(&parts("/x", &[]), other).key_part, "*");
        assert!(builtin("user").is_none());
    }

    #[test]
    fn credentials_are_shown_as_digests_by_default() {
        let header = |name: &'static str| Source::Header(HeaderName::from_static(name));
        assert_eq!(header("x-api-key").default_display(), Display::Digest);
        assert_eq!(header("x-user").default_display(), Display::Clear);
        assert_eq!(Source::Bearer.default_display(), Display::Digest);
        assert_eq!(
            Source::Query("token".into()).default_display(),
            Display::Digest
        );
        assert_eq!(
            Source::Cookie("theme".into()).default_display(),
            Display::Clear
        );
        assert_eq!(Source::ClientIp.default_display(), Display::Clear);
        assert_eq!(Source::PathSegment(2).default_display(), Display::Clear);
    }

    #[test]
    fn kinds_and_descriptions() {
        let v = JwtVerifier::hmac(b"s", Algorithm::HS256, "sub").unwrap();
        let cases = [
            (
                Source::Header(HeaderName::from_static("x-user-id")),
                "header",
                "header x-user-id",
            ),
            (Source::Query("u".into()), "query", "query u"),
            (Source::Cookie("sid".into()), "cookie", "cookie sid"),
            (Source::Bearer, "bearer", "bearer token"),
            (Source::Jwt(v), "jwt", "jwt claim sub"),
            (Source::PathSegment(2), "path_segment", "path segment 2"),
            (Source::ClientIp, "client_ip", "client ip"),
            (Source::Global, "global", "global"),
        ];
        for (source, kind, description) in cases {
            assert_eq!(source.kind(), kind);
            assert_eq!(source.describe(), description);
        }
    }
}

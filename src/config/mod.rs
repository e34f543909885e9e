//! Configuration: raw file → validated runtime config.
//!
//! Loading happens in three steps, each with its own errors, all reported as `FILE:LINE:COL:
//! what is wrong`: environment substitution (`env`), YAML parsing into raw structs with unknown
//! keys refused (`raw`), then validation into the runtime types below, which hold only values
//! that work (parsed addresses, durations, sizes). The rest of the program never sees raw text.

mod by_response;
mod env;
mod raw;
mod redis_config;
mod spans;
mod throttle;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::uri::{Authority, Scheme};

pub use by_response::{ByResponse, StatusSet};
pub use env::substitute;
use raw::{RawAdmin, RawConfig, RawListen, RawListener, RawSize};
pub use redis_config::{RedisConfig, RedisMode, RedisTls, Secret};
use spans::SpanIndex;
pub use throttle::{
    Allow, Limit, LimitSet, OnError, OnLimit, Override, ResponseConfig, Route, Scope, StoreConfig,
    Throttle, DEFAULT_KEY_PREFIX,
};

/// The validated configuration the proxy runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub file: PathBuf,
    pub listeners: Vec<Listener>,
    pub admin: Option<SocketAddr>,
    /// The bearer token the admin listener's mutating endpoints require (`admin.token_env`).
    pub admin_token: Option<Secret>,
    pub upstream: Upstream,
    /// Requests with a larger body are answered 413 (`None`: no limit).
    pub max_request_body: Option<u64>,
    pub header_read_timeout: Duration,
    /// A client connection with no request in flight and no bytes moving for this long is
    /// closed (keep-alive idlers, and peers that connect and never speak).
    pub idle_timeout: Duration,
    pub shutdown_timeout: Duration,
    pub max_connections: usize,
    /// Serving threads, each with its own runtime and upstream connection pool (`workers`).
    pub workers: usize,
    pub http2_max_concurrent_streams: u32,
    /// One log line per request (target `tollgate::access`).
    pub access_log: bool,
    pub throttle: Throttle,
}

#[derive(Debug, Clone)]
pub struct Listener {
    pub address: SocketAddr,
    pub tls: Option<TlsFiles>,
}

#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub scheme: Scheme,
    pub authority: Authority,
    pub connect_timeout: Duration,
    /// Until the response head arrives; past it the client gets 504.
    pub timeout: Duration,
    pub host: HostMode,
    /// Speak HTTP/2 to the upstream (h2c on http://, ALPN h2 on https://).
    pub http2: bool,
    /// Kept below common upstream keep-alive timeouts (Node.js: 5 s) so a pooled connection is
    /// never reused just as the upstream closes it.
    pub pool_idle_timeout: Duration,
    /// The CA certificates an https:// upstream's certificate must chain to, instead of the
    /// public roots (`ca_file`: an application behind a private CA). Read with the
    /// configuration, so a reload reads them again and a changed CA makes a new pool.
    pub ca_certs: Option<Vec<rustls_pki_types::CertificateDer<'static>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMode {
    /// Forward the client's Host header (the app sees the public name).
    Preserve,
    /// Send the upstream URL's authority as Host.
    Upstream,
}

impl Config {
    /// What `tollgate check` prints: the listeners, the upstream and the routes.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut out = format!("{}: ok\n", self.file.display());
        for l in &self.listeners {
            let scheme = if l.tls.is_some() { "https" } else { "http" };
            let _ = writeln!(out, "listen    {scheme}://{}", l.address);
        }
        if let Some(admin) = self.admin {
            let _ = writeln!(
                out,
                "admin     http://{admin} (/healthz, /readyz, /metrics, /limits/top, /limits/state, /limits/reset)"
            );
            let mutations = if self.admin_token.is_some() {
                "need the bearer token from admin.token_env"
            } else if admin.ip().is_loopback() {
                "open (loopback listener, no token)"
            } else {
                "refused (no admin.token_env, and the listener is not loopback)"
            };
            let _ = writeln!(out, "          mutations (POST /limits/reset) {mutations}");
        }
        let _ = writeln!(
            out,
            "upstream  {}://{} (HTTP/{}, timeout {})",
            self.upstream.scheme,
            self.upstream.authority,
            if self.upstream.http2 { "2" } else { "1.1" },
            humantime::format_duration(self.upstream.timeout)
        );
        let store = match &self.throttle.store {
            StoreConfig::Memory => "memory (this process only)".to_string(),
            StoreConfig::Redis { .. } => {
                format!("redis, on_error {:?}", self.throttle.on_error).to_lowercase()
            }
        };
        let _ = writeln!(out, "store     {store}");
        let _ = writeln!(
            out,
            "workers   {} serving thread{}",
            self.workers,
            if self.workers == 1 { "" } else { "s" }
        );
        if self.throttle.routes.is_empty() {
            let _ = writeln!(out, "routes    none: every request is forwarded unlimited");
        }
        for route in &self.throttle.routes {
            let mut matcher = route.path_prefix.clone().unwrap_or_else(|| "/".into());
            if let Some(methods) = &route.methods {
                let methods: Vec<&str> = methods.iter().map(|m| m.as_str()).collect();
                matcher = format!("{} {matcher}", methods.join(","));
            }
            if let Some(host) = &route.host {
                matcher = format!("{matcher} host {host}");
            }
            let key: Vec<&str> = route
                .limits
                .first()
                .map(|l| l.key.iter().map(|i| i.name.as_str()).collect())
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "route     {} ({matcher}) by {}",
                route.name,
                key.join("+")
            );
            for limit in &route.limits {
                let _ = writeln!(
                    out,
                    "  limit   {} {} {}",
                    limit.name,
                    limit.params.algorithm.name(),
                    limit.describe()
                );
            }
            for tier in &route.overrides {
                let values = if tier.values.len() == 1 {
                    "value"
                } else {
                    "values"
                };
                let _ = writeln!(
                    out,
                    "  tier    {} for {} {values} of {}",
                    tier.name,
                    tier.values.len(),
                    tier.identity.name
                );
            }
        }
        out
    }
}

/// One problem in the file, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: usize,
    pub col: usize,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file.display(),
            self.line,
            self.col,
            self.message
        )
    }
}

/// Every problem found in one file, in file order.
#[derive(Debug, Clone)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// More serving threads than this only costs memory: each holds its own connection pools.
pub const MAX_WORKERS: usize = crate::workers::MAX_THREADS;
pub const DEFAULT_H2_STREAMS: u32 = 100;

/// Reads, substitutes, parses and validates the file at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            file: path.to_path_buf(),
            line: 1,
            col: 1,
            message: format!("cannot read the configuration file: {e}"),
        }])
    })?;
    parse(path, &text, |name| std::env::var(name).ok())
}

/// Like [`load`], from text already read (`file` is only used in error messages).
pub fn parse(
    file: &Path,
    text: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Config, ConfigErrors> {
    let at = |line, col, message: String| ConfigError {
        file: file.to_path_buf(),
        line,
        col,
        message,
    };
    let text =
        substitute(text, &env).map_err(|e| ConfigErrors(vec![at(e.line, e.col, e.message)]))?;
    let raw: RawConfig = serde_yaml::from_str(&text).map_err(|e| {
        let (line, col) = e
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((1, 1));
        ConfigErrors(vec![at(line, col, explain_serde_error(&e))])
    })?;
    let mut v = Validator {
        file: file.to_path_buf(),
        spans: SpanIndex::build(&text),
        errors: Vec::new(),
        env: &env,
    };
    let config = v.config(raw);
    if v.errors.is_empty() {
        Ok(config.expect("validation without errors yields a config"))
    } else {
        v.errors.sort_by_key(|e| (e.line, e.col));
        Err(ConfigErrors(v.errors))
    }
}

/// serde_yaml's message without its trailing " at line N column M" (we print the position in
/// front, in the `FILE:LINE:COL` form editors understand), with the shapes it could not match
/// spelt out.
fn explain_serde_error(e: &serde_yaml::Error) -> String {
    let text = e.to_string();
    let text = strip_position(&text);
    if text.contains("did not match any variant of untagged enum RawListen") {
        return format!("{text}: `listen` is an address like \"0.0.0.0:8080\" or a list of addresses or {{address, tls: {{cert, key}}}}");
    }
    if text.contains("untagged enum RawKey") {
        return format!("{text}: `key` is an identity name or a list of identity names");
    }
    if text.contains("untagged enum RawSize") {
        return format!("{text}: a size is a number of bytes or text like \"10MiB\"");
    }
    if text.contains("RawSource") || text.contains("unknown variant") {
        return format!("{text} (identity sources are written `- header: NAME`, `- query: NAME`, `- cookie: NAME`, `- bearer: {{}}`, `- jwt: {{claim, secret_env | public_key_file, algorithm}}`, `- path_segment: N`, `- client_ip`)");
    }
    text
}

/// Removes serde_yaml's " at line N column M" wherever it stands in the message.
fn strip_position(text: &str) -> String {
    let Some(start) = text.find(" at line ") else {
        return text.to_string();
    };
    if !text[start..].contains(" column ") {
        return text.to_string();
    }
    let after = &text[start..];
    let end = after
        .find(" column ")
        .map(|c| {
            let digits = after[c + 8..]
                .find(|ch: char| !ch.is_ascii_digit())
                .unwrap_or(after.len() - c - 8);
            c + 8 + digits
        })
        .unwrap_or(after.len());
    strip_position(&format!("{}{}", &text[..start], &after[end..]))
}

/// Collects every problem instead of stopping at the first, so one `check` shows them all.
pub(crate) struct Validator<'e> {
    file: PathBuf,
    spans: SpanIndex,
    errors: Vec<ConfigError>,
    /// The environment, for secrets named in the file (`secret_env`).
    env: &'e dyn Fn(&str) -> Option<String>,
}

impl Validator<'_> {
    pub(crate) fn error(&mut self, path: &str, message: impl Into<String>) {
        let pos = self.spans.find(path);
        self.errors.push(ConfigError {
            file: self.file.clone(),
            line: pos.line,
            col: pos.col,
            message: format!("{path}: {}", message.into()),
        });
    }

    pub(crate) fn duration(
        &mut self,
        path: &str,
        value: Option<&str>,
        default: Duration,
    ) -> Duration {
        self.duration_from(path, value, default, false)
    }

    /// Like [`Self::duration`], with zero allowed (a leeway, a slack).
    pub(crate) fn duration_or_zero(
        &mut self,
        path: &str,
        value: Option<&str>,
        default: Duration,
    ) -> Duration {
        self.duration_from(path, value, default, true)
    }

    fn duration_from(
        &mut self,
        path: &str,
        value: Option<&str>,
        default: Duration,
        zero_ok: bool,
    ) -> Duration {
        let Some(text) = value else { return default };
        match humantime::parse_duration(text.trim()) {
            Ok(d) if zero_ok || !d.is_zero() => d,
            Ok(_) => {
                self.error(path, "must be greater than zero");
                default
            }
            Err(e) => {
                self.error(
                    path,
                    format!("`{text}` is not a duration ({e}): write a number with a unit, like 50ms, 2s, 1m, 1h"),
                );
                default
            }
        }
    }

    fn size(&mut self, path: &str, value: &RawSize) -> Option<u64> {
        match value {
            RawSize::Bytes(0) => None,
            RawSize::Bytes(n) => Some(*n),
            RawSize::Text(text) => match text.trim().parse::<bytesize::ByteSize>() {
                Ok(size) if size.as_u64() > 0 => Some(size.as_u64()),
                Ok(_) => {
                    self.error(
                        path,
                        "must be greater than zero (leave it out for no limit)",
                    );
                    None
                }
                Err(e) => {
                    self.error(path, format!("`{text}` is not a size ({e}): write e.g. 10MiB, 512KiB, 1GB or a number of bytes"));
                    None
                }
            },
        }
    }

    fn socket_addr(&mut self, path: &str, text: &str) -> Option<SocketAddr> {
        match text.trim().parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => {
                self.error(
                    path,
                    format!(
                        "`{text}` is not an address: write IP:PORT, like 0.0.0.0:8080 or [::]:8080"
                    ),
                );
                None
            }
        }
    }

    /// `admin: ADDR` or `admin: {address, token_env}`; the token is read from the environment
    /// now, and a variable that is unset or empty is an error (as for `secret_env`).
    fn admin(&mut self, raw: Option<&RawAdmin>) -> (Option<SocketAddr>, Option<Secret>) {
        match raw {
            None => (None, None),
            Some(RawAdmin::Address(a)) => (self.socket_addr("admin", a), None),
            Some(RawAdmin::Full(full)) => {
                let address = self.socket_addr("admin.address", &full.address);
                let token = full.token_env.as_ref().and_then(|var| {
                    match (self.env)(var).filter(|t| !t.trim().is_empty()) {
                        Some(token) => Some(Secret(token.trim().to_owned())),
                        None => {
                            self.error(
                                "admin.token_env",
                                format!("environment variable `{var}` (the admin bearer token) is not set or empty"),
                            );
                            None
                        }
                    }
                });
                (address, token)
            }
        }
    }

    fn config(&mut self, mut raw: RawConfig) -> Option<Config> {
        let throttle = self.throttle(&mut raw);
        let listeners = self.listeners(&raw.listen);
        let (admin, admin_token) = self.admin(raw.admin.as_ref());
        let upstream = self.upstream(&raw.upstream);
        let max_request_body = raw
            .max_request_body
            .as_ref()
            .and_then(|s| self.size("max_request_body", s));
        let header_read_timeout = self.duration(
            "header_read_timeout",
            raw.header_read_timeout.as_deref(),
            DEFAULT_HEADER_READ_TIMEOUT,
        );
        let idle_timeout = self.duration(
            "idle_timeout",
            raw.idle_timeout.as_deref(),
            DEFAULT_IDLE_TIMEOUT,
        );
        let shutdown_timeout = self.duration(
            "shutdown_timeout",
            raw.shutdown_timeout.as_deref(),
            DEFAULT_SHUTDOWN_TIMEOUT,
        );
        let max_connections = match raw.max_connections {
            Some(0) => {
                self.error("max_connections", "must be at least 1");
                0
            }
            Some(n) => n as usize,
            None => DEFAULT_MAX_CONNECTIONS,
        };
        let workers = match raw.workers {
            Some(n) if !(1..=MAX_WORKERS as u64).contains(&n) => {
                self.error(
                    "workers",
                    format!("must be from 1 to {MAX_WORKERS} (leave it out for one per core)"),
                );
                1
            }
            Some(n) => n as usize,
            None => crate::workers::default_count(),
        };
        let http2_max_concurrent_streams = match raw.http2_max_concurrent_streams {
            Some(0) => {
                self.error("http2_max_concurrent_streams", "must be at least 1");
                0
            }
            Some(n) => n,
            None => DEFAULT_H2_STREAMS,
        };
        if let (Some(admin), Some(listeners)) = (admin, listeners.as_ref()) {
            if admin.port() != 0 && listeners.iter().any(|l| l.address == admin) {
                self.error(
                    "admin",
                    "the admin listener cannot share an address with `listen`",
                );
            }
        }
        Some(Config {
            file: self.file.clone(),
            listeners: listeners?,
            admin,
            admin_token,
            upstream: upstream?,
            max_request_body,
            header_read_timeout,
            idle_timeout,
            shutdown_timeout,
            max_connections,
            workers,
            http2_max_concurrent_streams,
            access_log: raw.access_log.unwrap_or(true),
            throttle,
        })
    }

    fn listeners(&mut self, raw: &RawListen) -> Option<Vec<Listener>> {
        let entries: Vec<(String, &str, Option<&raw::RawTls>)> = match raw {
            RawListen::One(address) => vec![("listen".into(), address.as_str(), None)],
            RawListen::Many(list) => list
                .iter()
                .enumerate()
                .map(|(i, l)| match l {
                    RawListener::Address(a) => (format!("listen[{i}]"), a.as_str(), None),
                    RawListener::Full(f) => (
                        format!("listen[{i}].address"),
                        f.address.as_str(),
                        f.tls.as_ref(),
                    ),
                })
                .collect(),
        };
        if entries.is_empty() {
            self.error("listen", "needs at least one address");
            return None;
        }
        let mut listeners = Vec::new();
        for (path, address, tls) in entries {
            let address = self.socket_addr(&path, address)?;
            if listeners.iter().any(|l: &Listener| l.address == address) {
                self.error(&path, format!("{address} is listed twice"));
            }
            let tls = tls.map(|t| TlsFiles {
                cert: self.relative(&t.cert),
                key: self.relative(&t.key),
            });
            listeners.push(Listener { address, tls });
        }
        Some(listeners)
    }

    /// Paths in the file are relative to the file, so a config works wherever it is run from.
    pub(crate) fn relative(&self, path: &str) -> PathBuf {
        let path = Path::new(path);
        if path.is_absolute() {
            return path.to_path_buf();
        }
        match self.file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.join(path),
            _ => path.to_path_buf(),
        }
    }

    fn upstream(&mut self, raw: &raw::RawUpstream) -> Option<Upstream> {
        let connect_timeout = self.duration(
            "upstream.connect_timeout",
            raw.connect_timeout.as_deref(),
            DEFAULT_CONNECT_TIMEOUT,
        );
        let timeout = self.duration(
            "upstream.timeout",
            raw.timeout.as_deref(),
            DEFAULT_UPSTREAM_TIMEOUT,
        );
        let pool_idle_timeout = self.duration(
            "upstream.pool_idle_timeout",
            raw.pool_idle_timeout.as_deref(),
            DEFAULT_POOL_IDLE_TIMEOUT,
        );
        let host = match raw.host.as_deref() {
            None | Some("preserve") => HostMode::Preserve,
            Some("upstream") => HostMode::Upstream,
            Some(other) => {
                self.error(
                    "upstream.host",
                    format!("`{other}` is not allowed: use `preserve` (send the client's Host) or `upstream` (send the upstream's)"),
                );
                HostMode::Preserve
            }
        };
        let uri: http::Uri = match raw.url.trim().parse() {
            Ok(uri) => uri,
            Err(e) => {
                self.error(
                    "upstream.url",
                    format!(
                        "`{}` is not a URL ({e}): write http://HOST:PORT or https://HOST:PORT",
                        raw.url
                    ),
                );
                return None;
            }
        };
        let scheme = match uri.scheme() {
            Some(s) if *s == Scheme::HTTP || *s == Scheme::HTTPS => s.clone(),
            _ => {
                self.error(
                    "upstream.url",
                    format!("`{}` must start with http:// or https://", raw.url),
                );
                return None;
            }
        };
        let Some(authority) = uri.authority().cloned() else {
            self.error("upstream.url", format!("`{}` has no host", raw.url));
            return None;
        };
        if authority.as_str().contains('@') {
            self.error(
                "upstream.url",
                "user information in the upstream URL is not supported",
            );
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            self.error(
                "upstream.url",
                "must not have a path or query: requests keep their own path (write just scheme://host:port)",
            );
        }
        let ca_certs = match raw.ca_file.as_deref() {
            None => None,
            Some(_) if scheme != Scheme::HTTPS => {
                self.error(
                    "upstream.ca_file",
                    "only an https:// upstream is verified: remove ca_file or write the url with https://",
                );
                None
            }
            Some(path) => {
                let file = self.relative(path);
                match crate::tls::ca_certificates(&file) {
                    Ok(certs) => Some(certs),
                    Err(message) => {
                        self.error("upstream.ca_file", message);
                        None
                    }
                }
            }
        };
        Some(Upstream {
            scheme,
            authority,
            connect_timeout,
            timeout,
            host,
            http2: raw.http2.unwrap_or(false),
            pool_idle_timeout,
            ca_certs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(text: &str) -> Config {
        parse(Path::new("t.yaml"), text, |_| None).unwrap_or_else(|e| panic!("{e}"))
    }

    fn parse_err(text: &str) -> Vec<String> {
        parse(Path::new("t.yaml"), text, |_| None)
            .expect_err("config should be refused")
            .0
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse_ok("listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n");
        assert_eq!(c.listeners.len(), 1);
        assert!(c.listeners[0].tls.is_none());
        assert_eq!(c.upstream.timeout, DEFAULT_UPSTREAM_TIMEOUT);
        assert_eq!(c.upstream.host, HostMode::Preserve);
        assert_eq!(c.upstream.authority.as_str(), "127.0.0.1:3000");
        assert_eq!(c.max_request_body, None);
        assert_eq!(c.shutdown_timeout, DEFAULT_SHUTDOWN_TIMEOUT);
        assert_eq!(c.idle_timeout, DEFAULT_IDLE_TIMEOUT);
    }

    #[test]
    fn idle_timeout_is_a_positive_duration() {
        let base = "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n";
        let c = parse_ok(&format!("{base}idle_timeout: 90s\n"));
        assert_eq!(c.idle_timeout, Duration::from_secs(90));
        let errors = parse_err(&format!("{base}idle_timeout: 0s\n"));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("t.yaml:3:15: idle_timeout: must be greater than zero"),
            "{}",
            errors[0]
        );
        let errors = parse_err(&format!("{base}idle_timeout: forever\n"));
        assert!(errors[0].contains("is not a duration"), "{}", errors[0]);
    }

    #[test]
    fn full_core_config_parses() {
        let c = parse_ok(
            "listen:\n  - 127.0.0.1:8080\n  - address: \"[::1]:8443\"\n    tls: { cert: certs/c.pem, key: /k.pem }\n\
             admin: 127.0.0.1:9901\nupstream:\n  url: https://app.internal:8443\n  connect_timeout: 250ms\n  timeout: 1m\n  host: upstream\n  http2: true\n\
             max_request_body: 10MiB\nheader_read_timeout: 5s\nshutdown_timeout: 2s\n",
        );
        assert_eq!(c.listeners.len(), 2);
        let tls = c.listeners[1].tls.as_ref().unwrap();
        assert_eq!(tls.cert, Path::new("certs/c.pem"));
        assert_eq!(tls.key, Path::new("/k.pem"));
        assert_eq!(c.upstream.connect_timeout, Duration::from_millis(250));
        assert_eq!(c.upstream.timeout, Duration::from_secs(60));
        assert_eq!(c.upstream.host, HostMode::Upstream);
        assert!(c.upstream.http2);
        assert_eq!(c.max_request_body, Some(10 * 1024 * 1024));
        assert_eq!(c.header_read_timeout, Duration::from_secs(5));
    }

    #[test]
    fn unknown_keys_are_refused_with_position_and_allowed_keys() {
        let errors =
            parse_err("listen: 127.0.0.1:8080\nupstream:\n  url: http://a:1\n  timout: 3s\n");
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("t.yaml:4:3: "), "{}", errors[0]);
        assert!(
            errors[0].contains("unknown field `timout`"),
            "{}",
            errors[0]
        );
        assert!(errors[0].contains("`timeout`"), "{}", errors[0]);
    }

    #[test]
    fn validation_errors_point_at_the_value() {
        let errors = parse_err(
            "listen: 127.0.0.1:8080\nupstream:\n  url: ftp://a:1\n  timeout: soon\nmax_request_body: lots\n",
        );
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0].starts_with("t.yaml:3:8: upstream.url:"),
            "{}",
            errors[0]
        );
        assert!(
            errors[1].starts_with("t.yaml:4:12: upstream.timeout:"),
            "{}",
            errors[1]
        );
        assert!(errors[1].contains("like 50ms"), "{}", errors[1]);
        assert!(
            errors[2].starts_with("t.yaml:5:19: max_request_body:"),
            "{}",
            errors[2]
        );
    }

    #[test]
    fn workers_default_to_one_per_core_and_are_bounded() {
        let base = "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n";
        assert_eq!(parse_ok(base).workers, crate::workers::default_count());
        assert_eq!(parse_ok(&format!("{base}workers: 3\n")).workers, 3);
        for bad in ["0", "257"] {
            let errors = parse_err(&format!("{base}workers: {bad}\n"));
            assert_eq!(
                errors,
                vec![
                    "t.yaml:3:10: workers: must be from 1 to 256 (leave it out for one per core)"
                        .to_string()
                ]
            );
        }
    }

    #[test]
    fn bad_addresses_and_host_modes_are_explained() {
        let errors = parse_err(
            "listen: localhost\nupstream: { url: \"http://a:1/base\", host: client }\nadmin: nope\n",
        );
        let all = errors.join("\n");
        assert!(
            all.contains("t.yaml:1:9: listen: `localhost` is not an address"),
            "{all}"
        );
        assert!(all.contains("must not have a path"), "{all}");
        assert!(all.contains("use `preserve`"), "{all}");
        assert!(all.contains("t.yaml:3:8: admin:"), "{all}");
    }

    #[test]
    fn admin_takes_an_address_or_a_map_with_a_token_from_the_environment() {
        let plain = parse_ok(
            "listen: 127.0.0.1:0\nupstream: { url: \"http://a:1\" }\nadmin: 127.0.0.1:9901\n",
        );
        assert_eq!(plain.admin.unwrap().to_string(), "127.0.0.1:9901");
        assert!(plain.admin_token.is_none());
        let text = "listen: 127.0.0.1:0\nupstream: { url: \"http://a:1\" }\nadmin:\n  address: 0.0.0.0:9901\n  token_env: ADMIN_TOKEN\n";
        let full = parse(Path::new("t.yaml"), text, |name| {
            (name == "ADMIN_TOKEN").then(|| "s3cret".to_string())
        })
        .unwrap();
        assert_eq!(full.admin.unwrap().to_string(), "0.0.0.0:9901");
        assert_eq!(full.admin_token, Some(Secret("s3cret".into())));
        assert!(
            full.summary().contains("need the bearer token"),
            "{}",
            full.summary()
        );
        for env in [None, Some(String::new())] {
            let errors = parse(Path::new("t.yaml"), text, |_| env.clone())
                .expect_err("a missing token is refused")
                .0
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n");
            assert!(
                errors.contains("t.yaml:5:")
                    && errors.contains("admin.token_env: environment variable `ADMIN_TOKEN`"),
                "{errors}"
            );
        }
    }

    #[test]
    fn environment_is_substituted_before_parsing() {
        let c = parse(
            Path::new("t.yaml"),
            "listen: ${ADDR:-127.0.0.1:8081}\nupstream: { url: \"http://${APP}\" }\n",
            |name| (name == "APP").then(|| "10.1.2.3:3000".to_string()),
        )
        .unwrap();
        assert_eq!(c.listeners[0].address.to_string(), "127.0.0.1:8081");
        assert_eq!(c.upstream.authority.as_str(), "10.1.2.3:3000");
        let err = parse(
            Path::new("t.yaml"),
            "listen: a\nupstream: { url: \"${APP}\" }\n",
            |_| None,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "t.yaml:2:19: environment variable `APP` is not set: set it, or give a default with `${APP:-value}`");
    }

    #[test]
    fn yaml_syntax_errors_carry_position() {
        let errors = parse_err("listen: [127.0.0.1:8080\nupstream: {url: x}\n");
        assert!(errors[0].starts_with("t.yaml:"), "{}", errors[0]);
        assert!(!errors[0].contains(" at line "), "{}", errors[0]);
    }
}

//! The validated configuration as a whole (`Config`) and the proxy's own fields: listeners,
//! the upstream, timeouts, connection and body bounds, serving threads.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::uri::{Authority, Scheme};

use super::protect::Protect;
use super::throttle::{Secret, Throttle};
use super::tracing::Traces;
use super::usage::Usage;

pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// The admin listener's connection cap: probes, a scraper and a few consoles need far fewer.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 128;
/// More serving threads than this only costs memory: each holds its own connection pools.
pub const MAX_WORKERS: usize = crate::workers::MAX_THREADS;
pub const DEFAULT_H2_STREAMS: u32 = 100;

/// The validated configuration the proxy runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub file: PathBuf,
    pub listeners: Vec<Listener>,
    pub admin: Option<SocketAddr>,
    /// The bearer token the admin listener's mutating endpoints require (`admin.token_env`).
    pub admin_token: Option<Secret>,
    /// Host names the admin listener answers besides IP addresses and `localhost`
    /// (`admin.hosts`); any other `Host` is refused (see `crate::admin`).
    pub admin_hosts: Vec<AdminHost>,
    /// How the admin listener bounds its connections (see [`AdminConnections`]).
    pub admin_connections: AdminConnections,
    pub upstream: Upstream,
    /// Requests with a larger body are answered 413 (`None`: no limit).
    pub max_request_body: Option<u64>,
    pub header_read_timeout: Duration,
    /// A client connection with no request in flight and no bytes moving for this long is
    /// closed (keep-alive idlers, and peers that connect and never speak).
    pub idle_timeout: Duration,
    /// How long a connection closed with part of a request body unread keeps reading (and
    /// discarding) what the client still sends, so that the answer reaches it.
    pub lingering_close: crate::linger::Bounds,
    pub shutdown_timeout: Duration,
    pub max_connections: usize,
    /// Serving threads, each with its own runtime and upstream connection pool (`workers`).
    pub workers: usize,
    pub http2_max_concurrent_streams: u32,
    /// One log line per request (target `tollgate::access`).
    pub access_log: bool,
    pub throttle: Throttle,
    /// Where a caller reads its own usage (`usage`); None: off, that path is proxied like any.
    pub usage: Option<Usage>,
    /// The app's protection under overload (`protect`); None: off, and no cost.
    pub protect: Option<Protect>,
    /// OTLP trace export (`tracing`, or the `OTEL_*` environment); None: off, and no span is
    /// built.
    pub traces: Option<Traces>,
}

/// The admin listener's connection bounds, as the proxy listener's fields of the same names
/// bound its connections: a request head must be whole within `header_read_timeout` of the
/// connection's start or of the previous answer (a silent or trickling peer is closed), a
/// connection with nothing in flight and no byte moving for `idle_timeout` is closed, and at
/// most `max_connections` are open at once (more wait in the kernel's backlog). The admin
/// listener's own cap keeps a flood of it from taking the descriptors the proxy listener
/// serves with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminConnections {
    /// `admin.header_read_timeout`; the top-level `header_read_timeout` when left out.
    pub header_read_timeout: Duration,
    /// `admin.idle_timeout`; the top-level `idle_timeout` when left out.
    pub idle_timeout: Duration,
    /// `admin.max_connections`; [`DEFAULT_ADMIN_MAX_CONNECTIONS`] when left out.
    pub max_connections: usize,
}

/// One entry of `admin.hosts`: a host name (lower-case, without a trailing dot; `*.` first
/// for any name under a domain) and, when given, the one port it is answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminHost {
    pub name: String,
    pub port: Option<u16>,
}

impl AdminHost {
    /// Whether `name` (lower-case, without a trailing dot) and `port` (as the `Host` header
    /// gave it) are this entry.
    pub fn matches(&self, name: &str, port: Option<u16>) -> bool {
        if self.port.is_some() && self.port != port {
            return false;
        }
        match self.name.strip_prefix("*.") {
            Some(domain) => name
                .strip_suffix(domain)
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            None => name == self.name,
        }
    }
}

impl fmt::Display for AdminHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.name),
            None => f.write_str(&self.name),
        }
    }
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

impl HostMode {
    /// As the file spells it (`upstream.host:`).
    pub fn as_str(self) -> &'static str {
        match self {
            HostMode::Preserve => "preserve",
            HostMode::Upstream => "upstream",
        }
    }
}

impl fmt::Display for HostMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

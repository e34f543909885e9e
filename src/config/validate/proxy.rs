//! Validation of the proxy's own fields: listeners, the admin listener and its token, the
//! upstream (URL, Host mode, timeouts, private CA), body and connection bounds, serving threads.

use std::net::SocketAddr;

use http::uri::Scheme;

use super::validator::Validator;
use crate::config::model::{
    AdminConnections, AdminHost, Config, HostMode, Listener, Secret, Throttle, TlsFiles, Upstream,
    DEFAULT_ADMIN_MAX_CONNECTIONS, DEFAULT_CONNECT_TIMEOUT, DEFAULT_H2_STREAMS,
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_POOL_IDLE_TIMEOUT, DEFAULT_SHUTDOWN_TIMEOUT, DEFAULT_UPSTREAM_TIMEOUT, MAX_WORKERS,
};
use crate::config::raw::{
    RawAdmin, RawConfig, RawLingeringClose, RawListen, RawListener, RawSize, RawTls, RawUpstream,
};
use crate::linger;

/// The whole configuration: the proxy's fields around the already validated `throttle`.
/// `None` when a field the proxy cannot run without is unusable (its problem is reported).
pub(super) fn config(v: &mut Validator, raw: &RawConfig, throttle: Throttle) -> Option<Config> {
    let listeners = listeners(v, &raw.listen);
    let (admin, admin_token) = admin(v, raw.admin.as_ref());
    let admin_hosts = match &raw.admin {
        Some(RawAdmin::Full(full)) => admin_hosts(v, &full.hosts),
        _ => Vec::new(),
    };
    let upstream = upstream(v, &raw.upstream);
    let max_request_body = raw
        .max_request_body
        .as_ref()
        .and_then(|s| size(v, "max_request_body", s));
    let header_read_timeout = v.duration(
        "header_read_timeout",
        raw.header_read_timeout.as_deref(),
        DEFAULT_HEADER_READ_TIMEOUT,
    );
    let idle_timeout = v.duration(
        "idle_timeout",
        raw.idle_timeout.as_deref(),
        DEFAULT_IDLE_TIMEOUT,
    );
    let lingering_close = lingering_close(v, raw.lingering_close.as_ref());
    let shutdown_timeout = v.duration(
        "shutdown_timeout",
        raw.shutdown_timeout.as_deref(),
        DEFAULT_SHUTDOWN_TIMEOUT,
    );
    let (max_connections, workers, http2_max_concurrent_streams) = counts(v, raw);
    let admin_connections =
        admin_connections(v, raw.admin.as_ref(), header_read_timeout, idle_timeout);
    if let (Some(admin), Some(listeners)) = (admin, listeners.as_ref()) {
        if admin.port() != 0 && listeners.iter().any(|l| l.address == admin) {
            v.error(
                "admin",
                "the admin listener cannot share an address with `listen`",
            );
        }
    }
    Some(Config {
        file: v.file().to_path_buf(),
        listeners: listeners?,
        admin,
        admin_token,
        admin_hosts,
        admin_connections,
        upstream: upstream?,
        max_request_body,
        header_read_timeout,
        idle_timeout,
        lingering_close,
        shutdown_timeout,
        max_connections,
        workers,
        http2_max_concurrent_streams,
        access_log: raw.access_log.unwrap_or(true),
        throttle,
        usage: super::usage::usage(v, raw.usage.as_ref()),
        protect: None,
        traces: None,
    })
}

/// `max_connections`, `workers` and `http2_max_concurrent_streams`, with their defaults.
fn counts(v: &mut Validator, raw: &RawConfig) -> (usize, usize, u32) {
    let max_connections = match raw.max_connections {
        Some(0) => {
            v.error("max_connections", "must be at least 1");
            0
        }
        Some(n) => n as usize,
        None => DEFAULT_MAX_CONNECTIONS,
    };
    let workers = match raw.workers {
        Some(n) if !(1..=MAX_WORKERS as u64).contains(&n) => {
            v.error(
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
            v.error("http2_max_concurrent_streams", "must be at least 1");
            0
        }
        Some(n) => n,
        None => DEFAULT_H2_STREAMS,
    };
    (max_connections, workers, http2_max_concurrent_streams)
}

fn size(v: &mut Validator, path: &str, value: &RawSize) -> Option<u64> {
    match value {
        RawSize::Bytes(0) => None,
        RawSize::Bytes(n) => Some(*n),
        RawSize::Text(text) => match text.trim().parse::<bytesize::ByteSize>() {
            Ok(size) if size.as_u64() > 0 => Some(size.as_u64()),
            Ok(_) => {
                v.error(
                    path,
                    "must be greater than zero (leave it out for no limit)",
                );
                None
            }
            Err(e) => {
                v.error(path, format!("`{text}` is not a size ({e}): write e.g. 10MiB, 512KiB, 1GB or a number of bytes"));
                None
            }
        },
    }
}

/// `lingering_close`: `time` may be zero (no lingering), `timeout` and `max_bytes` may not.
fn lingering_close(v: &mut Validator, raw: Option<&RawLingeringClose>) -> linger::Bounds {
    let defaults = linger::Bounds::default();
    let Some(raw) = raw else { return defaults };
    let time = v.duration_or_zero("lingering_close.time", raw.time.as_deref(), defaults.time);
    let timeout = v.duration(
        "lingering_close.timeout",
        raw.timeout.as_deref(),
        defaults.timeout,
    );
    let max_bytes = match &raw.max_bytes {
        None => defaults.max_bytes,
        Some(RawSize::Bytes(0)) => {
            v.error("lingering_close.max_bytes", "must be greater than zero");
            defaults.max_bytes
        }
        Some(size_text) => {
            size(v, "lingering_close.max_bytes", size_text).unwrap_or(defaults.max_bytes)
        }
    };
    linger::Bounds {
        time,
        timeout,
        max_bytes,
    }
}

fn socket_addr(v: &mut Validator, path: &str, text: &str) -> Option<SocketAddr> {
    match text.trim().parse::<SocketAddr>() {
        Ok(addr) => Some(addr),
        Err(_) => {
            v.error(
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
fn admin(v: &mut Validator, raw: Option<&RawAdmin>) -> (Option<SocketAddr>, Option<Secret>) {
    match raw {
        None => (None, None),
        Some(RawAdmin::Address(a)) => (socket_addr(v, "admin", a), None),
        Some(RawAdmin::Full(full)) => {
            let address = socket_addr(v, "admin.address", &full.address);
            let token = full.token_env.as_ref().and_then(|var| {
                match v.env(var).filter(|t| !t.trim().is_empty()) {
                    Some(token) => Some(Secret(token.trim().to_owned())),
                    None => {
                        v.error(
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

/// `admin.header_read_timeout`, `admin.idle_timeout` and `admin.max_connections`: the proxy
/// listener's timeouts unless given, and a cap of the admin listener's own.
fn admin_connections(
    v: &mut Validator,
    raw: Option<&RawAdmin>,
    header_read_timeout: std::time::Duration,
    idle_timeout: std::time::Duration,
) -> AdminConnections {
    let Some(RawAdmin::Full(full)) = raw else {
        return AdminConnections {
            header_read_timeout,
            idle_timeout,
            max_connections: DEFAULT_ADMIN_MAX_CONNECTIONS,
        };
    };
    let max_connections = match full.max_connections {
        Some(0) => {
            v.error("admin.max_connections", "must be at least 1");
            DEFAULT_ADMIN_MAX_CONNECTIONS
        }
        Some(n) => n as usize,
        None => DEFAULT_ADMIN_MAX_CONNECTIONS,
    };
    AdminConnections {
        header_read_timeout: v.duration(
            "admin.header_read_timeout",
            full.header_read_timeout.as_deref(),
            header_read_timeout,
        ),
        idle_timeout: v.duration(
            "admin.idle_timeout",
            full.idle_timeout.as_deref(),
            idle_timeout,
        ),
        max_connections,
    }
}

/// `admin.hosts`: host names (`tollgate-admin.internal`, `*.monitoring.svc`), each with an
/// optional `:PORT`; lower-cased, a trailing dot dropped. Addresses and `localhost` need no
/// entry: they are always answered.
fn admin_hosts(v: &mut Validator, raw: &[String]) -> Vec<AdminHost> {
    let mut hosts = Vec::with_capacity(raw.len());
    for (i, text) in raw.iter().enumerate() {
        match admin_host(text) {
            Ok(host) => {
                if !hosts.contains(&host) {
                    hosts.push(host);
                }
            }
            Err(why) => v.error(
                &format!("admin.hosts[{i}]"),
                format!("`{text}` {why}: write a host name such as `tollgate-admin.internal`, `*.monitoring.svc` (any name under it) or `name:9901` (that port only)"),
            ),
        }
    }
    hosts
}

/// One `admin.hosts` entry, or why it is not one.
fn admin_host(text: &str) -> Result<AdminHost, &'static str> {
    let text = text.trim().to_ascii_lowercase();
    let (name, port) = match text.rsplit_once(':') {
        Some((name, digits)) => match digits.parse::<u16>() {
            Ok(port) if port > 0 && digits.bytes().all(|b| b.is_ascii_digit()) => {
                (name, Some(port))
            }
            _ => return Err("has a port that is not a number from 1 to 65535"),
        },
        None => (text.as_str(), None),
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    let labels = name.strip_prefix("*.").unwrap_or(name);
    if labels.is_empty() {
        return Err("names no host");
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.len() > 253 || !labels.split('.').all(label_ok) {
        return Err("is not a host name");
    }
    Ok(AdminHost {
        name: name.to_owned(),
        port,
    })
}

fn listeners(v: &mut Validator, raw: &RawListen) -> Option<Vec<Listener>> {
    let entries: Vec<(String, &str, Option<&RawTls>)> = match raw {
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
        v.error("listen", "needs at least one address");
        return None;
    }
    let mut listeners = Vec::new();
    for (path, address, tls) in entries {
        let address = socket_addr(v, &path, address)?;
        if listeners.iter().any(|l: &Listener| l.address == address) {
            v.error(&path, format!("{address} is listed twice"));
        }
        let tls = tls.map(|t| TlsFiles {
            cert: v.relative(&t.cert),
            key: v.relative(&t.key),
        });
        listeners.push(Listener { address, tls });
    }
    Some(listeners)
}

fn upstream(v: &mut Validator, raw: &RawUpstream) -> Option<Upstream> {
    let connect_timeout = v.duration(
        "upstream.connect_timeout",
        raw.connect_timeout.as_deref(),
        DEFAULT_CONNECT_TIMEOUT,
    );
    let timeout = v.duration(
        "upstream.timeout",
        raw.timeout.as_deref(),
        DEFAULT_UPSTREAM_TIMEOUT,
    );
    let pool_idle_timeout = v.duration(
        "upstream.pool_idle_timeout",
        raw.pool_idle_timeout.as_deref(),
        DEFAULT_POOL_IDLE_TIMEOUT,
    );
    let host = match raw.host.as_deref() {
        None | Some("preserve") => HostMode::Preserve,
        Some("upstream") => HostMode::Upstream,
        Some(other) => {
            v.error(
                "upstream.host",
                format!("`{other}` is not allowed: use `preserve` (send the client's Host) or `upstream` (send the upstream's)"),
            );
            HostMode::Preserve
        }
    };
    let (scheme, authority) = upstream_url(v, &raw.url)?;
    let ca_certs = ca_file(v, raw.ca_file.as_deref(), &scheme);
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

/// `upstream.url`: scheme and authority only (requests keep their own path).
fn upstream_url(v: &mut Validator, url: &str) -> Option<(Scheme, http::uri::Authority)> {
    let uri: http::Uri = match url.trim().parse() {
        Ok(uri) => uri,
        Err(e) => {
            v.error(
                "upstream.url",
                format!("`{url}` is not a URL ({e}): write http://HOST:PORT or https://HOST:PORT"),
            );
            return None;
        }
    };
    let scheme = match uri.scheme() {
        Some(s) if *s == Scheme::HTTP || *s == Scheme::HTTPS => s.clone(),
        _ => {
            v.error(
                "upstream.url",
                format!("`{url}` must start with http:// or https://"),
            );
            return None;
        }
    };
    let Some(authority) = uri.authority().cloned() else {
        v.error("upstream.url", format!("`{url}` has no host"));
        return None;
    };
    if authority.as_str().contains('@') {
        v.error(
            "upstream.url",
            "user information in the upstream URL is not supported",
        );
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        v.error(
            "upstream.url",
            "must not have a path or query: requests keep their own path (write just scheme://host:port)",
        );
    }
    Some((scheme, authority))
}

/// `upstream.ca_file`: read now, so a missing or empty file is refused with the config.
fn ca_file(
    v: &mut Validator,
    path: Option<&str>,
    scheme: &Scheme,
) -> Option<Vec<rustls_pki_types::CertificateDer<'static>>> {
    match path {
        None => None,
        Some(_) if *scheme != Scheme::HTTPS => {
            v.error(
                "upstream.ca_file",
                "only an https:// upstream is verified: remove ca_file or write the url with https://",
            );
            None
        }
        Some(path) => {
            let file = v.relative(path);
            match crate::tls::ca_certificates(&file) {
                Ok(certs) => Some(certs),
                Err(message) => {
                    v.error("upstream.ca_file", message);
                    None
                }
            }
        }
    }
}

//! `tracing`: the export of each request's spans over OTLP (see `crate::traces`), with what
//! the `OTEL_*` environment variables said folded in where the file said nothing.

use std::time::Duration;

use super::throttle::Secret;

pub const DEFAULT_TRACES_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_TRACES_QUEUE: usize = 2048;
pub const DEFAULT_TRACES_BATCH: usize = 512;
pub const DEFAULT_TRACES_INTERVAL: Duration = Duration::from_secs(5);
pub const DEFAULT_SERVICE_NAME: &str = "tollgate";
pub const DEFAULT_MAX_SPANS_PER_SECOND: u32 = 1000;

/// The validated `tracing:` section, merged with the `OTEL_*` environment variables. None in
/// `Config` when neither turned export on: then nothing about traces runs at all.
#[derive(Debug, Clone, PartialEq)]
pub struct Traces {
    /// The full URL spans are sent to: for HTTP, with its `/v1/traces` path.
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    /// Sent with every export (a vendor's API key): the file's, then the environment's for
    /// names the file does not give.
    pub headers: Vec<(String, Secret)>,
    pub service_name: String,
    /// Resource attributes besides `service.name`, in order (the file's over the
    /// environment's).
    pub resource: Vec<(String, String)>,
    pub sampling: Sampling,
    /// One export's bound: a collector that does not answer within it loses that batch.
    pub timeout: Duration,
    /// Spans waiting for export; more are dropped (and counted) rather than wait.
    pub queue_size: usize,
    /// Spans per export.
    pub batch_size: usize,
    /// The longest a span waits before its batch is sent.
    pub interval: Duration,
    /// The forms of a caller's trace context that are read.
    pub propagators: Propagators,
    /// Whose trace context (its trace id, its sampled flag) is followed.
    pub caller_context: CallerContext,
    /// The most spans handed to the export per second (a bucket of one second's worth);
    /// more are dropped and counted, so that callers cannot run up the tracing bill.
    pub max_spans_per_second: u32,
}

/// Whose trace context tollgate follows (`tracing.caller_context`). A context it does not
/// follow is not read at all: the request starts a trace of its own, sampled by
/// `sample_ratio` on tollgate's own random trace id, so no caller chooses to be sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerContext {
    /// Only a peer in `client_ip.trusted_proxies` (the default; with no trusted proxies, no
    /// caller's context is followed).
    TrustedProxies,
    /// Any caller (tollgate behind an edge of your own that is not listed as a trusted proxy).
    Any,
}

impl CallerContext {
    pub fn as_str(self) -> &'static str {
        match self {
            CallerContext::TrustedProxies => "trusted_proxies",
            CallerContext::Any => "any",
        }
    }
}

/// The forms of a caller's trace context tollgate reads (`tracing.propagators`,
/// `OTEL_PROPAGATORS`): W3C `traceparent`/`tracestate` first, then B3 (`b3`, `X-B3-*`).
/// `traceparent` is always sent upstream; B3 too, in the caller's form, when it came as B3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Propagators {
    pub tracecontext: bool,
    pub b3: bool,
}

impl Default for Propagators {
    fn default() -> Self {
        Propagators {
            tracecontext: true,
            b3: true,
        }
    }
}

/// How the spans are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    HttpProtobuf,
}

impl OtlpProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            OtlpProtocol::Grpc => "grpc",
            OtlpProtocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// Which requests are traced: a request whose caller sent a `traceparent` follows the
/// caller's sampled flag when `parent_based`; any other is sampled with probability `ratio`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    pub parent_based: bool,
    pub ratio: f64,
}

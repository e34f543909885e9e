//! OpenTelemetry traces: each request a server span in its caller's trace, exported over OTLP
//! (gRPC or HTTP/protobuf) by the `opentelemetry` crates (`tracing` section, `OTEL_*`
//! environment; see `config::Traces`).
//!
//! The export never slows or fails a request: finished spans go into a bounded queue
//! ([`Bounded`], in front of the SDK's batch span processor) and a full queue drops the span
//! and counts it; so does a span past `max_spans_per_second` ([`SpanRate`]), which bounds
//! what any traffic, however it is sampled, can cost to export; the batches are sent by a thread of its own (`tollgate-traces`, with its own
//! Tokio runtime, so the export's connections never share the serving threads); a failed
//! export is counted and logged at most once a minute. With tracing off nothing here exists,
//! and the request path builds no span (the record holds `None`).
//!
//! `span.rs` is the per-request part: the server span, the decision's span or event, the
//! upstream's client span and the `traceparent` (and B3, `b3.rs`) it carries. `round_trip.rs` times the Redis
//! decision's call alone, for its span.

mod b3;
pub mod round_trip;
mod span;

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::Counter;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
    SpanProcessor,
};
use opentelemetry_sdk::Resource;

use crate::config::{CallerContext, OtlpProtocol, Traces};
use crate::identity::TrustedProxies;
pub use span::{BodyEnd, DecisionSpan, RequestSpan, StoreKind};

/// A failed export is logged at most this often (with how many failed since the last line).
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The counters the export keeps current (registered by `metrics`).
#[derive(Clone)]
pub struct TraceMetrics {
    /// `tollgate_trace_spans_exported_total`: spans the collector accepted.
    pub exported: Counter,
    /// `tollgate_trace_spans_dropped_total{reason="queue_full"}`: spans dropped because the
    /// queue was full (the collector is slower than the traffic, or down).
    pub dropped_queue_full: Counter,
    /// `tollgate_trace_spans_dropped_total{reason="export_failed"}`: spans in a batch the
    /// collector refused or did not answer in time.
    pub dropped_export_failed: Counter,
    /// `tollgate_trace_spans_dropped_total{reason="rate_limited"}`: spans past
    /// `tracing.max_spans_per_second`.
    pub dropped_rate_limited: Counter,
}

/// What the queue bound and the exporter share: the spans taken in and not yet handed to an
/// export, and the failed exports not yet logged.
struct Shared {
    queued: AtomicUsize,
    metrics: TraceMetrics,
    failures: AtomicU64,
    last_logged: Mutex<Option<Instant>>,
    endpoint: String,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// The export of one process: the tracer the request path starts spans with, and the
/// provider that flushes them at shutdown. Built once at start (a change of the `tracing`
/// section takes effect after a restart).
pub struct Tracing {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    extraction: span::Extraction,
    /// Dropped last: stops the export thread's runtime (after the provider's shutdown).
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Tracing {
    /// Starts the export thread and the provider; an Err says why (a URL the exporter cannot
    /// use, a thread that cannot start).
    /// `trusted` are the peers whose trace context is followed under `caller_context:
    /// trusted_proxies` (`client_ip.trusted_proxies`).
    pub fn start(
        config: &Traces,
        metrics: TraceMetrics,
        trusted: &TrustedProxies,
    ) -> Result<Tracing, String> {
        let shared = Arc::new(Shared {
            queued: AtomicUsize::new(0),
            metrics,
            failures: AtomicU64::new(0),
            last_logged: Mutex::new(None),
            endpoint: config.endpoint.clone(),
        });
        let (built_tx, built_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let owned = config.clone();
        let exporting = shared.clone();
        std::thread::Builder::new()
            .name("tollgate-traces".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = built_tx.send(Err(format!("cannot start its runtime: {e}")));
                        return;
                    }
                };
                runtime.block_on(async move {
                    // Built here: the exporter's connections and the batch task live on this
                    // thread's runtime.
                    let built = exporter(&owned).map(|exporter| {
                        let counted = Counted {
                            inner: exporter,
                            shared: exporting.clone(),
                        };
                        // The SDK's channel is a little larger than the bound kept in front of
                        // it (flush messages share it), so that it never drops on its own.
                        let batch = BatchConfigBuilder::default()
                            .with_max_queue_size(owned.queue_size + 16)
                            .with_max_export_batch_size(owned.batch_size)
                            .with_scheduled_delay(owned.interval)
                            .with_max_export_timeout(owned.timeout)
                            .build();
                        BatchSpanProcessor::builder(counted, opentelemetry_sdk::runtime::Tokio)
                            .with_batch_config(batch)
                            .build()
                    });
                    let _ = built_tx.send(built);
                    // Serves the exports until the `Tracing` is dropped.
                    let _ = stop_rx.await;
                });
            })
            .map_err(|e| format!("cannot start its thread: {e}"))?;
        let processor = built_rx
            .recv()
            .map_err(|_| "its thread ended before it started".to_owned())??;
        let bounded = Bounded {
            inner: processor,
            shared,
            limit: config.queue_size,
            rate: SpanRate::new(config.max_spans_per_second),
        };
        let sampler = match config.sampling.parent_based {
            true => {
                Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sampling.ratio)))
            }
            false => Sampler::TraceIdRatioBased(config.sampling.ratio),
        };
        let resource = Resource::builder_empty()
            .with_service_name(config.service_name.clone())
            .with_attributes(
                config
                    .resource
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(bounded)
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("tollgate");
        Ok(Tracing {
            tracer,
            provider,
            extraction: span::Extraction {
                propagators: config.propagators,
                ratio: config.sampling.ratio,
                trusted: match config.caller_context {
                    CallerContext::TrustedProxies => Some(trusted.clone()),
                    CallerContext::Any => None,
                },
            },
            _stop: stop_tx,
        })
    }

    /// Sends what is queued and stops, within `timeout`: the spans still queued then are lost.
    /// Blocks; call it off the runtime's threads (`spawn_blocking`).
    pub fn shutdown(&self, timeout: Duration) {
        if let Err(e) = self.provider.shutdown_with_timeout(timeout) {
            tracing::warn!(error = %e, "traces: not every span was sent before shutdown");
        }
    }

    /// The server span of a request with these `headers`, in the trace their `traceparent`
    /// (or B3 headers) name (a new one without them).
    pub fn request(
        &self,
        method: &http::Method,
        path: &str,
        version: http::Version,
        headers: &http::HeaderMap,
        peer: std::net::SocketAddr,
    ) -> Box<RequestSpan> {
        RequestSpan::start(
            &self.tracer,
            method,
            path,
            version,
            headers,
            peer,
            &self.extraction,
        )
    }
}

/// The exporter `config` asks for. The file's headers are sent over the environment's (the
/// exporter adds `OTEL_EXPORTER_OTLP_HEADERS` itself, after the ones given here, so they are
/// set again last).
fn exporter(config: &Traces) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let built = match config.protocol {
        OtlpProtocol::Grpc => {
            let mut metadata = tonic::metadata::MetadataMap::new();
            for (name, value) in &config.headers {
                if let (Ok(name), Ok(value)) = (
                    tonic::metadata::MetadataKey::from_bytes(name.as_bytes()),
                    value.0.parse(),
                ) {
                    metadata.insert(name, value);
                }
            }
            let last = metadata.clone();
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(config.endpoint.clone())
                .with_timeout(config.timeout)
                .with_interceptor(move |mut request: tonic::Request<()>| {
                    for entry in last.iter() {
                        if let tonic::metadata::KeyAndValueRef::Ascii(name, value) = entry {
                            request.metadata_mut().insert(name.clone(), value.clone());
                        }
                    }
                    Ok(request)
                })
                .build()
        }
        OtlpProtocol::HttpProtobuf => {
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_webpki_roots()
                .https_or_http()
                .enable_http1()
                .build();
            let client = FileHeaders {
                inner: opentelemetry_http::hyper::HyperClient::new(https, config.timeout, None),
                headers: config
                    .headers
                    .iter()
                    .filter_map(|(name, value)| {
                        Some((
                            http::HeaderName::from_bytes(name.as_bytes()).ok()?,
                            http::HeaderValue::from_str(&value.0).ok()?,
                        ))
                    })
                    .collect(),
            };
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(config.endpoint.clone())
                .with_timeout(config.timeout)
                .with_http_client(client)
                .build()
        }
    };
    built.map_err(|e| {
        format!(
            "cannot build the OTLP exporter for {}: {e}",
            config.endpoint
        )
    })
}

/// The HTTP client of the HTTP/protobuf exporter, which sets the file's headers last.
#[derive(Debug)]
struct FileHeaders<C> {
    inner: C,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
}

#[async_trait::async_trait]
impl<C: opentelemetry_http::HttpClient> opentelemetry_http::HttpClient for FileHeaders<C> {
    async fn send_bytes(
        &self,
        mut request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        for (name, value) in &self.headers {
            request.headers_mut().insert(name.clone(), value.clone());
        }
        self.inner.send_bytes(request).await
    }
}

/// The exporter, counting what it sent and what it lost, and logging a failing collector at
/// most once per [`LOG_EVERY`].
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    shared: Arc<Shared>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        // Out of the queue from here on: room for new spans while this batch is on its way.
        self.shared.queued.fetch_sub(spans, Ordering::Relaxed);
        let result = self.inner.export(batch).await;
        match &result {
            Ok(()) => {
                self.shared.metrics.exported.increment(spans as u64);
                let failed = self.shared.failures.swap(0, Ordering::Relaxed);
                if failed > 0 {
                    tracing::info!(endpoint = %self.shared.endpoint, failed_exports = failed, "traces: the collector accepts spans again");
                }
            }
            Err(error) => {
                self.shared
                    .metrics
                    .dropped_export_failed
                    .increment(spans as u64);
                let failed = self.shared.failures.fetch_add(1, Ordering::Relaxed) + 1;
                let mut last = self
                    .shared
                    .last_logged
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if last.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
                    *last = Some(Instant::now());
                    tracing::warn!(endpoint = %self.shared.endpoint, failed_exports = failed, %error, "traces: the collector did not take a batch of spans (logged at most once a minute)");
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource)
    }
}

/// The queue's bound, in front of the batch processor: a sampled span that finds `limit`
/// spans waiting, or comes past the span rate, is dropped and counted, never waited for.
#[derive(Debug)]
struct Bounded<P> {
    inner: P,
    shared: Arc<Shared>,
    limit: usize,
    rate: SpanRate,
}

/// `max_spans_per_second` as a token bucket holding at most one second's worth: a burst of
/// that many spans goes out at once, and past it a span goes out as a token comes back.
/// Taken only by sampled spans, so unsampled requests never touch its lock.
#[derive(Debug)]
struct SpanRate {
    per_second: f64,
    /// Tokens left, and when they were counted.
    bucket: Mutex<(f64, Instant)>,
}

impl SpanRate {
    fn new(per_second: u32) -> SpanRate {
        let per_second = f64::from(per_second.max(1));
        SpanRate {
            per_second,
            bucket: Mutex::new((per_second, Instant::now())),
        }
    }

    /// Whether one more span may go out now (and a token is taken for it).
    fn take(&self) -> bool {
        self.take_at(Instant::now())
    }

    fn take_at(&self, now: Instant) -> bool {
        let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, counted) = *bucket;
        let refilled = now.saturating_duration_since(counted).as_secs_f64() * self.per_second;
        let tokens = (tokens + refilled).min(self.per_second);
        let taken = tokens >= 1.0;
        *bucket = (if taken { tokens - 1.0 } else { tokens }, now.max(counted));
        taken
    }
}

impl<P: SpanProcessor> SpanProcessor for Bounded<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx)
    }

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if !self.rate.take() {
            self.shared.metrics.dropped_rate_limited.increment(1);
            return;
        }
        if self.shared.queued.fetch_add(1, Ordering::Relaxed) >= self.limit {
            self.shared.queued.fetch_sub(1, Ordering::Relaxed);
            self.shared.metrics.dropped_queue_full.increment(1);
            return;
        }
        self.inner.on_end(span)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource)
    }
}

/// The node a Redis decision is sent to, as a trace names it (`host:port`, never the URL's
/// credentials): the one server, or the first Cluster seed or Sentinel.
pub fn redis_node(store: &crate::config::StoreConfig) -> Option<Arc<str>> {
    let crate::config::StoreConfig::Redis(redis) = store else {
        return None;
    };
    let url = match &redis.mode {
        crate::config::RedisMode::Standalone(url) => url.as_str(),
        crate::config::RedisMode::Cluster(nodes) => nodes.first()?.as_str(),
        crate::config::RedisMode::Sentinel { nodes, .. } => nodes.first()?.as_str(),
    };
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    Some(Arc::from(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_node_is_named_without_its_credentials() {
        let node = |url: &str| {
            let store = crate::config::StoreConfig::Redis(crate::config::RedisConfig::standalone(
                url,
                Duration::from_secs(1),
            ));
            redis_node(&store).map(|n| n.to_string())
        };
        assert_eq!(
            node("redis://:pw@cache:6380/2").as_deref(),
            Some("cache:6380")
        );
        assert_eq!(
            node("rediss://user:pw@10.0.0.1:6379").as_deref(),
            Some("10.0.0.1:6379")
        );
        assert_eq!(node("redis://cache").as_deref(), Some("cache"));
        assert_eq!(redis_node(&crate::config::StoreConfig::Memory), None);
    }

    #[test]
    fn the_span_rate_lets_a_second_s_worth_through_then_one_per_token() {
        let rate = SpanRate::new(10);
        let start = Instant::now();
        let burst = (0..25).filter(|_| rate.take_at(start)).count();
        assert_eq!(burst, 10);
        // A tenth of a second gives one token back; half a second five.
        assert!(rate.take_at(start + Duration::from_millis(100)));
        assert!(!rate.take_at(start + Duration::from_millis(100)));
        let later = start + Duration::from_millis(600);
        assert_eq!((0..25).filter(|_| rate.take_at(later)).count(), 5);
        // Never more than a second's worth, however long it was idle.
        let much_later = start + Duration::from_secs(3600);
        assert_eq!((0..25).filter(|_| rate.take_at(much_later)).count(), 10);
    }
}

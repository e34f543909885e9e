//! Validation of `tracing` (OTLP trace export), merged with the standard `OTEL_*` environment
//! variables as OpenTelemetry SDKs read them: export is on when the section is present or an
//! OTLP endpoint is set in the environment, and the file wins wherever both say something.
//! A bad value in the environment is refused like one in the file, naming the variable.

use super::validator::Validator;
use crate::config::model::{
    CallerContext, OtlpProtocol, Propagators, Sampling, Secret, Traces,
    DEFAULT_MAX_SPANS_PER_SECOND, DEFAULT_SERVICE_NAME, DEFAULT_TRACES_BATCH,
    DEFAULT_TRACES_INTERVAL, DEFAULT_TRACES_QUEUE, DEFAULT_TRACES_TIMEOUT,
};
use crate::config::raw::RawTracing;

const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
const HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
const TRACES_HEADERS: &str = "OTEL_EXPORTER_OTLP_TRACES_HEADERS";
const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
const RESOURCE: &str = "OTEL_RESOURCE_ATTRIBUTES";
const SAMPLER: &str = "OTEL_TRACES_SAMPLER";
const SAMPLER_ARG: &str = "OTEL_TRACES_SAMPLER_ARG";
const PROPAGATORS: &str = "OTEL_PROPAGATORS";

/// The most spans a queue may hold: beyond this a burst costs memory, not insight.
const MAX_QUEUE: u64 = 1_000_000;

/// The `tracing` section and the environment; None when export is off.
pub(super) fn traces(v: &mut Validator, raw: Option<&RawTracing>) -> Option<Traces> {
    let from_env = env(v, TRACES_ENDPOINT).is_some() || env(v, ENDPOINT).is_some();
    match raw {
        Some(RawTracing {
            enabled: Some(false),
            ..
        }) => return None,
        None if !from_env => return None,
        _ => {}
    }
    let empty = RawTracing {
        enabled: None,
        endpoint: None,
        protocol: None,
        headers: Default::default(),
        service_name: None,
        resource: Default::default(),
        sample_ratio: None,
        timeout: None,
        queue_size: None,
        batch_size: None,
        interval: None,
        propagators: None,
        caller_context: None,
        max_spans_per_second: None,
    };
    let raw = raw.unwrap_or(&empty);
    let protocol = protocol_of(v, raw);
    let endpoint = endpoint_of(v, raw, protocol);
    let headers = headers_of(v, raw);
    let (resource, service_name) = resource_of(v, raw);
    let sampling = sampling_of(v, raw);
    let timeout = v.duration(
        "tracing.timeout",
        raw.timeout.as_deref(),
        DEFAULT_TRACES_TIMEOUT,
    );
    let interval = v.duration(
        "tracing.interval",
        raw.interval.as_deref(),
        DEFAULT_TRACES_INTERVAL,
    );
    let (queue_size, batch_size) = sizes_of(v, raw);
    let propagators = propagators_of(v, raw);
    let caller_context = match raw.caller_context.as_deref().map(str::trim) {
        None | Some("trusted_proxies") => CallerContext::TrustedProxies,
        Some("any") => CallerContext::Any,
        Some(other) => {
            v.error(
                "tracing.caller_context",
                format!("`{other}` is not whose context to follow: write trusted_proxies (the peers in client_ip.trusted_proxies) or any"),
            );
            CallerContext::TrustedProxies
        }
    };
    let max_spans_per_second = match raw.max_spans_per_second {
        None => DEFAULT_MAX_SPANS_PER_SECOND,
        Some(n @ 1..=1_000_000) => n as u32,
        Some(_) => {
            v.error(
                "tracing.max_spans_per_second",
                "must be from 1 to 1000000 (set sample_ratio: 0 or enabled: false for none)",
            );
            DEFAULT_MAX_SPANS_PER_SECOND
        }
    };
    Some(Traces {
        endpoint,
        protocol,
        headers,
        service_name,
        resource,
        sampling,
        timeout,
        queue_size,
        batch_size,
        interval,
        propagators,
        caller_context,
        max_spans_per_second,
    })
}

/// An `OTEL_*` variable; one set to the empty string is unset, as the SDKs read it.
fn env(v: &Validator, name: &str) -> Option<String> {
    v.env(name).filter(|value| !value.trim().is_empty())
}

/// `tracing.protocol`, else `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `_PROTOCOL`.
fn protocol_of(v: &mut Validator, raw: &RawTracing) -> OtlpProtocol {
    match raw.protocol.as_deref() {
        Some(text) => protocol(text).unwrap_or_else(|| {
            v.error("tracing.protocol", format!("`{text}` is not a protocol: use grpc or http/protobuf"));
            OtlpProtocol::HttpProtobuf
        }),
        None => match env(v, TRACES_PROTOCOL).map(|t| (TRACES_PROTOCOL, t)).or_else(|| env(v, PROTOCOL).map(|t| (PROTOCOL, t))) {
            None => OtlpProtocol::HttpProtobuf,
            Some((name, text)) => protocol(&text).unwrap_or_else(|| {
                v.error("tracing", format!("{name}=`{text}` is not a protocol tollgate sends: use grpc or http/protobuf"));
                OtlpProtocol::HttpProtobuf
            }),
        },
    }
}

/// `tracing.endpoint`, else the environment's, else the protocol's local default.
fn endpoint_of(v: &mut Validator, raw: &RawTracing, protocol: OtlpProtocol) -> String {
    match raw.endpoint.as_deref() {
        Some(text) => endpoint(v, "tracing.endpoint", text, protocol, true),
        None => match (env(v, TRACES_ENDPOINT), env(v, ENDPOINT)) {
            // The signal's own variable is the whole URL, as the specification has it.
            (Some(text), _) => endpoint(
                v,
                &format!("tracing ({TRACES_ENDPOINT})"),
                &text,
                protocol,
                false,
            ),
            (None, Some(text)) => {
                endpoint(v, &format!("tracing ({ENDPOINT})"), &text, protocol, true)
            }
            (None, None) => match protocol {
                OtlpProtocol::Grpc => "http://localhost:4317".to_owned(),
                OtlpProtocol::HttpProtobuf => "http://localhost:4318/v1/traces".to_owned(),
            },
        },
    }
}

/// `tracing.headers`, then the environment's headers the file does not name.
fn headers_of(v: &mut Validator, raw: &RawTracing) -> Vec<(String, Secret)> {
    let mut headers: Vec<(String, Secret)> = Vec::new();
    for (name, value) in &raw.headers.0 {
        let path = format!("tracing.headers.{name}");
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            v.error(&path, format!("`{name}` is not a header name"));
        } else if http::HeaderValue::from_str(value).is_err() {
            v.error(&path, "the value has characters a header cannot carry");
        } else {
            headers.push((name.to_ascii_lowercase(), Secret(value.clone())));
        }
    }
    if let Some((var, text)) = env(v, TRACES_HEADERS)
        .map(|t| (TRACES_HEADERS, t))
        .or_else(|| env(v, HEADERS).map(|t| (HEADERS, t)))
    {
        match pairs(&text) {
            Some(list) => {
                for (name, value) in list {
                    let name = name.to_ascii_lowercase();
                    let valid = http::HeaderName::from_bytes(name.as_bytes()).is_ok()
                        && http::HeaderValue::from_str(&value).is_ok();
                    if !valid {
                        v.error("tracing", format!("{var}: `{name}` is not a header name with a value a header can carry"));
                    } else if !headers.iter().any(|(n, _)| *n == name) {
                        headers.push((name, Secret(value)));
                    }
                }
            }
            // Never the value: it is likely an API key.
            None => v.error(
                "tracing",
                format!("{var} is not a list of name=value pairs separated by commas"),
            ),
        }
    }
    headers
}

/// `tracing.resource` with the environment's attributes the file does not name, and the
/// service name (`tracing.service_name`, `OTEL_SERVICE_NAME`, the resource's `service.name`).
fn resource_of(v: &mut Validator, raw: &RawTracing) -> (Vec<(String, String)>, String) {
    let mut resource: Vec<(String, String)> = raw
        .resource
        .0
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(text) = env(v, RESOURCE) {
        match pairs(&text) {
            Some(list) => {
                for (key, value) in list {
                    if !resource.iter().any(|(k, _)| *k == key) {
                        resource.push((key, value));
                    }
                }
            }
            None => v.error(
                "tracing",
                format!("{RESOURCE}=`{text}` is not a list of key=value pairs separated by commas"),
            ),
        }
    }
    // `service.name` has its own setting; the resource's entry is its last resort.
    let in_resource = resource
        .iter()
        .position(|(k, _)| k == "service.name")
        .map(|at| resource.remove(at).1);
    let service_name = match raw.service_name.as_deref().map(str::trim) {
        Some("") => {
            v.error("tracing.service_name", "must not be empty");
            DEFAULT_SERVICE_NAME.to_owned()
        }
        Some(name) => name.to_owned(),
        None => env(v, SERVICE_NAME)
            .or(in_resource)
            .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned()),
    };
    (resource, service_name)
}

/// `tracing.sample_ratio`, else `OTEL_TRACES_SAMPLER` and its argument.
fn sampling_of(v: &mut Validator, raw: &RawTracing) -> Sampling {
    match raw.sample_ratio {
        Some(ratio) if (0.0..=1.0).contains(&ratio) => Sampling {
            parent_based: true,
            ratio,
        },
        Some(ratio) => {
            v.error("tracing.sample_ratio", format!("{ratio} is not a ratio: write a number from 0 (no new traces) to 1 (every request)"));
            Sampling {
                parent_based: true,
                ratio: 1.0,
            }
        }
        None => sampler(v, env(v, SAMPLER), env(v, SAMPLER_ARG)),
    }
}

/// `tracing.queue_size` and `tracing.batch_size`, a batch no larger than the queue.
fn sizes_of(v: &mut Validator, raw: &RawTracing) -> (usize, usize) {
    let count = |v: &mut Validator, field: &str, value: Option<u64>, default: usize| match value {
        None => default,
        Some(n) if (1..=MAX_QUEUE).contains(&n) => n as usize,
        Some(_) => {
            v.error(
                &format!("tracing.{field}"),
                format!("must be from 1 to {MAX_QUEUE} spans"),
            );
            default
        }
    };
    let queue_size = count(v, "queue_size", raw.queue_size, DEFAULT_TRACES_QUEUE);
    let batch_size = count(
        v,
        "batch_size",
        raw.batch_size,
        DEFAULT_TRACES_BATCH.min(queue_size),
    );
    if batch_size > queue_size {
        v.error(
            "tracing.batch_size",
            format!(
                "{batch_size} is above queue_size {queue_size}: a batch is taken from the queue"
            ),
        );
    }
    (queue_size, batch_size)
}

/// `tracing.propagators`, else `OTEL_PROPAGATORS`.
fn propagators_of(v: &mut Validator, raw: &RawTracing) -> Propagators {
    match &raw.propagators {
        Some(list) => {
            let mut chosen = Propagators {
                tracecontext: false,
                b3: false,
            };
            for (i, name) in list.iter().enumerate() {
                if !propagator(&mut chosen, name) {
                    v.error(
                        &format!("tracing.propagators[{i}]"),
                        format!("`{name}` is not a propagator tollgate reads: use tracecontext or b3 (or none)"),
                    );
                }
            }
            chosen
        }
        None => match env(v, PROPAGATORS) {
            None => Propagators::default(),
            Some(text) => {
                let mut chosen = Propagators {
                    tracecontext: false,
                    b3: false,
                };
                for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    // W3C baggage goes through untouched in any case: nothing to read.
                    if name != "baggage" && !propagator(&mut chosen, name) {
                        v.error("tracing", format!("{PROPAGATORS}: `{name}` is not a propagator tollgate reads: use tracecontext, baggage, b3, b3multi or none"));
                    }
                }
                chosen
            }
        },
    }
}

/// Adds the propagator `name` to `chosen`; false for a name tollgate does not read.
fn propagator(chosen: &mut Propagators, name: &str) -> bool {
    match name.trim() {
        "tracecontext" => chosen.tracecontext = true,
        // Either B3 form is read whichever is named; the caller's form is sent on.
        "b3" | "b3multi" => chosen.b3 = true,
        "none" => {}
        _ => return false,
    }
    true
}

fn protocol(text: &str) -> Option<OtlpProtocol> {
    match text.trim() {
        "grpc" => Some(OtlpProtocol::Grpc),
        "http/protobuf" => Some(OtlpProtocol::HttpProtobuf),
        _ => None,
    }
}

/// An http(s) URL; for HTTP, `/v1/traces` is added to a URL without a path when `base`.
fn endpoint(
    v: &mut Validator,
    path: &str,
    text: &str,
    protocol: OtlpProtocol,
    base: bool,
) -> String {
    let text = text.trim();
    let uri: http::Uri = match text.parse() {
        Ok(uri) => uri,
        Err(_) => {
            v.error(
                path,
                format!("`{text}` is not a URL: write e.g. http://collector:4318"),
            );
            return String::new();
        }
    };
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        v.error(
            path,
            format!("`{text}` is not an http:// or https:// URL with a host"),
        );
        return String::new();
    }
    if base && protocol == OtlpProtocol::HttpProtobuf {
        let trimmed = text.trim_end_matches('/');
        let has_path = uri.path() != "/" && !uri.path().is_empty();
        return if has_path && trimmed.ends_with("/v1/traces") {
            trimmed.to_owned()
        } else {
            format!("{trimmed}/v1/traces")
        };
    }
    text.to_owned()
}

/// `k=v,k2=v2` with percent-encoded values, as the OTEL header and resource variables are
/// written; None when a pair has no `=` or an empty key.
fn pairs(text: &str) -> Option<Vec<(String, String)>> {
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=')?;
            let key = key.trim();
            (!key.is_empty()).then(|| (key.to_owned(), percent_decode(value.trim())))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `OTEL_TRACES_SAMPLER` and its argument; the specification's default is
/// `parentbased_always_on`.
fn sampler(v: &mut Validator, name: Option<String>, arg: Option<String>) -> Sampling {
    let ratio = |v: &mut Validator| match arg.as_deref().map(str::trim) {
        None => 1.0,
        Some(text) => match text.parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => r,
            _ => {
                v.error(
                    "tracing",
                    format!("{SAMPLER_ARG}=`{text}` is not a ratio from 0 to 1"),
                );
                1.0
            }
        },
    };
    let Some(name) = name else {
        return Sampling {
            parent_based: true,
            ratio: 1.0,
        };
    };
    let (parent_based, ratio) = match name.trim() {
        "always_on" => (false, 1.0),
        "always_off" => (false, 0.0),
        "traceidratio" => (false, ratio(v)),
        "parentbased_always_on" => (true, 1.0),
        "parentbased_always_off" => (true, 0.0),
        "parentbased_traceidratio" => (true, ratio(v)),
        other => {
            v.error("tracing", format!("{SAMPLER}=`{other}` is not a sampler tollgate knows: use always_on, always_off, traceidratio or their parentbased_ forms"));
            (true, 1.0)
        }
    };
    Sampling {
        parent_based,
        ratio,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::model::{CallerContext, DEFAULT_MAX_SPANS_PER_SECOND};
    use crate::config::{parse, OtlpProtocol, Sampling, Traces};

    const BASE: &str = "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n";

    fn traces(section: &str, env: &[(&str, &str)]) -> Result<Option<Traces>, String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse(Path::new("t.yaml"), &format!("{BASE}{section}"), |name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
        .map(|c| c.traces)
        .map_err(|e| e.to_string())
    }

    #[test]
    fn off_without_a_section_or_an_endpoint_in_the_environment() {
        assert_eq!(traces("", &[]).unwrap(), None);
        assert_eq!(traces("", &[("OTEL_SERVICE_NAME", "x")]).unwrap(), None);
        assert_eq!(
            traces(
                "tracing: { enabled: false }\n",
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]
            )
            .unwrap(),
            None
        );
    }

    #[test]
    fn the_environment_alone_turns_export_on() {
        let t = traces(
            "",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
                ("OTEL_SERVICE_NAME", "edge"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "deployment.environment=prod,team=a%20b",
                ),
                ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s3cret"),
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(t.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(t.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(t.service_name, "edge");
        assert_eq!(
            t.resource,
            vec![
                ("deployment.environment".to_owned(), "prod".to_owned()),
                ("team".to_owned(), "a b".to_owned())
            ]
        );
        assert_eq!(t.headers.len(), 1);
        assert_eq!(t.headers[0].1 .0, "s3cret");
        assert_eq!(
            t.sampling,
            Sampling {
                parent_based: true,
                ratio: 0.25
            }
        );
        // The signal's own endpoint is taken whole; gRPC endpoints get no path.
        let t = traces(
            "",
            &[
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:9999/custom"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (t.endpoint.as_str(), t.protocol),
            ("http://c:9999/custom", OtlpProtocol::Grpc)
        );
    }

    #[test]
    fn the_file_wins_where_both_say_something() {
        let t = traces(
            "tracing:\n  endpoint: http://file:4317\n  protocol: grpc\n  service_name: gate\n  sample_ratio: 0.01\n  headers: { x-api-key: from-file }\n  resource: { team: file }\n",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_SERVICE_NAME", "env"),
                ("OTEL_TRACES_SAMPLER", "always_off"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=from-env,x-other=1"),
                ("OTEL_RESOURCE_ATTRIBUTES", "team=env,region=eu"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(t.endpoint, "http://file:4317");
        assert_eq!(t.protocol, OtlpProtocol::Grpc);
        assert_eq!(t.service_name, "gate");
        assert_eq!(
            t.sampling,
            Sampling {
                parent_based: true,
                ratio: 0.01
            }
        );
        let headers: Vec<(&str, &str)> = t
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.0.as_str()))
            .collect();
        assert_eq!(headers, vec![("x-api-key", "from-file"), ("x-other", "1")]);
        assert_eq!(
            t.resource,
            vec![
                ("team".to_owned(), "file".to_owned()),
                ("region".to_owned(), "eu".to_owned())
            ]
        );
    }

    #[test]
    fn bad_values_are_refused_where_they_are() {
        let err = traces(
            "tracing:\n  protocol: http/json\n  sample_ratio: 2\n  queue_size: 10\n  batch_size: 20\n  endpoint: collector:4317\n",
            &[],
        )
        .unwrap_err();
        for expected in [
            "t.yaml:4:13: tracing.protocol: `http/json` is not a protocol: use grpc or http/protobuf",
            "t.yaml:5:17: tracing.sample_ratio: 2 is not a ratio",
            "t.yaml:7:15: tracing.batch_size: 20 is above queue_size 10",
            "t.yaml:8:13: tracing.endpoint: `collector:4317` is not an http:// or https:// URL with a host",
        ] {
            assert!(err.contains(expected), "{expected:?} in\n{err}");
        }
        let err = traces(
            "",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_TRACES_SAMPLER", "jaeger_remote"),
            ],
        )
        .unwrap_err();
        assert!(
            err.contains("OTEL_TRACES_SAMPLER=`jaeger_remote` is not a sampler"),
            "{err}"
        );
        // A header's value is never repeated in an error: it is likely a key.
        let err = traces(
            "",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "secretvalue"),
            ],
        )
        .unwrap_err();
        assert!(
            err.contains("OTEL_EXPORTER_OTLP_HEADERS is not a list")
                && !err.contains("secretvalue"),
            "{err}"
        );
    }

    /// Both forms by default; the file's list, else `OTEL_PROPAGATORS` (baggage is passed
    /// through anyway, `b3multi` is B3); a name tollgate does not read is refused.
    #[test]
    fn propagators_from_the_file_or_the_environment() {
        let env = |value: &'static str| {
            [
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_PROPAGATORS", value),
            ]
        };
        let read = |section: &str, env: &[(&str, &str)]| {
            let p = traces(section, env).unwrap().unwrap().propagators;
            (p.tracecontext, p.b3)
        };
        assert_eq!(read("tracing: {}\n", &[]), (true, true));
        assert_eq!(read("tracing: { propagators: [b3] }\n", &[]), (false, true));
        assert_eq!(read("", &env("tracecontext,baggage")), (true, false));
        assert_eq!(read("", &env("b3multi")), (false, true));
        assert_eq!(read("", &env("none")), (false, false));
        assert_eq!(
            read("tracing: { propagators: [tracecontext] }\n", &env("b3")),
            (true, false)
        );
        let err = traces("tracing:\n  propagators: [tracecontext, jaeger]\n", &[]).unwrap_err();
        assert!(
            err.contains("t.yaml:4:31: tracing.propagators[1]: `jaeger` is not a propagator"),
            "{err}"
        );
        let err = traces("", &env("xray")).unwrap_err();
        assert!(
            err.contains("OTEL_PROPAGATORS: `xray` is not a propagator"),
            "{err}"
        );
    }

    #[test]
    fn caller_context_and_the_span_rate_have_defaults_and_bounds() {
        let t = traces("tracing: { endpoint: http://c:4318 }\n", &[])
            .unwrap()
            .unwrap();
        assert_eq!(t.caller_context, CallerContext::TrustedProxies);
        assert_eq!(t.max_spans_per_second, DEFAULT_MAX_SPANS_PER_SECOND);
        let t = traces(
            "tracing: { endpoint: http://c:4318, caller_context: any, max_spans_per_second: 50 }\n",
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(t.caller_context, CallerContext::Any);
        assert_eq!(t.max_spans_per_second, 50);
        let err = traces(
            "tracing: { endpoint: http://c:4318, caller_context: everyone, max_spans_per_second: 0 }\n",
            &[],
        )
        .unwrap_err();
        assert!(
            err.contains("tracing.caller_context: `everyone` is not"),
            "{err}"
        );
        assert!(
            err.contains("tracing.max_spans_per_second: must be from 1"),
            "{err}"
        );
    }
}

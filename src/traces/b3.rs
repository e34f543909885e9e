//! Zipkin's B3 trace context (`b3: {trace}-{span}-{sampled}-{parent}`, or `X-B3-TraceId`,
//! `X-B3-SpanId`, `X-B3-Sampled`, `X-B3-Flags`) as an OpenTelemetry [`TextMapPropagator`].
//!
//! Written here because the one Rust implementation, in the `opentelemetry-zipkin` crate, is
//! deprecated with the crate's Zipkin exporter. Reading takes the single header first, then the
//! multiple ones; a trace id of 16 hex digits is padded to 32, as the B3 specification says. A
//! caller that sent ids without a sampling decision gets [`DEFERRED`] in its flags, for the
//! caller of [`TextMapPropagator::extract`] to decide; debug (`d`, `X-B3-Flags: 1`) is read as
//! sampled.

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::propagation::{text_map_propagator::FieldIter, Extractor, Injector};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::Context;

const SINGLE: &str = "b3";
const TRACE_ID: &str = "x-b3-traceid";
const SPAN_ID: &str = "x-b3-spanid";
const SAMPLED: &str = "x-b3-sampled";
const FLAGS: &str = "x-b3-flags";
const PARENT_SPAN_ID: &str = "x-b3-parentspanid";

const SINGLE_FIELDS: [&str; 1] = [SINGLE];
const MULTI_FIELDS: [&str; 5] = [TRACE_ID, SPAN_ID, SAMPLED, FLAGS, PARENT_SPAN_ID];
const BOTH_FIELDS: [&str; 6] = [SINGLE, TRACE_ID, SPAN_ID, SAMPLED, FLAGS, PARENT_SPAN_ID];

/// The flag an extracted context carries when the caller left the sampling decision to us
/// (a bit W3C does not define: it never goes out in a `traceparent`).
pub const DEFERRED: TraceFlags = TraceFlags::new(0x02);

/// Which B3 headers are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Single,
    Multiple,
    Both,
}

/// The B3 propagator: reads either form, writes `Form`.
#[derive(Debug, Clone, Copy)]
pub struct B3(pub Form);

impl B3 {
    fn single(extractor: &dyn Extractor) -> Option<SpanContext> {
        let mut parts = extractor.get(SINGLE)?.trim().split('-');
        let trace_id = parse_trace_id(parts.next()?)?;
        let span_id = parse_span_id(parts.next()?)?;
        let flags = match parts.next() {
            None => DEFERRED,
            Some("1" | "d") => TraceFlags::SAMPLED,
            Some("0") => TraceFlags::default(),
            Some(_) => return None,
        };
        // A parent span id, when given, must be one; nothing may follow it.
        if let Some(parent) = parts.next() {
            parse_span_id(parent)?;
        }
        if parts.next().is_some() {
            return None;
        }
        Some(remote(trace_id, span_id, flags))
    }

    fn multiple(extractor: &dyn Extractor) -> Option<SpanContext> {
        let trace_id = parse_trace_id(extractor.get(TRACE_ID)?.trim())?;
        let span_id = parse_span_id(extractor.get(SPAN_ID)?.trim())?;
        let flags = match (
            extractor.get(FLAGS).map(str::trim),
            extractor.get(SAMPLED).map(str::trim),
        ) {
            // Debug implies sampled.
            (Some("1"), _) => TraceFlags::SAMPLED,
            (_, Some("1" | "true")) => TraceFlags::SAMPLED,
            (_, Some("0" | "false")) => TraceFlags::default(),
            (_, Some(_)) => return None,
            (_, None) => DEFERRED,
        };
        Some(remote(trace_id, span_id, flags))
    }
}

fn remote(trace_id: TraceId, span_id: SpanId, flags: TraceFlags) -> SpanContext {
    SpanContext::new(trace_id, span_id, flags, true, TraceState::default())
}

/// 32 or 16 lower-case hex digits (16 are the low half), not all zero.
fn parse_trace_id(text: &str) -> Option<TraceId> {
    let valid = matches!(text.len(), 16 | 32)
        && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let id = TraceId::from_hex(text).ok().filter(|_| valid)?;
    (id != TraceId::INVALID).then_some(id)
}

/// 16 lower-case hex digits, not all zero.
fn parse_span_id(text: &str) -> Option<SpanId> {
    let valid = text.len() == 16 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let id = SpanId::from_hex(text).ok().filter(|_| valid)?;
    (id != SpanId::INVALID).then_some(id)
}

impl TextMapPropagator for B3 {
    fn inject_context(&self, cx: &Context, injector: &mut dyn Injector) {
        let span = cx.span();
        let context = span.span_context();
        if !context.is_valid() {
            return;
        }
        let sampled = if context.is_sampled() { "1" } else { "0" };
        if matches!(self.0, Form::Single | Form::Both) {
            injector.set(
                SINGLE,
                format!("{}-{}-{sampled}", context.trace_id(), context.span_id()),
            );
        }
        if matches!(self.0, Form::Multiple | Form::Both) {
            injector.set(TRACE_ID, context.trace_id().to_string());
            injector.set(SPAN_ID, context.span_id().to_string());
            injector.set(SAMPLED, sampled.to_owned());
        }
    }

    fn extract_with_context(&self, cx: &Context, extractor: &dyn Extractor) -> Context {
        match B3::single(extractor).or_else(|| B3::multiple(extractor)) {
            Some(found) => cx.with_remote_span_context(found),
            None => cx.clone(),
        }
    }

    fn fields(&self) -> FieldIter<'_> {
        // FieldIter goes over owned names: made once.
        static NAMES: std::sync::OnceLock<[Vec<String>; 3]> = std::sync::OnceLock::new();
        let names = NAMES.get_or_init(|| {
            [&SINGLE_FIELDS[..], &MULTI_FIELDS[..], &BOTH_FIELDS[..]]
                .map(|list| list.iter().map(|name| (*name).to_owned()).collect())
        });
        FieldIter::new(match self.0 {
            Form::Single => &names[0],
            Form::Multiple => &names[1],
            Form::Both => &names[2],
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn extract(headers: &[(&str, &str)]) -> SpanContext {
        let map: HashMap<String, String> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        B3(Form::Both).extract(&map).span().span_context().clone()
    }

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    #[test]
    fn reads_either_form_and_refuses_malformed_ids() {
        let single = extract(&[("b3", &format!("{TRACE}-{SPAN}-1"))]);
        assert_eq!(single.trace_id().to_string(), TRACE);
        assert_eq!(single.span_id().to_string(), SPAN);
        assert_eq!(single.trace_flags(), TraceFlags::SAMPLED);
        assert!(single.is_remote());
        // Debug counts as sampled; a parent id may follow; no decision is deferred.
        let debug = extract(&[("b3", &format!("{TRACE}-{SPAN}-d-{SPAN}"))]);
        assert_eq!(debug.trace_flags(), TraceFlags::SAMPLED);
        assert_eq!(
            extract(&[("b3", &format!("{TRACE}-{SPAN}"))]).trace_flags(),
            DEFERRED
        );
        // 64-bit trace ids are the low half.
        let short = extract(&[("b3", &format!("a3ce929d0e0e4736-{SPAN}-0"))]);
        assert_eq!(
            short.trace_id().to_string(),
            "0000000000000000a3ce929d0e0e4736"
        );
        assert!(!short.is_sampled());

        let multi = extract(&[
            ("x-b3-traceid", TRACE),
            ("x-b3-spanid", SPAN),
            ("x-b3-sampled", "1"),
        ]);
        assert_eq!(
            (multi.trace_id().to_string(), multi.is_sampled()),
            (TRACE.to_owned(), true)
        );
        let flagged = extract(&[
            ("x-b3-traceid", TRACE),
            ("x-b3-spanid", SPAN),
            ("x-b3-flags", "1"),
        ]);
        assert!(flagged.is_sampled());

        for bad in [
            format!("{}-{SPAN}-1", TRACE.to_uppercase()),
            format!("{TRACE}-{SPAN}-x"),
            format!("{TRACE}-0000000000000000-1"),
            format!("{TRACE}-{SPAN}-1-{SPAN}-extra"),
            "0".to_owned(),
        ] {
            assert!(!extract(&[("b3", &bad)]).is_valid(), "{bad}");
        }
    }
}

//! The usage stage: a request to the configured `usage` path is answered here, before any
//! route, by `crate::usage`, and never forwarded.

use std::net::IpAddr;

use http::request::Parts;
use http::Response;

use crate::answers::Form;
use crate::proxy::answer_body::AnswerBody;
use crate::proxy::record::RequestRecord;
use crate::proxy::runtime::{Inner, Runtime};

/// Whether `parts` asks for the caller's own usage.
pub fn asks(runtime: &Runtime, parts: &Parts) -> bool {
    runtime
        .config
        .usage
        .as_ref()
        .is_some_and(|usage| parts.uri.path() == usage.path)
}

/// The caller's usage (or the endpoint's refusal), recorded as unrouted. Its answers are
/// HTTP even to a gRPC caller: the endpoint is no gRPC service.
pub async fn answer<'a>(
    inner: &Inner,
    runtime: &'a Runtime,
    parts: &Parts,
    peer: IpAddr,
    record: &mut RequestRecord<'a>,
    form: Form,
) -> Response<AnswerBody> {
    record.routed(None);
    let answering =
        crate::usage::answer(&runtime.limits, parts, peer, &inner.usage_rate, form.http());
    let response = answering.await;
    record.answered(response.status());
    response.map(AnswerBody::Right)
}

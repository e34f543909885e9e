//! The respond stage: the response as the client receives it. An admitted response carries
//! its rate-limit fields; one that owes a settlement or holds concurrency slots is settled and
//! holds them until its body ends; an error on the way and every refusal are answered by
//! `answers` (a gRPC caller's in gRPC); the record keeps the HTTP status tollgate chose.

use http::Response;
use tokio_util::task::TaskTracker;

use super::forward::Forwarded;
use crate::answers::{self, Answer, Form};
use crate::body;
use crate::proxy::answer_body::{boxed_answer, AnswerBody};
use crate::proxy::exchange::{self, Holdings};
use crate::proxy::record::RequestRecord;
use crate::proxy::runtime::{Inner, Runtime};
use crate::throttle::headers as limit_headers;
use crate::throttle::settle::Delivery;
use crate::throttle::Admitted;

/// The respond stage for a forwarded request. Only a response that settles or holds slots
/// waits here, in a boxed future: inline, its future would size every request's (moved, so
/// copied, each time).
pub async fn respond(
    inner: &Inner,
    runtime: &Runtime,
    admitted: Option<Admitted<'_>>,
    forwarded: Forwarded,
    record: &mut RequestRecord<'_>,
    form: Form,
) -> Response<AnswerBody> {
    let Forwarded {
        response,
        holdings,
        outcome,
    } = forwarded;
    let from_upstream = response.is_ok();
    let response = match response {
        Ok(response) => response,
        Err(error) => record.failed(error, form.http()).map(AnswerBody::Right),
    };
    let response = match admitted {
        None => response,
        Some(admitted) if holdings.settlement.is_none() && holdings.leases.is_none() => {
            with_limit_fields(runtime, &admitted, response)
        }
        Some(admitted) => {
            let settling = settle_and_hold(
                &inner.orphans,
                runtime,
                admitted,
                holdings,
                outcome,
                response,
                record,
            );
            Box::pin(settling).await
        }
    };
    answered(response, record, form == Form::Grpc && !from_upstream)
}

/// The answer to a request refused before it was forwarded, rendered in `form`; the record
/// keeps the HTTP status tollgate chose.
pub fn refuse(
    answer: Answer<'_>,
    record: &mut RequestRecord<'_>,
    form: Form,
) -> Response<AnswerBody> {
    let (status, response) = answer.render(form);
    record.answered(status);
    response.map(AnswerBody::Right)
}

/// The answer to a request refused before routing (its shape, see `proxy::shape`): counted
/// as unrouted and rejected.
pub fn rejected(
    answer: Answer<'_>,
    record: &mut RequestRecord<'_>,
    form: Form,
) -> Response<AnswerBody> {
    record.routed(None);
    record.rejected();
    refuse(answer, record, form)
}

/// An admitted response that owes a settlement or holds concurrency slots: settled
/// (count_statuses in the store before the head goes out, so its fields show it; the record
/// reads how it went), with its rate-limit fields, its slots released or held until its body ends (read to its end if the
/// client leaves first, see `exchange`).
async fn settle_and_hold(
    orphans: &TaskTracker,
    runtime: &Runtime,
    mut admitted: Admitted<'_>,
    holdings: Holdings,
    outcome: Delivery,
    mut response: Response<AnswerBody>,
    record: &mut RequestRecord<'_>,
) -> Response<AnswerBody> {
    let mut settles_at_end = false;
    if let Some(mut settlement) = holdings.settlement {
        settlement.report_to(record.settlement());
        settles_at_end = outcome == Delivery::Answered && settlement.settles_at_end();
        // count_statuses settles on this head, in the store before the head goes out
        // (and the fields below show it), cost_from_response before the body's end.
        let settled =
            settlement.on_response(response.map(boxed_answer), outcome, &mut admitted.verdicts);
        response = settled.await.map(AnswerBody::Right);
    }
    response = with_limit_fields(runtime, &admitted, response);
    if let Some(leases) = holdings.leases {
        if http_body::Body::is_end_stream(response.body()) {
            // The head is the whole response: the slots are back before it goes.
            leases.release().await;
        } else {
            // Back before the body's last frame goes on (see `body::BeforeEnd`).
            let (parts, body) = response.into_parts();
            let body = body::BeforeEnd::new(boxed_answer(body), *leases);
            response = Response::from_parts(parts, AnswerBody::Right(body::boxed(body)));
            settles_at_end = true;
        }
    }
    if settles_at_end {
        // Read to its end even if the client leaves first (see `exchange`).
        let (parts, body) = response.into_parts();
        let body =
            exchange::HeldBody::new(boxed_answer(body), (), orphans, runtime.upstream.timeout());
        response = Response::from_parts(parts, AnswerBody::Right(body::boxed(body)));
    }
    response
}

/// An admitted response with the rate-limit fields of its verdicts (none for a request
/// admitted without a decision).
fn with_limit_fields(
    runtime: &Runtime,
    admitted: &Admitted<'_>,
    mut response: Response<AnswerBody>,
) -> Response<AnswerBody> {
    if !admitted.verdicts.is_empty() {
        limit_headers::add_fields_with(
            response.headers_mut(),
            &runtime.config.throttle.response,
            admitted.set,
            admitted.policy.as_deref(),
            &admitted.verdicts,
            false,
        );
    }
    response
}

/// The response as the client receives it, its status recorded as tollgate chose it;
/// tollgate's own answer (an error on the way) translated for a gRPC client.
fn answered(
    response: Response<AnswerBody>,
    record: &mut RequestRecord<'_>,
    translate_for_grpc: bool,
) -> Response<AnswerBody> {
    record.answered(response.status());
    if translate_for_grpc {
        answers::for_grpc(response.map(boxed_answer), false).map(AnswerBody::Right)
    } else {
        response
    }
}

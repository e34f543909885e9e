//! The body of every response the proxy sends, one type for the upstream's and tollgate's own
//! so that the common case (the upstream's body passed through) costs nothing.

use crate::body::{self, ProxyBody};

use super::upstream::UpstreamBody;

/// `Left`, the upstream's own body, passed through as it is (no allocation, no dynamic call
/// per frame: the common case), or `Right`, one tollgate made or wrapped (its answers,
/// settlements, concurrency leases).
pub type AnswerBody = http_body_util::Either<UpstreamBody, ProxyBody>;

/// An answer's body as a [`ProxyBody`], for what wraps any body.
pub fn boxed_answer(body: AnswerBody) -> ProxyBody {
    match body {
        AnswerBody::Left(upstream) => body::boxed(upstream),
        AnswerBody::Right(own) => own,
    }
}

//! The form stage: on a route whose identities name a form field (`form: user`), the body of an
//! `application/x-www-form-urlencoded` request is read, up to [`MAX_FORM_BODY`] bytes, before
//! the caller is identified, and kept in the request's extensions for the identity
//! ([`crate::identity::FormBody`]); the same bytes are forwarded. Every other request's body
//! streams through unread: a route whose identities read no form field never sees its fields.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::request::Parts;
use http_body_util::{BodyExt, Either, Full, Limited};

use crate::error::ProxyError;
use crate::identity::FormBody;
use crate::proxy::runtime::Runtime;
use crate::proxy::stages::route::Routes;

/// The most of a form body read to identify its caller: past it, 413.
pub const MAX_FORM_BODY: usize = 64 * 1024;

/// Whether `parts`, on `routes`, has its form body read: one of the routes it is limited on
/// reads a form field, and it is a form. One branch for a configuration without form fields.
fn wanted(runtime: &Runtime, routes: &Routes<'_>, parts: &Parts) -> bool {
    let Some(reads) = runtime.reads_form.as_deref() else {
        return false;
    };
    let routed = routes.routed.iter().chain(&routes.also);
    routed.into_iter().any(|r| reads[r.index]) && is_form(parts)
}

/// The body to forward: as it came where no form field is read ([`wanted`]), otherwise read
/// first ([`read`]) and given back as the same bytes.
pub async fn body<B>(
    runtime: &Runtime,
    routes: &Routes<'_>,
    parts: &mut Parts,
    body: B,
) -> Result<Either<B, Full<Bytes>>, ProxyError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::body::BoxError>,
{
    if !wanted(runtime, routes, parts) {
        return Ok(Either::Left(body));
    }
    let config = &runtime.config;
    // Boxed: the read's future would otherwise size every request's.
    Box::pin(read(
        parts,
        body,
        config.max_request_body,
        config.header_read_timeout,
    ))
    .await
}

/// `Content-Type: application/x-www-form-urlencoded` (parameters and case aside).
fn is_form(parts: &Parts) -> bool {
    let Some(value) = parts.headers.get(CONTENT_TYPE) else {
        return false;
    };
    let media = value
        .as_bytes()
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default();
    media
        .trim_ascii()
        .eq_ignore_ascii_case(b"application/x-www-form-urlencoded")
}

/// Reads the form body of `parts` (at most [`MAX_FORM_BODY`] bytes, or `max_request_body`
/// when that is less) into its extensions, and gives back a body of the same bytes to forward;
/// 413 past the bound (a declared length past it is refused unread), 400 when the body cannot
/// be read (cut off, malformed framing) or has not arrived within `within` (the
/// `header_read_timeout`: the body is read before anything else happens, like a head, so a
/// client trickling it holds no more than one trickling a head).
async fn read<B>(
    parts: &mut Parts,
    body: B,
    max_request_body: Option<u64>,
    within: std::time::Duration,
) -> Result<Either<B, Full<Bytes>>, ProxyError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::body::BoxError>,
{
    let limit = max_request_body.map_or(MAX_FORM_BODY as u64, |max| max.min(MAX_FORM_BODY as u64));
    let too_large = ProxyError::BodyTooLarge { limit };
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(too_large);
    }
    // At most MAX_FORM_BODY, which fits any usize.
    let reading = tokio::time::timeout(within, Limited::new(body, limit as usize).collect());
    let bytes = match reading.await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => return Err(too_large),
        Ok(Err(_)) => return Err(ProxyError::BadRequest("the request body could not be read")),
        Err(_) => {
            return Err(ProxyError::BadRequest(
                "the form body did not arrive within header_read_timeout",
            ))
        }
    };
    parts.extensions.insert(FormBody(bytes.clone()));
    Ok(Either::Right(Full::new(bytes)))
}

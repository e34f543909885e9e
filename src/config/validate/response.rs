//! Validation of `response`: the status of a limited response and which rate-limit fields
//! responses carry.

use http::StatusCode;

use super::validator::Validator;
use crate::config::model::ResponseConfig;
use crate::config::raw::RawResponse;

pub(super) fn response(v: &mut Validator, raw: Option<&RawResponse>) -> ResponseConfig {
    let mut config = ResponseConfig {
        status: StatusCode::TOO_MANY_REQUESTS,
        ietf: true,
        legacy: false,
    };
    let Some(raw) = raw else { return config };
    if let Some(status) = raw.status {
        match StatusCode::from_u16(status) {
            Ok(s) if s.is_client_error() || s.is_server_error() => config.status = s,
            _ => v.error("response.status", format!("{status} is not an error status: use a 4xx or 5xx code (429 is the standard one)")),
        }
    }
    if let Some(headers) = &raw.headers {
        config.ietf = false;
        for (i, h) in headers.iter().enumerate() {
            match h.as_str() {
                "ietf" => config.ietf = true,
                "legacy" => config.legacy = true,
                other => v.error(&format!("response.headers[{i}]"), format!("`{other}` is not allowed: use ietf (RateLimit, RateLimit-Policy) and/or legacy (X-RateLimit-*)")),
            }
        }
    }
    config
}

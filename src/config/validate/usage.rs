//! Validation of `usage`: the path a caller reads its own usage at. It is answered before
//! routing, so it takes precedence over every route; a path that would swallow the whole site
//! (`/`) or could never match a request's path is refused.

use super::validator::Validator;
use crate::config::model::Usage;
use crate::config::raw::RawUsage;

pub(super) fn usage(v: &mut Validator, raw: Option<&RawUsage>) -> Option<Usage> {
    let raw = raw?;
    let path = raw.path.as_str();
    let problem = if !path.starts_with('/') {
        Some("must start with `/` (for example /_quota)")
    } else if path == "/" {
        Some("`/` would answer every request to the site's root: use a path of its own, such as /_quota")
    } else if path.contains(['?', '#']) {
        Some("is matched against the request's path alone: leave out `?` and `#`")
    } else if path.parse::<http::uri::PathAndQuery>().is_err()
        || path.bytes().any(|b| b.is_ascii_whitespace() || b == b'%')
    {
        Some("is not a plain URL path: use letters, digits and `/_-.~` (no spaces or percent-escapes)")
    } else {
        None
    };
    match problem {
        Some(message) => {
            v.error("usage.path", message);
            None
        }
        None => Some(Usage {
            path: path.to_owned(),
        }),
    }
}

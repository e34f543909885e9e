//! The admin listener's operator endpoints and the methods each takes: one table that the
//! listener routes by (a 405 lists the methods in `Allow`) and that `tollgate check` prints.
//! A leaf module, so that both can import it (the listener imports most of the crate).

use http::Method;

/// The operator endpoints and their methods (a GET endpoint answers HEAD too). `/protect`
/// answers 404 without a `protect` section.
pub const ENDPOINTS: &[(&str, &[Method])] = &[
    ("/limits/top", &[Method::GET]),
    ("/limits/suggest", &[Method::GET]),
    ("/limits/state", &[Method::GET]),
    ("/limits/reset", &[Method::POST]),
    ("/limits/override", &[Method::POST, Method::DELETE]),
    ("/limits/audit", &[Method::GET]),
    ("/limits/overrides", &[Method::GET]),
    ("/protect", &[Method::GET]),
];

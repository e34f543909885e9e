//! Why a request cannot be identified one way ([`Ambiguity`]): kept apart from the sources
//! that meet it and the refusal that carries it (`jwt::Refusal::Ambiguous`).

/// Why a request cannot be identified one way: it carries more than one value where the
/// identity's source reads one. Apps read such requests differently (Node and gunicorn join
/// repeated lines with commas, an app may take the first or the last element; Django takes the
/// last of two cookies or query parameters, Flask the first; flask-jwt-extended takes the first
/// `Bearer` entry of `Basic x, Bearer y` while most others take none), so tollgate keys on
/// none of them: the request is refused with 400, whatever the identity's `on_invalid` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ambiguity {
    /// `Authorization` holds more than one credential (two lines, or a comma list such as
    /// `Basic eDp5, Bearer <token>`), or a `Bearer` credential followed by a comma: read by a
    /// `bearer` or `jwt` source.
    Credentials,
    /// A header identity given twice, or with a comma in its value (a list to apps).
    Header,
    /// A cookie identity given twice (in one `Cookie` line or across lines).
    Cookie,
    /// A query identity given twice.
    Query,
}

impl Ambiguity {
    /// As logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Ambiguity::Credentials => "ambiguous_credentials",
            Ambiguity::Header => "ambiguous_header",
            Ambiguity::Cookie => "ambiguous_cookie",
            Ambiguity::Query => "ambiguous_query",
        }
    }

    /// The kind of source that met it, as logs name sources (a `jwt` or `bearer` source
    /// meets `Credentials`: "bearer").
    pub fn source_kind(self) -> &'static str {
        match self {
            Ambiguity::Credentials => "bearer",
            Ambiguity::Header => "header",
            Ambiguity::Cookie => "cookie",
            Ambiguity::Query => "query",
        }
    }

    /// What the 400 tells the client.
    pub fn detail(self) -> &'static str {
        match self {
            Ambiguity::Credentials => {
                "the request carries more than one credential in Authorization: send one"
            }
            Ambiguity::Header => {
                "the request carries more than one value of the header that identifies the caller: send one"
            }
            Ambiguity::Cookie => {
                "the request carries the cookie that identifies the caller more than once: send one"
            }
            Ambiguity::Query => {
                "the request carries the query parameter that identifies the caller more than once: send one"
            }
        }
    }
}

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
    /// A query identity given twice (`user=a&user[]=b` is twice too), or in a bracket form apps
    /// read as a structure (`user[a]=b`).
    Query,
    /// A form-field identity given twice, or in a bracket form apps read as a structure (as
    /// [`Ambiguity::Query`], in an `application/x-www-form-urlencoded` body).
    Form,
    /// `Authorization` holds a byte outside ASCII, read by a `bearer` or `jwt` source. Latin-1
    /// decoding apps see U+00A0 or U+0085 as whitespace around the scheme or the token
    /// (Python's `split()`, JS's `trim()`), so `Bearer\xa0<token>` is a bearer token to them and
    /// none to a reader of RFC 9110; credentials are ASCII, so such a value is refused.
    CredentialBytes,
    /// A cookie identity spelled so that apps decode it differently: Unicode whitespace around
    /// its name or value (JS and Python trim it), an opening quote without a closing one
    /// (Express's cookie module drops both ends), a backslash escape in a quoted value (Python
    /// decodes it, Express does not), or a `j:` value that is not a JSON string.
    CookieSpelling,
    /// A header identity whose value starts or ends with U+00A0 or U+0085 of a Latin-1
    /// decoded header (the bytes `\xa0`, `\x85`): Python's `strip()` and JS's `trim()` drop
    /// them, readers that trim ASCII whitespace only do not.
    HeaderSpelling,
}

impl Ambiguity {
    /// As logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Ambiguity::Credentials => "ambiguous_credentials",
            Ambiguity::Header => "ambiguous_header",
            Ambiguity::Cookie => "ambiguous_cookie",
            Ambiguity::Query => "ambiguous_query",
            Ambiguity::Form => "ambiguous_form",
            Ambiguity::CredentialBytes => "non_ascii_credentials",
            Ambiguity::CookieSpelling => "ambiguous_cookie_spelling",
            Ambiguity::HeaderSpelling => "ambiguous_header_spelling",
        }
    }

    /// The kind of source that met it, as logs name sources (a `jwt` or `bearer` source
    /// meets `Credentials`: "bearer").
    pub fn source_kind(self) -> &'static str {
        match self {
            Ambiguity::Credentials | Ambiguity::CredentialBytes => "bearer",
            Ambiguity::Header | Ambiguity::HeaderSpelling => "header",
            Ambiguity::Cookie | Ambiguity::CookieSpelling => "cookie",
            Ambiguity::Query => "query",
            Ambiguity::Form => "form",
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
                "the request carries the query parameter that identifies the caller more than once (name, name[] and name[0] are one parameter) or as a structure (name[key]): send one value"
            }
            Ambiguity::Form => {
                "the request body carries the form field that identifies the caller more than once (name, name[] and name[0] are one field) or as a structure (name[key]): send one value"
            }
            Ambiguity::CredentialBytes => {
                "Authorization holds bytes outside ASCII (such as Unicode whitespace around the scheme or the token), which apps read differently: send the credential in ASCII"
            }
            Ambiguity::HeaderSpelling => {
                "the header that identifies the caller has Unicode whitespace around its value, which apps trim differently: send it without"
            }
            Ambiguity::CookieSpelling => {
                "the cookie that identifies the caller is spelled so that apps decode it differently (Unicode whitespace, an unbalanced quote, a backslash escape in quotes, or a j: value that is not a JSON string): send it plainly"
            }
        }
    }
}

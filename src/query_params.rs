//! The admin listener's rule for query parameters, shared by its endpoints and the console's:
//! every parameter is one the endpoint knows, and none but the repeatable ones comes twice.
//! Nothing misspelt is silently ignored: an operator's `?foramt=text` or `?k=5&k=500` is
//! answered 400 with what the endpoint takes, not with a default they did not ask for.

use http::Request;

/// Every query parameter of `request` is one of `known`, and only those in `repeatable` come
/// more than once; otherwise why not, naming what `path` takes.
pub fn known_params<B>(
    request: &Request<B>,
    path: &str,
    known: &[&str],
    repeatable: &[&str],
) -> Result<(), String> {
    let Some(query) = request.uri().query() else {
        return Ok(());
    };
    let mut seen = vec![false; known.len()];
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        // One pair through the query decoder: its name compared as the endpoint reads it.
        let Some(index) = known
            .iter()
            .position(|name| crate::identity::query_param(pair, name).is_some())
        else {
            let name = pair.split_once('=').map_or(pair, |(name, _)| name);
            return Err(if known.is_empty() {
                format!("unknown query parameter `{name}`: {path} takes none")
            } else {
                format!(
                    "unknown query parameter `{name}`: {path} takes {}",
                    known.join(", ")
                )
            });
        };
        if std::mem::replace(&mut seen[index], true) && !repeatable.contains(&known[index]) {
            return Err(format!(
                "query parameter `{}` given more than once",
                known[index]
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap()
    }

    #[test]
    fn only_known_parameters_and_only_repeatable_ones_twice() {
        let known = &["format", "header"];
        let check = |uri: &str| known_params(&get(uri), "/x", known, &["header"]);
        assert_eq!(check("/x"), Ok(()));
        assert_eq!(check("/x?format=text&header=a&header=b"), Ok(()));
        assert_eq!(
            check("/x?format=text&format=json"),
            Err("query parameter `format` given more than once".into())
        );
        assert_eq!(
            check("/x?foramt=text"),
            Err("unknown query parameter `foramt`: /x takes format, header".into())
        );
        assert_eq!(
            known_params(&get("/y?a=1"), "/y", &[], &[]),
            Err("unknown query parameter `a`: /y takes none".into())
        );
    }
}

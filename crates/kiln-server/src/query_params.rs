//! Query parameters, one definition per route: the struct a handler extracts with
//! [`Params`] names every parameter the route takes (its serde field names), and
//! anything else is refused. A typo (`?prefx=`, `?limt=1`), a parameter the route
//! does not take (`?limit=2` where it is `page_size`) or one given twice
//! (`?id=a&id=b`) is a 400 `invalid_query` naming what the route knows, instead of
//! a 200 that silently ignored it. A route that takes none extracts [`NoParams`].

use crate::error::{ApiError, ErrorCode};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::{self, DeserializeOwned, Visitor};
use std::borrow::Cow;

/// The query string of a request, checked against `T`'s fields and parsed.
pub struct Params<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        parse(parts.uri.query().unwrap_or("")).map(Params)
    }
}

/// A route without query parameters: any parameter is refused.
pub struct NoParams;

#[derive(serde::Deserialize, Debug)]
struct Nothing {}

impl<S: Send + Sync> FromRequestParts<S> for NoParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        match parts.uri.query() {
            None | Some("") => Ok(NoParams),
            Some(q) => parse::<Nothing>(q).map(|_| NoParams),
        }
    }
}

/// Checks the names in `query` against `T`'s fields (none unknown, none twice),
/// then parses the values.
pub fn parse<T: DeserializeOwned>(query: &str) -> Result<T, ApiError> {
    let known = field_names::<T>();
    let mut seen: Vec<Cow<'_, str>> = Vec::new();
    for (name, _) in form_urlencoded::parse(query.as_bytes()) {
        if !known.contains(&name.as_ref()) {
            return Err(ApiError::new(
                ErrorCode::InvalidQuery,
                format!(
                    "unknown query parameter {name:?}; this route takes {}",
                    describe(known)
                ),
            ));
        }
        if seen.contains(&name) {
            return Err(ApiError::new(
                ErrorCode::InvalidQuery,
                format!("query parameter {name:?} is given more than once"),
            ));
        }
        seen.push(name);
    }
    serde_urlencoded::from_str(query).map_err(|e| {
        let message = match bad_parameter::<T>(query) {
            Some((name, value, why)) => {
                format!("invalid query parameter {name:?}: {value:?}: {why}")
            }
            None => format!("invalid query parameters: {e}"),
        };
        ApiError::new(ErrorCode::InvalidQuery, message)
    })
}

/// The parameter whose value `T` refuses, with its value and why: each
/// parameter parsed alone (serde reads a value when it meets it, and says a
/// required field is missing only at the end, so an error that is not "missing
/// field" alone is about that parameter's value).
fn bad_parameter<T: DeserializeOwned>(query: &str) -> Option<(String, String, String)> {
    form_urlencoded::parse(query.as_bytes()).find_map(|(name, value)| {
        let alone = form_urlencoded::Serializer::new(String::new())
            .append_pair(&name, &value)
            .finish();
        match serde_urlencoded::from_str::<T>(&alone) {
            Err(e) if !e.to_string().starts_with("missing field") => {
                Some((name.into_owned(), value.into_owned(), e.to_string()))
            }
            _ => None,
        }
    })
}

fn describe(known: &[&str]) -> String {
    match known {
        [] => "no query parameters".to_string(),
        _ => known.join(", "),
    }
}

/// The field names serde knows `T` by: what `T`'s `Deserialize` asks a
/// deserializer for, recorded by one that answers nothing else.
pub fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut names: &'static [&'static str] = &[];
    let _ = T::deserialize(FieldNames { out: &mut names });
    names
}

struct FieldNames<'a> {
    out: &'a mut &'static [&'static str],
}

#[derive(Debug)]
struct Recorded;

impl std::fmt::Display for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("field names recorded")
    }
}

impl std::error::Error for Recorded {}

impl de::Error for Recorded {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Recorded
    }
}

impl<'de> de::Deserializer<'de> for FieldNames<'_> {
    type Error = Recorded;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Recorded> {
        Err(Recorded)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Recorded> {
        *self.out = fields;
        Err(Recorded)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
        enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct Listing {
        #[serde(default)]
        prefix: String,
        page_size: Option<usize>,
    }

    #[test]
    fn known_parameters_parse_and_others_are_refused_by_name() {
        assert_eq!(field_names::<Listing>(), &["prefix", "page_size"]);
        let ok: Listing = parse("prefix=users%2F&page_size=2").unwrap();
        assert_eq!((ok.prefix.as_str(), ok.page_size), ("users/", Some(2)));
        let ok: Listing = parse("").unwrap();
        assert_eq!((ok.prefix.as_str(), ok.page_size), ("", None));

        let typo = parse::<Listing>("prefx=a").unwrap_err();
        assert_eq!(typo.code, ErrorCode::InvalidQuery);
        assert!(typo.message.contains("\"prefx\""), "{}", typo.message);
        assert!(
            typo.message.contains("prefix, page_size"),
            "{}",
            typo.message
        );
        let twice = parse::<Listing>("prefix=a&prefix=b").unwrap_err();
        assert!(
            twice.message.contains("more than once"),
            "{}",
            twice.message
        );
        let bad = parse::<Listing>("prefix=a&page_size=many").unwrap_err();
        assert_eq!(bad.code, ErrorCode::InvalidQuery);
        assert!(
            bad.message.contains("\"page_size\"") && bad.message.contains("\"many\""),
            "the parameter and its value are named: {}",
            bad.message
        );
        let none = parse::<Nothing>("limit=2").unwrap_err();
        assert!(
            none.message.contains("no query parameters"),
            "{}",
            none.message
        );
    }
}

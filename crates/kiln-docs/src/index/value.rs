//! Index values as order-preserving byte keys.
//!
//! The order across types is: (missing) < null < false < true < numbers < strings
//! (< arrays and objects, which only sort, never index). Numbers compare as numbers,
//! integers and floats mixed (10 > 9, 1.5 < 2, 2^53 + 1 > 2^53 as an integer);
//! strings by their UTF-8 bytes, or by their lowercase form in the case-insensitive
//! variant. Every encoding is self-delimiting, so the encodings of a compound key's
//! values are simply concatenated and a document id can follow them.
//!
//! - missing: `0x05`
//! - null: `0x10`; false: `0x20`; true: `0x21`
//! - number: `0x30`, then the value rounded to f64 in 8 order-preserving bytes, then
//!   8 bytes of the exact integer's difference from that f64 (0 for a float), so that
//!   large integers which round to the same f64 still keep their order
//! - string: `0x40`, the bytes with 0x00 written as 0x00 0xFF, then 0x00 0x01
//! - array or object (sorting only): `0x50`

use serde_json::{Number, Value};

pub(crate) const TAG_MISSING: u8 = 0x05;
pub(crate) const TAG_NULL: u8 = 0x10;
pub(crate) const TAG_FALSE: u8 = 0x20;
pub(crate) const TAG_TRUE: u8 = 0x21;
pub(crate) const TAG_NUMBER: u8 = 0x30;
pub(crate) const TAG_STRING: u8 = 0x40;
pub(crate) const TAG_COMPOSITE: u8 = 0x50;

/// A JSON scalar as the index sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    Null,
    Bool(bool),
    /// The value rounded to f64, and the exact integer's difference from it.
    Number(f64, i64),
    String(String),
}

/// The type classes that range comparisons stay within (`n < 5` never matches a
/// string or a null).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TypeClass {
    Null,
    Bool,
    Number,
    String,
}

impl TypeClass {
    /// The key range `[lo, hi)` holding every value of the class.
    pub(crate) fn bounds(self) -> (Vec<u8>, Vec<u8>) {
        let (lo, hi) = match self {
            TypeClass::Null => (TAG_NULL, TAG_NULL + 1),
            TypeClass::Bool => (TAG_FALSE, TAG_TRUE + 1),
            TypeClass::Number => (TAG_NUMBER, TAG_NUMBER + 1),
            TypeClass::String => (TAG_STRING, TAG_STRING + 1),
        };
        (vec![lo], vec![hi])
    }
}

impl Scalar {
    /// A JSON value as a scalar; `None` for arrays and objects, and for numbers
    /// outside the f64 range.
    pub fn from_json(v: &Value) -> Option<Scalar> {
        match v {
            Value::Null => Some(Scalar::Null),
            Value::Bool(b) => Some(Scalar::Bool(*b)),
            Value::Number(n) => number(n),
            Value::String(s) => Some(Scalar::String(s.clone())),
            Value::Array(_) | Value::Object(_) => None,
        }
    }

    pub fn from_i128(i: i128) -> Scalar {
        let f = i as f64;
        let f = if f == 0.0 { 0.0 } else { f };
        let diff = i - f as i128;
        Scalar::Number(f, diff as i64)
    }

    pub fn from_f64(f: f64) -> Option<Scalar> {
        if !f.is_finite() {
            return None;
        }
        Some(Scalar::Number(if f == 0.0 { 0.0 } else { f }, 0))
    }

    pub(crate) fn class(&self) -> TypeClass {
        match self {
            Scalar::Null => TypeClass::Null,
            Scalar::Bool(_) => TypeClass::Bool,
            Scalar::Number(..) => TypeClass::Number,
            Scalar::String(_) => TypeClass::String,
        }
    }

    /// The case-insensitive form (strings lowercased).
    pub fn folded(&self) -> Scalar {
        match self {
            Scalar::String(s) => Scalar::String(s.to_lowercase()),
            other => other.clone(),
        }
    }

    /// Appends the order-preserving encoding.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            Scalar::Null => out.push(TAG_NULL),
            Scalar::Bool(false) => out.push(TAG_FALSE),
            Scalar::Bool(true) => out.push(TAG_TRUE),
            Scalar::Number(f, diff) => {
                out.push(TAG_NUMBER);
                let bits = f.to_bits();
                let ordered = if bits >> 63 == 1 {
                    !bits
                } else {
                    bits ^ (1 << 63)
                };
                out.extend_from_slice(&ordered.to_be_bytes());
                out.extend_from_slice(&((*diff as u64) ^ (1 << 63)).to_be_bytes());
            }
            Scalar::String(s) => {
                out.push(TAG_STRING);
                escape_into(s.as_bytes(), out);
                out.extend_from_slice(&[0x00, 0x01]);
            }
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    /// The key prefix of every string starting with `prefix` (no terminator).
    pub(crate) fn string_prefix(prefix: &str) -> Vec<u8> {
        let mut out = vec![TAG_STRING];
        escape_into(prefix.as_bytes(), &mut out);
        out
    }
}

fn number(n: &Number) -> Option<Scalar> {
    if let Some(i) = n.as_i64() {
        return Some(Scalar::from_i128(i as i128));
    }
    if let Some(u) = n.as_u64() {
        return Some(Scalar::from_i128(u as i128));
    }
    n.as_f64().and_then(Scalar::from_f64)
}

fn escape_into(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
}

/// The sort key of a JSON value in the total order (missing for `None`).
pub(crate) fn sort_key(v: Option<&Value>, case_insensitive: bool) -> Vec<u8> {
    match v {
        None => vec![TAG_MISSING],
        Some(v) => match Scalar::from_json(v) {
            Some(s) if case_insensitive => s.folded().encode(),
            Some(s) => s.encode(),
            None => vec![TAG_COMPOSITE],
        },
    }
}

/// The length of the first value's encoding at the start of `key` (an index entry:
/// a compound key's values, then the document id); `None` if `key` does not start
/// with a whole encoded value.
pub(crate) fn encoded_len(key: &[u8]) -> Option<usize> {
    match *key.first()? {
        TAG_MISSING | TAG_NULL | TAG_FALSE | TAG_TRUE | TAG_COMPOSITE => Some(1),
        TAG_NUMBER => (key.len() >= 17).then_some(17),
        TAG_STRING => {
            // The terminator is 0x00 0x01; 0x00 0xFF is an escaped 0x00.
            let mut i = 1;
            while i + 1 < key.len() {
                if key[i] == 0 {
                    if key[i + 1] == 0x01 {
                        return Some(i + 2);
                    }
                    i += 2;
                } else {
                    i += 1;
                }
            }
            None
        }
        _ => None,
    }
}

/// The smallest key greater than every key starting with `prefix` (`None`: there is
/// none, the range runs to the end).
pub(crate) fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut out = prefix.to_vec();
    while let Some(last) = out.pop() {
        if last < 0xFF {
            out.push(last + 1);
            return Some(out);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cmp::Ordering;

    /// The defined order, computed without the encoding.
    fn model_cmp(a: &Scalar, b: &Scalar) -> Ordering {
        fn rank(s: &Scalar) -> u8 {
            match s {
                Scalar::Null => 0,
                Scalar::Bool(false) => 1,
                Scalar::Bool(true) => 2,
                Scalar::Number(..) => 3,
                Scalar::String(_) => 4,
            }
        }
        match (a, b) {
            (Scalar::Number(fa, da), Scalar::Number(fb, db)) => {
                fa.partial_cmp(fb).expect("finite").then_with(|| da.cmp(db))
            }
            (Scalar::String(x), Scalar::String(y)) => x.as_bytes().cmp(y.as_bytes()),
            _ => rank(a).cmp(&rank(b)),
        }
    }

    /// Exact comparison of two JSON numbers given as i128 or f64.
    #[derive(Debug, Clone)]
    enum Num {
        Int(i128),
        Float(f64),
    }

    fn num_cmp(a: &Num, b: &Num) -> Ordering {
        fn int_float(i: i128, f: f64) -> Ordering {
            if f.fract() == 0.0 && f.abs() < 1e30 {
                i.cmp(&(f as i128))
            } else {
                (i as f64).partial_cmp(&f).expect("finite")
            }
        }
        match (a, b) {
            (Num::Int(x), Num::Int(y)) => x.cmp(y),
            (Num::Float(x), Num::Float(y)) => x.partial_cmp(y).expect("finite"),
            (Num::Int(x), Num::Float(y)) => int_float(*x, *y),
            (Num::Float(x), Num::Int(y)) => int_float(*y, *x).reverse(),
        }
    }

    fn to_scalar(n: &Num) -> Scalar {
        match n {
            Num::Int(i) => Scalar::from_i128(*i),
            Num::Float(f) => Scalar::from_f64(*f).expect("finite"),
        }
    }

    fn num() -> impl Strategy<Value = Num> {
        prop_oneof![
            any::<i64>().prop_map(|i| Num::Int(i as i128)),
            any::<u64>().prop_map(|u| Num::Int(u as i128)),
            (-1000i64..1000).prop_map(|i| Num::Int(i as i128)),
            ((1i64 << 53) - 4..(1i64 << 53) + 4).prop_map(|i| Num::Int(i as i128)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Num::Float),
            (-1000i32..1000, 0u8..4).prop_map(|(i, q)| Num::Float(i as f64 + q as f64 / 4.0)),
            Just(Num::Float(-0.0)),
            Just(Num::Float(9007199254740992.0)),
        ]
    }

    fn scalar() -> impl Strategy<Value = Scalar> {
        prop_oneof![
            Just(Scalar::Null),
            any::<bool>().prop_map(Scalar::Bool),
            num().prop_map(|n| to_scalar(&n)),
            "[a-c\\x00\\xff]{0,4}".prop_map(Scalar::String),
            any::<String>().prop_map(Scalar::String),
        ]
    }

    proptest! {
        #[test]
        fn byte_order_is_the_defined_order(a in scalar(), b in scalar()) {
            prop_assert_eq!(a.encode().cmp(&b.encode()), model_cmp(&a, &b));
        }

        #[test]
        fn numbers_compare_exactly(a in num(), b in num()) {
            prop_assert_eq!(to_scalar(&a).encode().cmp(&to_scalar(&b).encode()), num_cmp(&a, &b));
        }

        #[test]
        fn compound_keys_order_by_first_value_then_next(
            a in scalar(), b in scalar(), c in scalar(), d in scalar()
        ) {
            let mut x = a.encode(); c.encode_into(&mut x);
            let mut y = b.encode(); d.encode_into(&mut y);
            prop_assert_eq!(x.cmp(&y), model_cmp(&a, &b).then_with(|| model_cmp(&c, &d)));
        }

        #[test]
        fn encoded_len_finds_the_first_value_of_a_compound_key(
            a in scalar(), b in scalar(), id in "[a-z/0-9\\x00]{0,6}"
        ) {
            let mut k = a.encode();
            let len = k.len();
            b.encode_into(&mut k);
            k.extend_from_slice(id.as_bytes());
            prop_assert_eq!(encoded_len(&k), Some(len));
        }

        #[test]
        fn case_insensitive_variant_orders_lowercase(a in "[a-zA-Z]{0,5}", b in "[a-zA-Z]{0,5}") {
            let x = Scalar::String(a.clone()).folded().encode();
            let y = Scalar::String(b.clone()).folded().encode();
            prop_assert_eq!(x.cmp(&y), a.to_lowercase().cmp(&b.to_lowercase()));
        }

        #[test]
        fn prefix_range_holds_exactly_the_strings_with_the_prefix(s in "[ab\\x00\\xff]{0,4}", p in "[ab\\x00\\xff]{0,2}") {
            let k = Scalar::String(s.clone()).encode();
            let lo = Scalar::string_prefix(&p);
            let inside = k >= lo && prefix_successor(&lo).is_none_or(|hi| k < hi);
            prop_assert_eq!(inside, s.starts_with(&p));
        }
    }

    #[test]
    fn fixed_examples() {
        let n = |v: serde_json::Value| Scalar::from_json(&v).unwrap().encode();
        assert!(n(serde_json::json!(10)) > n(serde_json::json!(9)));
        assert!(n(serde_json::json!(1.5)) < n(serde_json::json!(2)));
        assert_eq!(n(serde_json::json!(2)), n(serde_json::json!(2.0)));
        assert!(n(serde_json::json!(null)) < n(serde_json::json!(false)));
        assert!(n(serde_json::json!(true)) < n(serde_json::json!(-1e300)));
        assert!(n(serde_json::json!(1e300)) < n(serde_json::json!("")));
        assert!(
            n(serde_json::json!(9007199254740993u64)) > n(serde_json::json!(9007199254740992u64))
        );
    }
}

//! The binary form of what the Raft log holds and what crosses nodes: one format
//! byte, then the value in postcard (serde's fields in order, integers as
//! varints, strings and bytes as a length and themselves). A document's JSON text
//! inside an entry is its bytes, not a JSON string of it (every quote escaped on
//! the way in, searched for escapes on the way out, five times per entry: the
//! leader's log, two appends sent, two followers' logs).
//!
//! JSON, what builds before this one wrote and sent, is still read: it starts
//! with `{`, which no format byte is. An answer goes back in the form its request
//! came in ([`encode_like`]), so a node of this build answers an older peer in
//! JSON; a format byte this build does not know is refused naming it (a newer
//! build's entry), never guessed at.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// postcard, version 1 of Kiln's use of it.
pub const FORMAT_POSTCARD_V1: u8 = 1;
/// The first byte of a value in JSON (every value this module carries is an
/// object).
const JSON_OBJECT: u8 = b'{';

/// The media type of a Raft message body in the binary form.
pub const BINARY_CONTENT_TYPE: &str = "application/x-kiln-raft";

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("encoding: {0}")]
    Encode(#[source] postcard::Error),
    #[error("encoding as JSON: {0}")]
    EncodeJson(#[source] serde_json::Error),
    #[error("decoding format {FORMAT_POSTCARD_V1} (postcard), {len} bytes: {source}")]
    Decode {
        len: usize,
        #[source]
        source: postcard::Error,
    },
    #[error("decoding JSON, {len} bytes: {source}")]
    DecodeJson {
        len: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "format byte {0} is not one this build reads (format {FORMAT_POSTCARD_V1} and JSON): \
         written by a newer Kiln? Upgrade this node"
    )]
    UnknownFormat(u8),
    #[error("an empty value")]
    Empty,
}

/// `value` in the binary form.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    postcard::to_extend(value, vec![FORMAT_POSTCARD_V1]).map_err(CodecError::Encode)
}

/// `value` in the form `like` is in: JSON when it is JSON, else binary.
pub fn encode_like<T: Serialize + ?Sized>(like: &[u8], value: &T) -> Result<Vec<u8>, CodecError> {
    if is_json(like) {
        serde_json::to_vec(value).map_err(CodecError::EncodeJson)
    } else {
        encode(value)
    }
}

/// A value in either form.
pub fn decode<T: DeserializeOwned>(raw: &[u8]) -> Result<T, CodecError> {
    match raw.split_first() {
        None => Err(CodecError::Empty),
        Some((&FORMAT_POSTCARD_V1, rest)) => {
            postcard::from_bytes(rest).map_err(|source| CodecError::Decode {
                len: raw.len(),
                source,
            })
        }
        Some((&JSON_OBJECT, _)) => {
            serde_json::from_slice(raw).map_err(|source| CodecError::DecodeJson {
                len: raw.len(),
                source,
            })
        }
        Some((&other, _)) => Err(CodecError::UnknownFormat(other)),
    }
}

/// The media type of a message body in the form `body` is in.
pub fn content_type(body: &[u8]) -> &'static str {
    if is_json(body) {
        "application/json"
    } else {
        BINARY_CONTENT_TYPE
    }
}

fn is_json(raw: &[u8]) -> bool {
    raw.first() == Some(&JSON_OBJECT)
}

/// A field whose type needs a self-describing format (`skip_serializing_if`,
/// `serde_json::Value` inside: an index definition), kept as it was in JSON and
/// carried as its JSON text in the binary form.
pub(crate) mod json_text_in_binary {
    use serde::de::{DeserializeOwned, Error as _};
    use serde::ser::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            return value.serialize(s);
        }
        let text = serde_json::to_string(value).map_err(S::Error::custom)?;
        s.serialize_str(&text)
    }

    pub fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(
        d: D,
    ) -> Result<T, D::Error> {
        if d.is_human_readable() {
            return T::deserialize(d);
        }
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        serde_json::from_str(&text).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, LoggedCondition, LoggedOp};
    use crate::TypeConfig;
    use openraft::{Entry, EntryPayload};

    fn write_entry() -> Entry<TypeConfig> {
        Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(3, 1), 42),
            payload: EntryPayload::Normal(Command::Write {
                database: "shop".into(),
                at_ms: 1_700_000_000_000,
                all_or_none: false,
                ops: vec![
                    LoggedOp::Put {
                        id: "users/1".into(),
                        json: r#"{"name":"Ada \"the\" first","n":1}"#.into(),
                        condition: LoggedCondition::IfMatch("7-abc".into()),
                    }
                    .attributed(Some("key-1".into())),
                    LoggedOp::Delete {
                        id: "users/2".into(),
                        condition: LoggedCondition::None,
                    },
                ],
            }),
        }
    }

    #[test]
    fn entries_round_trip_in_both_forms_and_binary_is_smaller() {
        let entry = write_entry();
        let binary = encode(&entry).unwrap();
        let json = serde_json::to_vec(&entry).unwrap();
        assert_eq!(binary[0], FORMAT_POSTCARD_V1);
        assert!(
            binary.len() < json.len(),
            "{} >= {}",
            binary.len(),
            json.len()
        );
        for raw in [&binary, &json] {
            let back: Entry<TypeConfig> = decode(raw).unwrap();
            assert_eq!(
                serde_json::to_value(&back).unwrap(),
                serde_json::to_value(&entry).unwrap()
            );
        }
        assert_eq!(encode_like(&json, &entry).unwrap(), json);
        assert_eq!(encode_like(&binary, &entry).unwrap(), binary);
        assert_eq!(content_type(&json), "application/json");
        assert_eq!(content_type(&binary), BINARY_CONTENT_TYPE);
    }

    #[test]
    fn an_index_definition_and_attachment_bytes_cross_in_both_forms() {
        let definition: kiln_docs::IndexDefinition = serde_json::from_str(
            r#"{"name":"by_name","collection":"users","fields":[{"path":"name","case_insensitive":true}]}"#,
        )
        .unwrap();
        let commands = [
            Command::DefineIndex {
                database: "shop".into(),
                definition,
            },
            Command::AttachmentChunk {
                database: "shop".into(),
                at_ms: 5,
                upload_id: 9,
                offset: 0,
                keep_until_ms: 10,
                bytes: (0..=255u8).collect(),
            },
        ];
        for command in commands {
            for raw in [
                encode(&command).unwrap(),
                serde_json::to_vec(&command).unwrap(),
            ] {
                let back: Command = decode(&raw).unwrap();
                assert_eq!(
                    serde_json::to_value(&back).unwrap(),
                    serde_json::to_value(&command).unwrap()
                );
            }
        }
    }

    #[test]
    fn damaged_or_unknown_forms_are_refused_with_their_reason() {
        let binary = encode(&write_entry()).unwrap();
        let cut = decode::<Entry<TypeConfig>>(&binary[..binary.len() / 2]).unwrap_err();
        assert!(matches!(cut, CodecError::Decode { .. }), "{cut}");
        let newer = decode::<Entry<TypeConfig>>(&[2, 0, 0]).unwrap_err();
        assert!(newer.to_string().contains("format byte 2"), "{newer}");
        assert!(matches!(
            decode::<Entry<TypeConfig>>(&[]),
            Err(CodecError::Empty)
        ));
        let json = decode::<Entry<TypeConfig>>(b"{\"log_id\":").unwrap_err();
        assert!(matches!(json, CodecError::DecodeJson { .. }), "{json}");
    }
}

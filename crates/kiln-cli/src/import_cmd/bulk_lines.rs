//! Turning a record read from an input into a line of the bulk upload.

use super::inputs::Record;
use serde_json::{json, Map, Value};

pub(super) struct Ids {
    pub(super) prefix: Option<String>,
    pub(super) run: String,
}

impl Ids {
    fn generated(&self, prefix: &str, ordinal: u64) -> String {
        format!("{prefix}{}-{ordinal}", self.run)
    }
}

/// The bulk line `{"id", "document"}` for a record; `ordinal` (1-based, over all
/// inputs) makes generated ids.
pub(super) fn bulk_line(rec: &Record, ordinal: u64, ids: &Ids) -> Result<Vec<u8>, String> {
    let v: Value = serde_json::from_slice(&rec.raw).map_err(|e| {
        // serde's line is within the record; for NDJSON that is line 1 of it.
        format!("malformed JSON: {e}")
    })?;
    let Value::Object(mut obj) = v else {
        return Err("a document must be a JSON object".into());
    };
    let (id, document) = if let Some(id) = &rec.path_id {
        (id.clone(), obj)
    } else if is_bulk_form(&obj) {
        let id = match obj.remove("id") {
            Some(Value::String(s)) => s,
            _ => return Err("\"id\" must be a string".into()),
        };
        let Some(Value::Object(doc)) = obj.remove("document") else {
            return Err("\"document\" must be a JSON object".into());
        };
        let id = if id.ends_with('/') {
            ids.generated(&id, ordinal)
        } else {
            id
        };
        (id, doc)
    } else {
        let meta = obj.get("@metadata").and_then(Value::as_object);
        let given = meta
            .and_then(|m| m.get("@id"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let id = match given {
            Some(id) => id,
            None => {
                let prefix = match &ids.prefix {
                    Some(p) => p.clone(),
                    None => match meta
                        .and_then(|m| m.get("@collection"))
                        .and_then(Value::as_str)
                    {
                        Some(c) => format!("{c}/"),
                        None => "docs/".to_string(),
                    },
                };
                ids.generated(&prefix, ordinal)
            }
        };
        (id, obj)
    };
    let mut line = serde_json::to_vec(&json!({"id": id, "document": Value::Object(document)}))
        .map_err(|e| format!("cannot serialize: {e}"))?;
    line.push(b'\n');
    Ok(line)
}

/// `{"id": "...", "document": {...}}` and nothing else.
fn is_bulk_form(obj: &Map<String, Value>) -> bool {
    obj.len() == 2 && obj.get("id").is_some_and(Value::is_string) && obj.contains_key("document")
}

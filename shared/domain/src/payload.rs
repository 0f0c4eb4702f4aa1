//! Step payloads: arbitrary JSON, stored as compact JSON text so the item stays small and the mapping
//! stays exact (DynamoDB numbers and empty strings would otherwise reshape the document).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Payload(pub Value);

impl Payload {
    pub fn new(value: Value) -> Self {
        Self(value)
    }

    pub fn value(&self) -> &Value {
        &self.0
    }

    pub fn is_null(&self) -> bool {
        self.0.is_null()
    }

    /// The payload reference this payload is, if it is one.
    pub fn reference(&self) -> Option<PayloadRef> {
        PayloadRef::of(&self.0)
    }

    /// Size of the compact JSON text in bytes.
    pub fn encoded_len(&self) -> usize {
        self.0.to_string().len()
    }
}

impl From<Value> for Payload {
    fn from(value: Value) -> Self {
        Self(value)
    }
}

impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0.to_string())
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        serde_json::from_str(&text)
            .map(Payload)
            .map_err(serde::de::Error::custom)
    }
}

/// The value of the marker field that makes a JSON object a payload reference.
pub const PAYLOAD_REF: &str = "payload-ref";
/// The marker field of a payload reference (reserved: a payload object must not use it).
pub const REF_FIELD: &str = "$stepline";

/// A claim check: a payload too large to travel in a message or to sit in the record is stored as an
/// immutable object, and a reference to it travels instead. On the wire it is a JSON object:
/// `{"$stepline": "payload-ref", "bucket": .., "key": .., "size": .., "sha256": ..}`; `size` is the
/// byte length of the object (the payload's compact JSON text) and `sha256` its lower-case hex digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadRef {
    pub bucket: String,
    pub key: String,
    pub size: u64,
    pub sha256: String,
}

impl PayloadRef {
    /// The reference `value` is, if it is one.
    pub fn of(value: &Value) -> Option<PayloadRef> {
        let object = value.as_object()?;
        if object.get(REF_FIELD)?.as_str()? != PAYLOAD_REF {
            return None;
        }
        Some(PayloadRef {
            bucket: object.get("bucket")?.as_str()?.to_string(),
            key: object.get("key")?.as_str()?.to_string(),
            size: object.get("size")?.as_u64()?,
            sha256: object.get("sha256")?.as_str()?.to_string(),
        })
    }

    /// Whether `value` holds a reference anywhere.
    pub fn any_in(value: &Value) -> bool {
        match value {
            Value::Object(fields) => Self::of(value).is_some() || fields.values().any(Self::any_in),
            Value::Array(items) => items.iter().any(Self::any_in),
            _ => false,
        }
    }

    pub fn to_value(&self) -> Value {
        serde_json::json!({
            REF_FIELD: PAYLOAD_REF,
            "bucket": self.bucket,
            "key": self.key,
            "size": self.size,
            "sha256": self.sha256,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_reference_reads_back_from_its_wire_form_and_nothing_else_is_one() {
        let r = PayloadRef {
            bucket: "b".into(),
            key: "payloads/x/abc".into(),
            size: 12,
            sha256: "abc".into(),
        };
        assert_eq!(PayloadRef::of(&r.to_value()), Some(r.clone()));
        assert!(PayloadRef::any_in(&json!({"a": [1, {"b": r.to_value()}]})));
        assert_eq!(PayloadRef::of(&json!({"bucket": "b", "key": "k"})), None);
        assert_eq!(
            PayloadRef::of(&json!({"$stepline": "other", "bucket": "b"})),
            None
        );
        assert!(!PayloadRef::any_in(&json!({"a": [1, 2]})));
    }
}

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

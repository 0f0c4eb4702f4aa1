//! Prices and billing rules: one table of us-east-1 list prices, and the rules by which AWS turns a
//! request into billed units (DynamoDB item sizes and capacity units, SQS 64 KB chunks, Lambda GB-s).

use base64::Engine;
use serde::Serialize;
use serde_json::Value;

/// us-east-1 list prices (on-demand, standard queues, arm64 Lambda), in US dollars.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Prices {
    /// DynamoDB on-demand, per write request unit (1 KB).
    pub dynamodb_write_unit: f64,
    /// DynamoDB on-demand, per read request unit (4 KB strongly consistent, 2 x 4 KB eventually).
    pub dynamodb_read_unit: f64,
    /// SQS standard queue, per request (each 64 KB chunk of a payload is one request).
    pub sqs_request: f64,
    /// EventBridge custom events, per event (each 64 KB chunk).
    pub eventbridge_event: f64,
    /// S3 Standard, per PUT request and per GET request.
    pub s3_put: f64,
    pub s3_get: f64,
    /// Lambda, per invocation.
    pub lambda_request: f64,
    /// Lambda on arm64, per GB-second.
    pub lambda_gb_second: f64,
    /// Step Functions Standard, per state transition.
    pub step_functions_transition: f64,
    /// Lambda durable functions, per durable operation (a step is at least one).
    pub durable_operation: f64,
}

pub const US_EAST_1: Prices = Prices {
    dynamodb_write_unit: 0.625 / 1e6,
    dynamodb_read_unit: 0.125 / 1e6,
    sqs_request: 0.40 / 1e6,
    eventbridge_event: 1.00 / 1e6,
    s3_put: 5.0 / 1e6,
    s3_get: 0.40 / 1e6,
    lambda_request: 0.20 / 1e6,
    lambda_gb_second: 0.000_013_333_4,
    step_functions_transition: 25.0 / 1e6,
    durable_operation: 8.0 / 1e6,
};

/// Size of a DynamoDB item in bytes, by DynamoDB's rules: attribute names plus values (strings as UTF-8,
/// numbers about one byte per two significant digits plus one, binary as raw bytes, booleans and nulls
/// one byte, lists and maps three bytes plus one per element).
pub fn item_size(item: &serde_json::Map<String, Value>) -> u64 {
    item.iter()
        .map(|(name, value)| name.len() as u64 + value_size(value))
        .sum()
}

/// Size of one attribute value in DynamoDB JSON (`{"S": "..."}`, `{"M": {...}}`, ...).
pub fn value_size(value: &Value) -> u64 {
    let Some((kind, inner)) = value.as_object().and_then(|o| o.iter().next()) else {
        return 0;
    };
    match (kind.as_str(), inner) {
        ("S", Value::String(s)) => s.len() as u64,
        ("N", Value::String(n)) => number_size(n),
        ("B", Value::String(b)) => binary_size(b),
        ("BOOL", _) | ("NULL", _) => 1,
        ("SS", Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map_or(0, |s| s.len() as u64))
            .sum(),
        ("NS", Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map_or(0, number_size))
            .sum(),
        ("BS", Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map_or(0, binary_size))
            .sum(),
        ("L", Value::Array(items)) => 3 + items.iter().map(|v| 1 + value_size(v)).sum::<u64>(),
        ("M", Value::Object(map)) => {
            3 + map
                .iter()
                .map(|(k, v)| 1 + k.len() as u64 + value_size(v))
                .sum::<u64>()
        }
        _ => 0,
    }
}

fn number_size(n: &str) -> u64 {
    let digits: String = n
        .chars()
        .take_while(|c| *c != 'e' && *c != 'E')
        .filter(char::is_ascii_digit)
        .collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len() as u64;
    significant.max(1).div_ceil(2) + 1
}

fn binary_size(b: &str) -> u64 {
    base64::engine::general_purpose::STANDARD
        .decode(b)
        .map_or(b.len() as u64, |bytes| bytes.len() as u64)
}

/// Write request units of a write touching an item of `bytes` (1 KB units, at least one).
pub fn write_units(bytes: u64) -> u64 {
    bytes.div_ceil(1024).max(1)
}

/// Read request units of reading `bytes` (4 KB units, at least one; eventually consistent reads cost half).
pub fn read_units(bytes: u64, consistent: bool) -> f64 {
    let units = bytes.div_ceil(4096).max(1) as f64;
    if consistent {
        units
    } else {
        units / 2.0
    }
}

/// Billed SQS requests for a request carrying `payload_bytes` (each 64 KB chunk counts as one).
pub fn sqs_requests(payload_bytes: u64) -> u64 {
    payload_bytes.div_ceil(64 * 1024).max(1)
}

/// GB-seconds of an invocation of `duration_ms` (billed per started millisecond) at `memory_mb`.
pub fn gb_seconds(duration_ms: f64, memory_mb: u32) -> f64 {
    duration_ms.ceil().max(1.0) / 1000.0 * f64::from(memory_mb) / 1024.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(value: Value) -> serde_json::Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn item_size_follows_dynamodb_rules() {
        // "pk" (2) + 10 bytes; "n" (1) + "120" (2 significant digits once the trailing zero is
        // trimmed: 1 + 1 bytes); "ok" (2) + 1. 12345 has 5 significant digits: 3 + 1 bytes.
        let it = item(json!({"pk": {"S": "exec#12345"}, "n": {"N": "120"}, "ok": {"BOOL": true}}));
        assert_eq!(item_size(&it), 12 + 3 + 3);
        let it = item(json!({"n": {"N": "12345"}}));
        assert_eq!(item_size(&it), 1 + 4);
        // A map: 3 bytes, plus per element 1 byte + name + value.
        let it = item(json!({"m": {"M": {"a": {"S": "xy"}, "b": {"NULL": true}}}}));
        assert_eq!(item_size(&it), 1 + 3 + (1 + 1 + 2) + (1 + 1 + 1));
        // A list of two numbers; binary counts decoded bytes ("AAEC" is 3 bytes).
        let it = item(json!({"l": {"L": [{"N": "7"}, {"N": "1000"}]}, "b": {"B": "AAEC"}}));
        assert_eq!(item_size(&it), 1 + 3 + (1 + 2) + (1 + 2) + 1 + 3);
    }

    #[test]
    fn units_round_up_per_started_unit() {
        assert_eq!(write_units(0), 1);
        assert_eq!(write_units(1024), 1);
        assert_eq!(write_units(1025), 2);
        assert_eq!(read_units(4096, true), 1.0);
        assert_eq!(read_units(4097, true), 2.0);
        assert_eq!(read_units(100, false), 0.5);
        assert_eq!(sqs_requests(10), 1);
        assert_eq!(sqs_requests(64 * 1024 + 1), 2);
        assert!((gb_seconds(10.2, 128) - 0.011 * 0.125).abs() < 1e-12);
    }
}

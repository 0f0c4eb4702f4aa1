//! Pipeline contracts: the canonical, versioned description of what a pipeline's steps are (ids, kinds,
//! input/output type ids, retry policies), generated from its Rust definition.
//!
//! `contractVersion` is `sha256:` + the lowercase hex SHA-256 of the contract serialized as RFC 8785
//! (JSON Canonicalization Scheme) canonical JSON, with the `contractVersion` field left out. Deployment
//! details (request queues, step timeouts, release versions) are not part of the contract: the same
//! code deployed twice has one contract and two releases.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::pipeline::{PipelineDef, RetryPolicy, StepKind};

pub const CONTRACT_FILE: &str = "pipeline-contract.json";

/// One step as the contract describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContractStep {
    pub id: String,
    pub kind: StepKind,
    pub input_type: String,
    pub output_type: String,
    pub retry: RetryPolicy,
}

/// A pipeline contract.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Contract {
    pub pipeline_id: String,
    pub steps: Vec<ContractStep>,
    pub contract_version: String,
}

impl Contract {
    /// The contract of a definition (its queues and release version are deployment, not contract).
    pub fn of(def: &PipelineDef) -> Self {
        let mut contract = Contract {
            pipeline_id: def.pipeline_id.clone(),
            steps: def
                .steps
                .iter()
                .map(|s| ContractStep {
                    id: s.id.clone(),
                    kind: s.kind,
                    input_type: s.input_type.clone(),
                    output_type: s.output_type.clone(),
                    retry: s.retry.clone(),
                })
                .collect(),
            contract_version: String::new(),
        };
        contract.contract_version = contract.compute_version();
        contract
    }

    /// The canonical (JCS) bytes the version is computed over: the contract without `contractVersion`.
    pub fn canonical_body(&self) -> String {
        let mut value = serde_json::to_value(self).expect("a contract serializes");
        if let Value::Object(map) = &mut value {
            map.remove("contractVersion");
        }
        canonicalize(&value)
    }

    pub fn compute_version(&self) -> String {
        format!(
            "sha256:{}",
            hex::encode(Sha256::digest(self.canonical_body().as_bytes()))
        )
    }

    /// Whether the recorded `contractVersion` is the one its content hashes to.
    pub fn is_consistent(&self) -> bool {
        self.contract_version == self.compute_version()
    }

    /// The committed file's text: canonical JSON of the whole contract, plus a newline.
    pub fn to_file_text(&self) -> String {
        let value = serde_json::to_value(self).expect("a contract serializes");
        let mut text = serde_json::to_string_pretty(&sorted(&value)).expect("serializes");
        text.push('\n');
        text
    }
}

/// The value with object keys in JCS order (for a stable, readable file).
fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            let mut out = Map::new();
            for k in keys {
                out.insert(k.clone(), sorted(&map[k]));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// RFC 8785 canonical JSON: no whitespace, object members sorted by the UTF-16 code units of their
/// names, strings with the minimal escapes, numbers in ECMAScript's shortest form.
pub fn canonicalize(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number(n)),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_value(v, out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{09}' => out.push_str("\\t"),
            '\u{0a}' => out.push_str("\\n"),
            '\u{0c}' => out.push_str("\\f"),
            '\u{0d}' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// ECMAScript `Number.prototype.toString` of a JSON number (RFC 8785 section 3.2.2.3).
fn number(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    let x = n.as_f64().unwrap_or(0.0);
    if x == 0.0 {
        return "0".into();
    }
    let abs = x.abs();
    if (1e-6..1e21).contains(&abs) {
        // Rust prints the shortest round-tripping digits without an exponent in this range, as
        // ECMAScript does; an integral value has no fraction.
        let text = format!("{x}");
        return text.strip_suffix(".0").map(str::to_string).unwrap_or(text);
    }
    // Exponent form: Rust `1e21` / `1.5e-7`; ECMAScript `1e+21` / `1.5e-7`.
    let text = format!("{x:e}");
    match text.split_once('e') {
        Some((mantissa, exp)) if !exp.starts_with('-') => format!("{mantissa}e+{exp}"),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_form_sorts_keys_and_strips_whitespace() {
        let value = json!({"b": [1, {"z": true, "a": null}], "a": "x\ny\"", "é": 1});
        assert_eq!(
            canonicalize(&value),
            r#"{"a":"x\ny\"","b":[1,{"a":null,"z":true}],"é":1}"#
        );
    }

    #[test]
    fn numbers_follow_ecmascript() {
        for (text, expected) in [
            ("2.0", "2"),
            ("1.5", "1.5"),
            ("-0.25", "-0.25"),
            ("1e21", "1e+21"),
            ("1e-7", "1e-7"),
            ("123456789", "123456789"),
            ("0.000001", "0.000001"),
        ] {
            let value: Value = serde_json::from_str(text).unwrap();
            assert_eq!(canonicalize(&value), expected, "{text}");
        }
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        // U+1F600 (surrogates D83D DE00) sorts before U+FB33 in UTF-16, after it in UTF-8/code points.
        let value = json!({"\u{fb33}": 1, "\u{1f600}": 2});
        assert_eq!(canonicalize(&value), "{\"\u{1f600}\":2,\"\u{fb33}\":1}");
    }

    #[test]
    fn control_characters_use_lowercase_unicode_escapes() {
        assert_eq!(canonicalize(&json!("\u{1}\u{1f}")), r#""\u0001\u001f""#);
    }
}

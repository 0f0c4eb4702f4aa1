//! The committed `pipeline-contract.json` must be what the code generates (regenerate it with
//! `cargo run -p stepline-local -- contract --write`), and its `contractVersion` must be the SHA-256 of
//! the JCS form, as an independent implementation (Python's json and hashlib) computes it.

use std::path::PathBuf;
use std::process::Command;

use stepline_worker::contract::{Contract, CONTRACT_FILE};

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(CONTRACT_FILE)
}

#[test]
fn the_committed_contract_matches_the_code() {
    let committed =
        std::fs::read_to_string(committed_path()).expect("pipeline-contract.json is committed");
    let generated = order_worker::contract().to_file_text();
    assert_eq!(
        committed, generated,
        "pipeline-contract.json drifted from the code: run `cargo run -p stepline-local -- contract --write`"
    );
    let parsed: Contract = serde_json::from_str(&committed).unwrap();
    assert!(
        parsed.is_consistent(),
        "its contractVersion is not the hash of its content"
    );
}

#[test]
fn generation_is_deterministic() {
    let a = order_worker::contract();
    let b = order_worker::contract();
    assert_eq!(a.to_file_text(), b.to_file_text());
    assert_eq!(a.canonical_body(), b.canonical_body());
    // The contract does not depend on where the workers listen.
    let mut elsewhere = order_worker::pipeline("another-queue");
    for step in &mut elsewhere.steps {
        step.timeout_secs = 5; // nor on deployment settings
    }
    assert_eq!(
        Contract::of(&elsewhere).contract_version,
        a.contract_version
    );
    // It does depend on what the steps are.
    let mut other = order_worker::pipeline("");
    other.steps[1].output_type = "orders.PricedOrder/2".into();
    assert_ne!(Contract::of(&other).contract_version, a.contract_version);
}

#[test]
fn the_contract_version_is_an_independent_sha256_of_the_jcs_form() {
    // For this contract (ASCII keys, integral numbers) JCS equals sorted keys, compact separators and
    // integral floats printed as integers; Python computes that and the hash on its own.
    let script = r#"
import hashlib, json, sys
contract = json.load(sys.stdin)
contract.pop("contractVersion")
def ints(v):
    if isinstance(v, float) and v.is_integer(): return int(v)
    if isinstance(v, dict): return {k: ints(x) for k, x in v.items()}
    if isinstance(v, list): return [ints(x) for x in v]
    return v
body = json.dumps(ints(contract), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
print("sha256:" + hashlib.sha256(body.encode("utf-8")).hexdigest())
"#;
    let contract = order_worker::contract();
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(contract.to_file_text().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let independent = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert_eq!(independent, contract.contract_version);
    assert!(contract.contract_version.starts_with("sha256:"));
    assert_eq!(contract.contract_version.len(), "sha256:".len() + 64);
}

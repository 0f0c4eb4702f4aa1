//! The committed `pipeline-contract.json` must be what the code generates (regenerate it with
//! `cargo run -p stepline-local -- contract --write`).

use stepline_worker::contract::{Contract, CONTRACT_FILE};

#[test]
fn the_committed_contract_matches_the_code() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(CONTRACT_FILE);
    let committed = std::fs::read_to_string(path).expect("pipeline-contract.json is committed");
    assert_eq!(
        committed,
        restaurant_approval::contract().to_file_text(),
        "pipeline-contract.json drifted from the code: run `cargo run -p stepline-local -- contract --write`"
    );
    let parsed: Contract = serde_json::from_str(&committed).unwrap();
    assert!(parsed.is_consistent());
}

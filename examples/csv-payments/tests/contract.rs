//! The committed contracts must be what the code generates (regenerate them with
//! `cargo run -p stepline-local -- contract --write`).

use stepline_worker::contract::Contract;

#[test]
fn the_committed_contracts_match_the_code() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for (file, contract) in [
        ("pipeline-contract.json", csv_payments::batch_contract()),
        ("payment-contract.json", csv_payments::payment_contract()),
    ] {
        let committed = std::fs::read_to_string(dir.join(file)).expect("the contract is committed");
        assert_eq!(
            committed,
            contract.to_file_text(),
            "{file} drifted from the code: run `cargo run -p stepline-local -- contract --write`"
        );
        let parsed: Contract = serde_json::from_str(&committed).unwrap();
        assert!(parsed.is_consistent());
    }
}

//! The threat model (`docs/threat-model.md`) keeps up with the code: every message kind has its row,
//! and every test a row cites as proof exists where it says.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The values of the `*_KIND` constants of the envelope module.
fn kinds() -> Vec<String> {
    read(&root().join("shared/core/src/envelope.rs"))
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("pub const ")?;
            let (name, value) = rest.split_once(": &str = ")?;
            name.ends_with("_KIND")
                .then(|| value.trim_end_matches(';').trim_matches('"').to_string())
        })
        .collect()
}

/// Every `` `file.rs::test_name` `` the document cites.
fn cited_tests(doc: &str) -> Vec<(String, String)> {
    doc.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|span| {
            let (file, name) = span.split_once(".rs::")?;
            Some((format!("{file}.rs"), name.to_string()))
        })
        .collect()
}

#[test]
fn every_message_kind_has_its_row() {
    let doc = read(&root().join("docs/threat-model.md"));
    let kinds = kinds();
    assert!(kinds.len() >= 9, "the envelope's kinds: {kinds:?}");
    let missing: Vec<&String> = kinds
        .iter()
        .filter(|kind| !doc.contains(&format!("\n| `{kind}`")))
        .collect();
    assert!(missing.is_empty(), "kinds without a row: {missing:?}");
}

#[test]
fn every_cited_test_exists() {
    let doc = read(&root().join("docs/threat-model.md"));
    let cited = cited_tests(&doc);
    assert!(cited.len() >= 20, "citations found: {}", cited.len());
    let missing: Vec<String> = cited
        .iter()
        .filter(|(file, name)| {
            let path = root().join(file);
            !path.exists() || !read(&path).contains(&format!("fn {name}("))
        })
        .map(|(file, name)| format!("{file}::{name}"))
        .collect();
    assert!(missing.is_empty(), "cited tests not found: {missing:?}");
}

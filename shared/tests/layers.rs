//! The library's structure, drawn from its imports: every module imports only from layers below its
//! own, and the domain's modules import each other without a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first. A module may use modules of lower layers only.
const LAYERS: &[&[&str]] = &[
    // Switches for the defects the fault campaign plants (off in every function binary).
    &["planted"],
    &["domain"],
    &[
        "ports",
        "envelope",
        "cache",
        "config",
        "metrics",
        "telemetry",
    ],
    &["claims"],
    &["adapters"],
    &["coordinator"],
    &["handlers", "http", "worker"],
    &["aws"],
    &["lambda"],
    // Test support: the simulation runs everything.
    &["sim"],
];

fn layer(module: &str) -> usize {
    LAYERS
        .iter()
        .position(|l| l.contains(&module))
        .unwrap_or_else(|| panic!("module {module} has no layer in this test's table"))
}

/// Every source file of the library, by path below `src/`, with its code outside `#[cfg(test)]`
/// modules (unit tests may use anything).
fn sources() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path: PathBuf = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                let name = path.strip_prefix(&root).unwrap().to_string_lossy();
                files.insert(name.replace('\\', "/"), code.to_string());
            }
        }
    }
    files
}

/// The names that follow `prefix` in `code` (`crate::` gives the top-level modules used).
fn used(code: &str, prefix: &str) -> BTreeSet<String> {
    code.match_indices(prefix)
        .map(|(at, _)| {
            code[at + prefix.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

fn top_module(file: &str) -> String {
    file.split('/')
        .next()
        .unwrap()
        .trim_end_matches(".rs")
        .to_string()
}

#[test]
fn no_module_imports_from_a_layer_above_its_own() {
    let mut upward = Vec::new();
    for (file, code) in sources() {
        let module = top_module(&file);
        if module == "lib" {
            continue;
        }
        for target in used(&code, "crate::") {
            // The root re-exports (`crate::contract`, `crate::release`) are the domain's modules.
            let target = match target.as_str() {
                "contract" | "release" | "Code" => "domain".to_string(),
                _ => target,
            };
            if target != module && layer(&target) >= layer(&module) {
                upward.push(format!("{file} uses {target}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports at or above the importer's layer: {upward:#?}"
    );
}

#[test]
fn the_domain_modules_import_each_other_without_a_circle() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, code) in sources() {
        let Some(rest) = file.strip_prefix("domain/") else {
            continue;
        };
        let module = rest.split('/').next().unwrap().trim_end_matches(".rs");
        if module == "mod" {
            continue;
        }
        let mut targets = used(&code, "super::");
        targets.extend(used(&code, "crate::domain::"));
        targets.retain(|t| t != module);
        edges.entry(module.to_string()).or_default().extend(targets);
    }
    // Depth-first search for a back edge.
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if done.contains(node) {
            return;
        }
        assert!(
            !path.iter().any(|p| p == node),
            "domain import circle: {path:?} -> {node}"
        );
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if edges.contains_key(next) {
                visit(next, edges, path, done);
            }
        }
        path.pop();
        done.insert(node.to_string());
    }
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        visit(node, &edges, &mut Vec::new(), &mut done);
    }
    assert!(edges.len() >= 8, "domain modules found: {:?}", edges.keys());
}

//! The crates' layers, read from Cargo's own resolution (`cargo metadata`, `cargo tree`): every crate of
//! the workspace depends only on crates of lower layers, a worker links no coordinator client, no
//! function binary is built with the planted bugs switched on, and the domain's modules import each
//! other without a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The workspace's crates by layer, lowest first. A crate may depend only on crates of lower layers.
const LAYERS: &[&[&str]] = &[
    // The pure domain: no I/O.
    &["stepline-domain"],
    // Ports, wire formats and the coordinator, with in-memory adapters: no AWS.
    &["stepline-core"],
    // What a worker links: SQS and S3.
    &["stepline-worker"],
    // The coordinator on AWS, its handlers and Lambda wiring; the example workers.
    &[
        "stepline",
        "order-worker",
        "restaurant-approval",
        "csv-payments",
    ],
    // The function binaries (a `main.rs` each) and the stage tools.
    &[
        "claim",
        "launch",
        "completion",
        "redrive",
        "api",
        "stepline-stage",
        // The simulation: test support only.
        "stepline-sim",
    ],
    &["stepline-local"],
    &["stepline-cli", "stepline-bench"],
    // The end-to-end suite.
    &["stepline-suite"],
];

const FUNCTIONS: &[&str] = &["claim", "launch", "completion", "redrive", "api"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cargo(args: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(args)
        .current_dir(root())
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("cargo prints UTF-8")
}

fn layer(name: &str) -> usize {
    LAYERS
        .iter()
        .position(|l| l.contains(&name))
        .unwrap_or_else(|| panic!("crate {name} has no layer in this test's table"))
}

/// Each workspace crate's normal and build dependencies on other workspace crates.
fn workspace_dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let metadata: Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
        "--offline",
    ]))
    .expect("cargo metadata is JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let names: BTreeSet<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("a name"))
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].is_null() || d["kind"] == "build")
                .filter_map(|d| d["name"].as_str())
                .filter(|d| names.contains(d))
                .map(str::to_string)
                .collect();
            (p["name"].as_str().unwrap().to_string(), deps)
        })
        .collect()
}

/// What `package` links when built on its own (its normal and build dependencies, with the
/// features that build enables), one line per package or feature.
fn tree(package: &str) -> String {
    cargo(&[
        "tree",
        "--offline",
        "-p",
        package,
        "-e",
        "normal,build,features",
        "--prefix",
        "none",
    ])
}

#[test]
fn every_crate_depends_only_on_crates_of_lower_layers() {
    let crates = workspace_dependencies();
    let mut upward = Vec::new();
    for (name, deps) in &crates {
        for dep in deps {
            if layer(dep) >= layer(name) {
                upward.push(format!("{name} depends on {dep}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "dependencies at or above the dependent's layer: {upward:#?}"
    );
    let table: BTreeSet<&str> = LAYERS.iter().flat_map(|l| l.iter().copied()).collect();
    let found: BTreeSet<&str> = crates.keys().map(String::as_str).collect();
    assert_eq!(found, table, "every crate of the workspace has its layer");
}

#[test]
fn a_worker_links_no_coordinator_client() {
    let tree = tree("stepline-worker");
    for (name, lines) in [
        ("aws-sdk-dynamodb", "aws-sdk-dynamodb v"),
        ("aws-sdk-eventbridge", "aws-sdk-eventbridge v"),
        ("aws-sdk-secretsmanager", "aws-sdk-secretsmanager v"),
        ("the coordinator's AWS crate", "stepline v"),
    ] {
        assert!(
            !tree.lines().any(|l| l.starts_with(lines)),
            "stepline-worker links {name}:\n{tree}"
        );
    }
    for needed in ["aws-sdk-sqs v", "aws-sdk-s3 v", "stepline-core v"] {
        assert!(
            tree.lines().any(|l| l.starts_with(needed)),
            "the tree is read as it is printed ({needed} is there):\n{tree}"
        );
    }
}

#[test]
fn no_function_binary_links_the_simulation_or_is_built_with_the_planted_bugs() {
    for function in FUNCTIONS {
        // Inverted at the domain: every feature of it the build enables, and what enables it.
        let tree = cargo(&[
            "tree",
            "--offline",
            "-p",
            function,
            "-e",
            "normal,build,features",
            "--prefix",
            "none",
            "-i",
            "stepline-domain",
        ]);
        assert!(
            tree.lines()
                .any(|l| l.starts_with("stepline-domain feature \"default\"")),
            "{function} links the domain, and the tree shows its features:\n{tree}"
        );
        assert!(
            !tree.contains("feature \"testing\""),
            "{function} is built with the planted bugs:\n{tree}"
        );
        assert!(
            !tree.contains("stepline-sim"),
            "{function} links the simulation:\n{tree}"
        );
        let src = root().join("functions").join(function).join("src");
        let files: Vec<String> = std::fs::read_dir(&src)
            .expect("a function's sources")
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(files, ["main.rs"], "{function} is a main.rs only");
    }
}

/// The names that follow `prefix` in `code` (`crate::` gives the modules used).
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

#[test]
fn the_domain_modules_import_each_other_without_a_circle() {
    let src = root().join("shared/domain/src");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let file = path.strip_prefix(&src).unwrap().to_string_lossy();
            let module = file.split('/').next().unwrap().trim_end_matches(".rs");
            if module == "lib" {
                continue;
            }
            // Unit tests may use anything.
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let mut targets = used(code, "super::");
            targets.extend(used(code, "crate::"));
            targets.retain(|t| t != module);
            edges.entry(module.to_string()).or_default().extend(targets);
        }
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

//! The commands that need no stage: `validate` (a pipeline file) and `init` (a new pipeline: its file,
//! a worker skeleton in Rust or Python and the worker stack's SAM template).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use stepline::contract::{Contract, CONTRACT_FILE};
use stepline_stage::releases::read_pipeline_file;

/// The language of a generated worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Python,
    Rust,
}

/// Checks a pipeline file, prints its contract version and, with `write_contract`, writes its contract
/// beside it. A contract file already beside it must be the file's (else its workers check requests
/// against a stale identity).
pub fn validate(file: &Path, write_contract: bool) -> Result<()> {
    let definition = read_pipeline_file(file, "")?;
    let contract = Contract::of(&definition);
    let beside = file.with_file_name(CONTRACT_FILE);
    if write_contract {
        std::fs::write(&beside, contract.to_file_text())
            .with_context(|| format!("writing {}", beside.display()))?;
    } else if let Ok(text) = std::fs::read_to_string(&beside) {
        let committed: Contract = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a contract", beside.display()))?;
        if committed.contract_version != contract.contract_version {
            bail!(
                "{} is stale: it has {}, {} defines {} (run `stepline validate {} --write-contract`)",
                beside.display(),
                committed.contract_version,
                file.display(),
                contract.contract_version,
                file.display()
            );
        }
    }
    println!(
        "{}: pipeline {} ({} steps), contract {}",
        file.display(),
        definition.pipeline_id,
        definition.steps.len(),
        contract.contract_version
    );
    for warning in definition.warnings() {
        eprintln!("warning: {}: {warning}", file.display());
    }
    Ok(())
}

const PIPELINE: &str = include_str!("../templates/pipeline.yaml");
const STACK: &str = include_str!("../templates/template.yaml");
const PYTHON_WORKER: &str = include_str!("../templates/python/worker.py");
const PYTHON_REQUIREMENTS: &str = include_str!("../templates/python/requirements.txt");
/// The Python worker runtime: the protocol's reference worker, copied into each project.
const PYTHON_RUNTIME: &str = include_str!("../../../examples/python-worker/stepline_worker.py");
const RUST_MANIFEST: &str = include_str!("../templates/rust/Cargo.toml");
const RUST_MAIN: &str = include_str!("../templates/rust/src/main.rs");

/// Writes a new pipeline's project into `dir` (default `./NAME`), which must not exist yet.
pub fn init(
    name: &str,
    lang: Lang,
    dir: Option<PathBuf>,
    stepline_path: Option<PathBuf>,
) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= 40
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid {
        bail!("{name:?}: a pipeline name is 1 to 40 lowercase letters, digits and dashes, starting with a letter");
    }
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    if dir.exists() {
        bail!("{} exists: init writes a new directory", dir.display());
    }
    let stepline_path = match stepline_path {
        Some(path) => path,
        None => stepline_stage::workspace_root().join("shared/worker"),
    };
    let stepline_path = stepline_path
        .canonicalize()
        .with_context(|| format!("the stepline-worker library at {}", stepline_path.display()))?;
    let fill = |text: &str| {
        text.replace("{{name}}", name)
            .replace("{{stepline_path}}", &stepline_path.to_string_lossy())
            .replace("{{runtime}}", runtime(lang))
            .replace("{{handler}}", handler(lang))
    };
    let mut files: Vec<(&str, String)> = vec![
        ("pipeline.yaml", fill(PIPELINE)),
        ("template.yaml", stack(lang, &fill(STACK))),
    ];
    match lang {
        Lang::Python => files.extend([
            ("worker.py", fill(PYTHON_WORKER)),
            ("stepline_worker.py", PYTHON_RUNTIME.to_string()),
            ("requirements.txt", PYTHON_REQUIREMENTS.to_string()),
        ]),
        Lang::Rust => {
            files.extend([
                ("Cargo.toml", fill(RUST_MANIFEST)),
                ("src/main.rs", fill(RUST_MAIN)),
            ]);
            // The versions the library is built and tested with (cargo drops what is not used).
            let lock = stepline_path
                .ancestors()
                .map(|dir| dir.join("Cargo.lock"))
                .find(|lock| lock.exists());
            if let Some(text) = lock.and_then(|lock| std::fs::read_to_string(lock).ok()) {
                files.push(("Cargo.lock", text));
            }
        }
    }
    for (path, text) in &files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().expect("a file in the directory"))?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    validate(&dir.join("pipeline.yaml"), true)?;
    for (path, _) in &files {
        println!("wrote {}", dir.join(path).display());
    }
    println!("wrote {}", dir.join(CONTRACT_FILE).display());
    Ok(())
}

fn runtime(lang: Lang) -> &'static str {
    match lang {
        Lang::Python => "python3.12",
        Lang::Rust => "provided.al2023",
    }
}

fn handler(lang: Lang) -> &'static str {
    match lang {
        Lang::Python => "worker.handler",
        Lang::Rust => "bootstrap",
    }
}

/// The worker stack's template: a Rust worker is built by cargo-lambda.
fn stack(lang: Lang, text: &str) -> String {
    match lang {
        Lang::Python => text.to_string(),
        Lang::Rust => text.replace(
            "    Metadata:\n",
            "    Metadata:\n      BuildMethod: rust-cargolambda\n",
        ),
    }
}

//! The deploy build, checked: every Rust function of template.yaml (`BuildMethod: rust-cargolambda`)
//! has an arm64 bootstrap, as Lambda's `provided.al2023` on `arm64` runs it, within the binary-size
//! target. `infra/build-lambdas.sh` (which `infra/test.sh --full` runs before the tests) builds them
//! with cargo-lambda into target/lambda/<binary>/bootstrap; this test reads what it left.

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use stepline_local::{workspace_root, Template};

/// The largest bootstrap allowed, in bytes (BENCHMARKS.md's `binary_mb_max` target: 8 MB of 10^6).
const MAX_BYTES: u64 = 8_000_000;
/// `e_machine` of an ELF file for AArch64, and for x86-64.
const EM_AARCH64: u16 = 183;
const EM_X86_64: u16 = 62;

/// The machine a 64-bit little-endian ELF executable is for.
fn elf_machine(path: &Path) -> Result<u16> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    ensure!(bytes.len() > 20, "{} is too short for ELF", path.display());
    ensure!(
        bytes[..4] == *b"\x7fELF",
        "{} is not an ELF file",
        path.display()
    );
    ensure!(
        bytes[4] == 2 && bytes[5] == 1,
        "{} is not 64-bit little-endian ELF",
        path.display()
    );
    Ok(u16::from_le_bytes([bytes[18], bytes[19]]))
}

/// The package a CodeUri holds: its Cargo.toml's `[package] name` (each holds one binary of that name).
fn package_name(dir: &Path) -> Result<String> {
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml"))
        .with_context(|| format!("{}/Cargo.toml", dir.display()))?;
    manifest
        .lines()
        .find_map(|line| {
            let value = line.strip_prefix("name = ")?;
            Some(value.trim_matches('"').to_string())
        })
        .with_context(|| format!("no package name in {}/Cargo.toml", dir.display()))
}

/// Every Rust function of the template: (logical id, the bootstrap cargo-lambda builds for it).
fn rust_functions(template: &Template) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for (logical, kind, props) in template.resources() {
        let build =
            template.root["Resources"][logical.as_str()]["Metadata"]["BuildMethod"].as_str();
        if kind != "AWS::Serverless::Function" || build != Some("rust-cargolambda") {
            continue;
        }
        let code = props["CodeUri"]
            .as_str()
            .with_context(|| format!("{logical} has no CodeUri"))?;
        let binary = package_name(&workspace_root().join(code))?;
        out.push((
            logical,
            workspace_root()
                .join("target/lambda")
                .join(binary)
                .join("bootstrap"),
        ));
    }
    Ok(out)
}

#[test]
fn every_function_of_the_template_has_an_arm64_bootstrap_within_the_size_target() -> Result<()> {
    stepline_local::full_tier_only!("reads the arm64 build infra/build-lambdas.sh makes");
    let template = Template::load(&Template::default_path())?;
    let functions = rust_functions(&template)?;
    ensure!(
        functions.len() >= 8,
        "the template's Rust functions: {functions:?}"
    );
    let mut failures = Vec::new();
    for (logical, bootstrap) in &functions {
        let bytes = match bootstrap.metadata() {
            Ok(meta) => meta.len(),
            Err(e) => {
                failures.push(format!("{logical}: {}: {e}", bootstrap.display()));
                continue;
            }
        };
        let machine = elf_machine(bootstrap)?;
        eprintln!(
            "{logical}: {} {bytes} bytes, ELF machine {machine}",
            bootstrap.display()
        );
        if machine != EM_AARCH64 {
            failures.push(format!("{logical}: ELF machine {machine}, not AArch64"));
        }
        if bytes > MAX_BYTES {
            failures.push(format!("{logical}: {bytes} bytes, over {MAX_BYTES}"));
        }
    }
    if !failures.is_empty() {
        bail!("the deploy build falls short (infra/build-lambdas.sh builds it):\n{failures:#?}");
    }
    Ok(())
}

#[test]
fn the_check_tells_an_arm64_binary_from_a_host_one() -> Result<()> {
    // The test executable itself is built for the host: the check must not take it for arm64.
    let host = elf_machine(&std::env::current_exe()?)?;
    assert_ne!(host, EM_AARCH64);
    if cfg!(target_arch = "x86_64") {
        assert_eq!(host, EM_X86_64);
    }
    assert!(elf_machine(&workspace_root().join("Cargo.toml")).is_err());
    Ok(())
}

//! The API against its own contract, from outside: schemathesis (infra/fuzzer.sh installs the pinned
//! version) runs every check but authentication (infra/schemathesis.toml) over openapi.yaml, its
//! stateful phase following the spec's links, against `stepline-local run --api` on a fresh stage of
//! the emulator. Any failure fails the test with schemathesis's report and the seed that replays it.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use stepline_local::testing::{say, seed, sized};
use stepline_local::{fresh_stage, workspace_root};

mod support;

use support::RunProcess;

/// The fuzzer, installed by infra/fuzzer.sh.
fn st() -> Result<PathBuf> {
    let st = workspace_root().join(".venv-fuzz/bin/st");
    ensure!(
        st.is_file(),
        "{} is missing: run infra/fuzzer.sh (infra/test.sh does)",
        st.display()
    );
    Ok(st)
}

#[test]
fn the_api_keeps_its_contract_under_an_outside_fuzzer() -> Result<()> {
    stepline_local::needs_emulator!();
    let st = st()?;
    let stage = fresh_stage("fuzz");
    let runner = RunProcess::started(&stage, "api", &["--api", "127.0.0.1:0"])?;
    let address = runner
        .api_address()
        .context("the runner says where its API is")?;
    // The function URLs check SigV4; the local endpoint does not: the spec without its security.
    let dir = std::env::temp_dir().join(&stage);
    std::fs::create_dir_all(&dir)?;
    let spec = std::fs::read_to_string(workspace_root().join("openapi.yaml"))?;
    let unsecured = spec.replace("security:\n  - sigv4: []\n", "");
    ensure!(unsecured != spec, "openapi.yaml's top-level security moved");
    std::fs::write(dir.join("openapi.yaml"), unsecured)?;
    // schemathesis takes a seed of at most 2^53 or so: the run's seed, cut to that.
    let seed = (seed() % (1 << 40)).to_string();
    let examples = sized(10, 50).to_string();
    say(&format!(
        "schemathesis: seed {seed}, {examples} examples per operation"
    ));
    let output = Command::new(&st)
        .current_dir(&dir)
        .arg("--config-file")
        .arg(workspace_root().join("infra/schemathesis.toml"))
        .args(["run", "openapi.yaml", "--url"])
        .arg(format!("http://{address}"))
        .args([
            "--checks",
            "all",
            "--max-examples",
            &examples,
            "--seed",
            &seed,
        ])
        .args(["--workers", "1", "--no-color"])
        .env("NO_COLOR", "1")
        .output()
        .context("running schemathesis")?;
    let report = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "schemathesis found failures (replay: STEPLINE_SEED={seed}):\n{report}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    // It reached the API's core: executions were created and followed through the spec's links.
    let covered = report
        .lines()
        .find_map(|l| l.trim().strip_prefix("API Links:"))
        .and_then(|l| l.split_whitespace().next()?.parse::<u32>().ok())
        .context("schemathesis reports its links")?;
    ensure!(covered > 0, "no link was followed:\n{report}");
    drop(runner);
    Ok(())
}

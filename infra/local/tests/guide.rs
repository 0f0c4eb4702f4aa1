//! The "Your own pipeline" guide (docs/guide.md), run as written: each of its command blocks
//! (`<!-- guide: LANG -->`) runs in a fresh directory with the tools on the PATH, on a fresh stage
//! of the emulator, and must end with its execution SUCCEEDED (`stepline watch` exits 0 only then).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use stepline_local::{fresh_stage, workspace_root};

mod support;

use support::stepline_binary;

/// The shell commands of the docs/guide.md block marked `<!-- guide: LANG -->`.
fn block(lang: &str) -> Result<String> {
    let readme = std::fs::read_to_string(workspace_root().join("docs/guide.md"))?;
    let marker = format!("<!-- guide: {lang} -->\n```sh\n");
    let start = readme
        .find(&marker)
        .with_context(|| format!("docs/guide.md has no {lang} guide"))?
        + marker.len();
    let end = readme[start..]
        .find("\n```")
        .context("the guide's block ends")?;
    Ok(readme[start..start + end].to_string())
}

/// Runs a guide block with `bash -eo pipefail` in a fresh directory; its background jobs are killed
/// when it ends. Returns its standard output.
fn run_guide(lang: &str, timeout: Duration, env: &[(&str, String)]) -> Result<String> {
    let commands = block(lang)?;
    let bin = PathBuf::from(stepline_binary())
        .parent()
        .context("the CLI's directory")?
        .to_path_buf();
    let local = PathBuf::from(env!("CARGO_BIN_EXE_stepline-local"));
    assert_eq!(
        local.parent(),
        Some(bin.as_path()),
        "both tools in one directory"
    );
    // The emulator's virtualenv has boto3; `python` is its interpreter.
    let path = format!(
        "{}:{}:{}",
        bin.display(),
        workspace_root().join(".venv/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dir = std::env::temp_dir().join(fresh_stage(&format!("guide-{lang}")));
    std::fs::create_dir_all(&dir)?;
    let script = format!("trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\nset -x\n{commands}\n");
    let out_file = dir.join("guide.out");
    let err_file = dir.join("guide.err");
    let mut child = Command::new("bash")
        .args(["-eo", "pipefail", "-c", &script])
        .current_dir(&dir)
        .env("PATH", path)
        .env("STEPLINE_STAGE", fresh_stage(lang))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_file)?)
        .stderr(std::fs::File::create(&err_file)?)
        .spawn()?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break child.wait()?;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stdout = std::fs::read_to_string(&out_file).unwrap_or_default();
    if !status.success() {
        let logs: Vec<String> = ["coordinator.log", "worker.log", "run.log"]
            .iter()
            .flat_map(|name| {
                walk(&dir)
                    .into_iter()
                    .filter(move |p| p.file_name().is_some_and(|f| f == *name))
            })
            .map(|p| {
                format!(
                    "--- {}\n{}",
                    p.display(),
                    std::fs::read_to_string(&p).unwrap_or_default()
                )
            })
            .collect();
        bail!(
            "the {lang} guide failed ({status}) in {}:\n{stdout}\n{}\n{}",
            dir.display(),
            std::fs::read_to_string(&err_file).unwrap_or_default(),
            logs.join("\n")
        );
    }
    Ok(stdout)
}

/// Files under `dir`, two levels deep.
fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(
                std::fs::read_dir(&path)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path()),
            );
        } else {
            found.push(path);
        }
    }
    found
}

/// Asserts that a guide's run ended with the worker's result and the worker listed.
fn assert_succeeded(stdout: &str) {
    assert!(
        stdout.contains("\"processed\":true"),
        "the result is the worker's: {stdout}"
    );
    assert!(
        stdout.contains(" release 1 HEALTHY queue "),
        "the worker is listed: {stdout}"
    );
}

#[test]
fn the_python_guide_runs_to_a_succeeded_execution() -> Result<()> {
    stepline_local::needs_emulator!();
    let stdout = run_guide("python", Duration::from_secs(300), &[])?;
    assert_succeeded(&stdout);
    Ok(())
}

#[test]
fn the_rust_guide_runs_to_a_succeeded_execution() -> Result<()> {
    stepline_local::full_tier_only!("builds the generated Rust worker from cold");
    stepline_local::needs_emulator!();
    // The generated worker builds in a target directory of its own, kept between runs.
    let target = workspace_root().join("target/guide");
    let stdout = run_guide(
        "rust",
        Duration::from_secs(1800),
        &[("CARGO_TARGET_DIR", target.to_string_lossy().into_owned())],
    )?;
    assert_succeeded(&stdout);
    Ok(())
}

#[test]
fn the_curl_guide_talks_to_the_local_api() -> Result<()> {
    stepline_local::needs_emulator!();
    let stdout = run_guide("curl", Duration::from_secs(300), &[])?;
    // The submit, the result, the listing and the history, each as the API answered it.
    let answers: Vec<serde_json::Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| format!("one JSON answer a line: {stdout}"))?;
    let [submitted, result, listed, history] = answers.as_slice() else {
        bail!("four answers: {stdout}");
    };
    let id = submitted["executionId"].as_str().context("an id")?;
    assert_eq!(result["status"], "SUCCEEDED", "{result}");
    assert_eq!(result["result"]["totalCents"], 500, "{result}");
    assert!(
        listed["executions"]
            .as_array()
            .is_some_and(|all| all.iter().any(|e| e["executionId"] == id)),
        "{listed}"
    );
    assert_eq!(history["execution"]["executionId"], id, "{history}");
    assert_eq!(
        history["attempts"].as_array().map(Vec::len),
        Some(3),
        "{history}"
    );
    Ok(())
}

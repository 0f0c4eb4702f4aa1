//! The commands that need no stage, driven as a process: `validate` of pipeline files (errors that
//! name the file, line and field; the contract written beside it and kept in step) and `init`.

use std::path::PathBuf;
use std::process::{Command, Output};

fn stepline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stepline"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("the CLI runs")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const PIPELINE: &str = "\
pipelineId: shop
steps:
  - id: check
    queue: shop-requests
    retry:
      maxAttempts: 3
  - id: ship
    queue: shop-requests
";

#[test]
fn validate_names_the_line_and_field_and_keeps_the_contract_in_step() {
    let dir = scratch("validate");
    let file = dir.join("pipeline.yaml");
    let path = file.to_str().unwrap();

    std::fs::write(&file, PIPELINE.replace("maxAttempts: 3", "maxAttempts: 0")).unwrap();
    let out = stepline(&["validate", path]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("INVALID_PIPELINE")
            && stderr.contains("line 6: steps[0].retry.maxAttempts: must be at least 1"),
        "{stderr}"
    );
    std::fs::write(
        &file,
        PIPELINE.replace("queue: shop-requests\n    retry", "queues: x\n    retry"),
    )
    .unwrap();
    let stderr = String::from_utf8_lossy(&stepline(&["validate", path]).stderr).into_owned();
    assert!(
        stderr.contains("line 4") && stderr.contains("unknown field `queues`"),
        "{stderr}"
    );

    std::fs::write(&file, PIPELINE).unwrap();
    let out = stepline(&["validate", path, "--write-contract"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let contract: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("pipeline-contract.json")).unwrap())
            .unwrap();
    let expected = stepline::pipeline_file::contract(PIPELINE).unwrap();
    assert_eq!(contract["contractVersion"], expected.contract_version);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&expected.contract_version));

    // The pipeline changes; the contract beside it no longer matches: validate says so.
    std::fs::write(&file, PIPELINE.replace("maxAttempts: 3", "maxAttempts: 4")).unwrap();
    let out = stepline(&["validate", path]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is stale"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn init_writes_a_project_and_refuses_to_overwrite_one() {
    let dir = scratch("init");
    for lang in ["python", "rust"] {
        let project = dir.join(lang);
        let project = project.to_str().unwrap();
        let out = stepline(&["init", "shop", "--lang", lang, "--dir", project]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let expected: &[&str] = match lang {
            "python" => &["worker.py", "stepline_worker.py", "requirements.txt"],
            _ => &["Cargo.toml", "src/main.rs", "Cargo.lock"],
        };
        for file in ["pipeline.yaml", "pipeline-contract.json", "template.yaml"]
            .iter()
            .chain(expected)
        {
            assert!(
                std::path::Path::new(project).join(file).is_file(),
                "{lang}: no {file}"
            );
        }
        let again = stepline(&["init", "shop", "--lang", lang, "--dir", project]);
        assert!(!again.status.success(), "init overwrote {project}");
    }
    // The Rust worker links the worker crate: SQS and S3, no coordinator client.
    let manifest = dir.join("rust/Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--manifest-path",
        ])
        .arg(&manifest)
        .output()
        .unwrap();
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for linked in ["stepline-worker v", "aws-sdk-sqs v", "aws-sdk-s3 v"] {
        assert!(
            tree.lines().any(|l| l.starts_with(linked)),
            "{linked}:\n{tree}"
        );
    }
    for absent in ["aws-sdk-dynamodb v", "aws-sdk-eventbridge v", "stepline v"] {
        assert!(
            !tree.lines().any(|l| l.starts_with(absent)),
            "{absent}:\n{tree}"
        );
    }
    let bad = stepline(&[
        "init",
        "Shop Two",
        "--dir",
        dir.join("bad").to_str().unwrap(),
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("lowercase"));
}

#[test]
fn validate_warns_that_a_retry_delay_under_a_second_waits_a_whole_second() {
    let dir = scratch("validate-delay");
    let file = dir.join("pipeline.yaml");
    let path = file.to_str().unwrap();
    std::fs::write(&file, PIPELINE).unwrap();
    let out = stepline(&["validate", path, "--write-contract"]);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"));

    std::fs::write(
        &file,
        PIPELINE.replace(
            "maxAttempts: 3",
            "maxAttempts: 3\n      initialDelayMs: 300",
        ),
    )
    .unwrap();
    let out = stepline(&["validate", path, "--write-contract"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "a warning, not an error: {stderr}");
    assert!(
        stderr.contains("warning:")
            && stderr.contains("step check: initialDelayMs 300 is under a second")
            && stderr.contains("rounded up to the next second"),
        "{stderr}"
    );
}

//! A worker in another language, written from docs/protocol.md alone: the Python worker of
//! `examples/python-worker` (boto3, no project code) runs its pipeline end to end on the emulator
//! against the coordinator's handlers, its pipeline registered from its pipeline file with the
//! operator CLI. It meets a retry (attempt 1 of `reserve` fails), a step longer than its timeout kept
//! alive by heartbeats (`pack`), a duplicate delivery of a request (answered once), and an invalid
//! order that fails for good.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use stepline::domain::Status;
use stepline::SubmitRequest;
use stepline_local::{fresh_stage, workspace_root, LocalStack};

mod support;

use support::{run, stepline_binary, RunProcess};

/// Runs a binary to its end; it must succeed. Returns its standard output.
fn ok(binary: &str, args: &[&str]) -> Result<String> {
    let out = run(binary, args);
    if !out.status.success() {
        bail!(
            "{binary} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `export NAME=value` lines, as `stepline-local attach` prints them.
fn exports(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The project's Python (the emulator's virtualenv has boto3).
fn python() -> PathBuf {
    workspace_root().join(".venv/bin/python")
}

/// A Python worker process logging JSON lines to a file; killed when dropped.
struct PythonWorker {
    child: Child,
    log: PathBuf,
}

impl PythonWorker {
    fn start(dir: &Path, env: &BTreeMap<String, String>, log: PathBuf) -> Result<Self> {
        let child = Command::new(python())
            .arg("worker.py")
            .current_dir(dir)
            .envs(env)
            .env("PYTHONUNBUFFERED", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting the Python worker")?;
        Ok(Self { child, log })
    }

    /// Asks it to stop (SIGTERM): it announces that it drains, then exits.
    fn terminate(&mut self) -> Result<std::process::ExitStatus> {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("the worker did not stop within a minute of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its log's JSON lines whose `event` is `event`.
    fn events(&self, event: &str) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["event"] == event)
            .collect()
    }
}

impl Drop for PythonWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_worker_runs_its_pipeline_with_a_retry_heartbeats_and_a_duplicate() -> Result<()> {
    stepline_local::needs_emulator!();
    let stage = fresh_stage("python-worker");
    let _coordinator = RunProcess::started(
        &stage,
        "coordinator",
        &["--functions", "claim,launch,completion"],
    )?;
    let local = LocalStack::find(&stage).await?;

    // The example's files, its queue named for this stage.
    let dir = std::env::temp_dir().join(format!("{stage}-python-worker"));
    std::fs::create_dir_all(&dir)?;
    let example = workspace_root().join("examples/python-worker");
    for file in ["worker.py", "stepline_worker.py"] {
        std::fs::copy(example.join(file), dir.join(file))?;
    }
    let queue = format!("{stage}-py-requests");
    let pipeline = std::fs::read_to_string(example.join("pipeline.yaml"))?
        .replace("py-orders-requests", &queue);
    let file = dir.join("pipeline.yaml");
    std::fs::write(&file, pipeline)?;
    let file = file.to_string_lossy().into_owned();

    let cli = stepline_binary();
    let local_cli = env!("CARGO_BIN_EXE_stepline-local");
    ok(cli, &["validate", &file, "--write-contract"])?;
    let env = exports(&ok(
        local_cli,
        &[
            "attach",
            "--stage",
            &stage,
            "--file",
            &file,
            "--release",
            "1",
        ],
    )?);
    let staged = |args: &[&str]| ok(cli, &[&["--stage", stage.as_str()], args].concat());
    staged(&["releases", "register", "--file", &file, "--release", "1"])?;
    staged(&["releases", "--pipeline", "py-orders", "activate", "1"])?;

    let api = local.operator()?;
    let submit = |input: Value| {
        let api = &api;
        async move {
            anyhow::Ok(
                api.submit(SubmitRequest {
                    pipeline_id: "py-orders".into(),
                    tenant: "python".into(),
                    input,
                    ..Default::default()
                })
                .await?
                .execution,
            )
        }
    };
    // `pack` sleeps 5 s on a 3 s timeout: only heartbeats keep its attempt alive.
    let slow = submit(json!({"orderId": "o-slow", "packSecs": 5})).await?;
    let quick = submit(json!({"orderId": "o-quick"})).await?;
    let invalid = submit(json!({"orderId": ""})).await?;

    // A duplicate delivery: a copy of the first request waiting on the queue, sent again as SQS may.
    let sqs = aws_sdk_sqs::Client::new(&local.sdk);
    let url = &env["REQUEST_QUEUE_URL"];
    let deadline = Instant::now() + Duration::from_secs(30);
    let duplicated = loop {
        let received = sqs
            .receive_message()
            .queue_url(url)
            .visibility_timeout(0)
            .wait_time_seconds(1)
            .send()
            .await?;
        if let Some(body) = received.messages().first().and_then(|m| m.body()) {
            sqs.send_message()
                .queue_url(url)
                .message_body(body)
                .send()
                .await?;
            let request: Value = serde_json::from_str(body)?;
            break request["header"]["launchId"]
                .as_str()
                .context("a request names its launch")?
                .to_string();
        }
        if Instant::now() > deadline {
            bail!("no request reached the worker's queue");
        }
    };

    let mut worker_env = env.clone();
    worker_env.insert(
        "STEPLINE_CONTRACT_FILE".into(),
        dir.join("pipeline-contract.json").to_string_lossy().into(),
    );
    for name in [
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
    ] {
        if let Ok(value) = std::env::var(name) {
            worker_env.insert(name.into(), value);
        }
    }
    worker_env.insert(
        "AWS_DEFAULT_REGION".into(),
        std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()),
    );
    let worker = PythonWorker::start(
        &dir,
        &worker_env,
        std::env::temp_dir().join(format!("{stage}-python-worker.log")),
    )?;

    let deadline = Instant::now() + Duration::from_secs(120);
    let records = loop {
        let mut records = Vec::new();
        for id in [slow, quick, invalid] {
            records.push(api.get(id).await?);
        }
        if records.iter().all(|r| r.status.is_terminal()) {
            break records;
        }
        if Instant::now() > deadline {
            bail!(
                "not all ended: {:?}\nworker log:\n{}",
                records
                    .iter()
                    .map(|r| (r.id, r.status, r.step, r.attempt))
                    .collect::<Vec<_>>(),
                std::fs::read_to_string(&worker.log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };

    let log_file = worker.log.clone();
    let log = || std::fs::read_to_string(&log_file).unwrap_or_default();
    let expected = [
        json!({"orderId": "o-slow", "packSecs": 5, "reservedOnAttempt": 2, "packed": true}),
        json!({"orderId": "o-quick", "reservedOnAttempt": 2, "packed": true}),
    ];
    for (record, expected) in records[..2].iter().zip(expected) {
        let order = &expected["orderId"];
        assert_eq!(
            record.status,
            Status::Succeeded,
            "{order}: {record:?}\n{}",
            log()
        );
        let result = record.result.as_ref().map(|r| r.value().clone());
        assert_eq!(
            result,
            Some(expected.clone()),
            "{order}: reserved on its second attempt, then packed"
        );
    }
    let failed = &records[2];
    assert_eq!(failed.status, Status::Failed);
    let error = failed
        .error
        .as_ref()
        .expect("a failed execution has its error");
    assert_eq!(
        (failed.step, failed.attempt, error.code.as_str()),
        (0, 1, "INVALID_ORDER"),
        "a non-retryable failure ends the execution at its first attempt"
    );

    // Step code ran once per launch: the duplicate delivery did not run it again.
    let ran = worker.events("step.ran");
    let mut per_launch: BTreeMap<String, usize> = BTreeMap::new();
    for event in &ran {
        *per_launch
            .entry(event["launchId"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
    }
    assert!(
        per_launch.values().all(|&n| n == 1),
        "a launch ran twice: {per_launch:?}\n{}",
        log()
    );
    assert!(
        per_launch.contains_key(&duplicated),
        "the duplicated launch ran"
    );
    // The copy is recognised either after the first reply (answered from memory: "duplicate") or
    // while the first delivery still runs, both in one batch ("duplicate.running": left to it).
    assert!(
        ["duplicate", "duplicate.running"]
            .iter()
            .flat_map(|event| worker.events(event))
            .any(|e| e["launchId"] == duplicated.as_str()),
        "the duplicate delivery was recognised\n{}",
        log()
    );
    // validate ×3, reserve ×2 ×2, pack ×2: eleven launches in all.
    let steps = |id: &str| ran.iter().filter(|e| e["stepId"] == id).count();
    assert_eq!(
        (steps("validate"), steps("reserve"), steps("pack")),
        (3, 4, 2),
        "{}",
        log()
    );
    assert!(
        !worker.events("heartbeat").is_empty(),
        "the slow step sent heartbeats\n{}",
        log()
    );
    // Nothing was dead-lettered: the worker's DLQ and the coordinator's reply DLQ are empty.
    for dlq in [
        env["REQUEST_DLQ_URL"].as_str(),
        local.stack.queue("ReplyDeadLetterQueue")?.1,
    ] {
        let attributes = sqs
            .get_queue_attributes()
            .queue_url(dlq)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await?;
        let depth = attributes
            .attributes()
            .and_then(|a| {
                a.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            })
            .cloned()
            .unwrap_or_default();
        assert_eq!(depth, "0", "{dlq} holds dead letters");
    }

    // Its lifecycle: it announced itself, serving release 1 from its queue.
    let workers = || -> Result<Vec<Value>> {
        Ok(serde_json::from_str(&staged(&[
            "--json",
            "workers",
            "--pipeline",
            "py-orders",
        ])?)?)
    };
    let listed = workers()?;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (
            &listed[0]["health"],
            &listed[0]["releaseVersion"],
            &listed[0]["queue"]
        ),
        (&json!("HEALTHY"), &json!("1"), &json!(queue))
    );
    // Activating a release no live worker serves warns; release 1 is served.
    staged(&["releases", "register", "--file", &file, "--release", "2"])?;
    // The same file as release 2: no contract change, but the same queue, which pinned executions of
    // release 1 would share with release 2's workers.
    let diff: Value = serde_json::from_str(&staged(&[
        "releases",
        "--pipeline",
        "py-orders",
        "diff",
        "1",
        "2",
    ])?)?;
    assert_eq!(
        (
            &diff["contractChanged"],
            &diff["steps"],
            &diff["pinned"]["affected"],
            &diff["pinned"]["sharedQueues"]
        ),
        (&json!(false), &json!([]), &json!(true), &json!([queue]))
    );
    let activate = |release: &str| {
        run(
            cli,
            &[
                "--stage",
                &stage,
                "releases",
                "--pipeline",
                "py-orders",
                "activate",
                release,
            ],
        )
    };
    let warned = activate("2");
    assert!(warned.status.success());
    assert!(
        String::from_utf8_lossy(&warned.stderr)
            .contains("warning: no live worker serves py-orders release 2"),
        "{}",
        String::from_utf8_lossy(&warned.stderr)
    );
    let quiet = activate("1");
    assert!(quiet.status.success());
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("warning"));

    // Told to stop, it drains: submissions pinned to release 1 are refused with a typed error.
    let mut worker = worker;
    assert!(worker.terminate()?.success(), "{}", log());
    let deadline = Instant::now() + Duration::from_secs(60);
    while workers()?[0]["health"] != json!("DRAINING") {
        if Instant::now() > deadline {
            bail!("the worker's draining was not recorded: {:?}", workers()?);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let refused = run(
        cli,
        &[
            "--stage",
            &stage,
            "submit",
            "--pipeline",
            "py-orders",
            "--tenant",
            "python",
            "--input",
            r#"{"orderId": "o-late"}"#,
        ],
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("draining"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    Ok(())
}

/// The Python runtime's own checks on the emulator, case by case from docs/protocol.md: identity
/// mismatches dead-lettered with their attributes, claim-checked inputs and outputs, cancel notices,
/// cut error messages, crashes, the Lambda handler's partial batch failures.
#[test]
fn the_python_runtime_passes_its_protocol_checks() {
    stepline_local::needs_emulator!();
    let out = Command::new(python())
        .arg("examples/python-worker/test_runtime.py")
        .current_dir(workspace_root())
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");
}

//! What the process tests share: the emulator check, `stepline-local run` processes and the operator
//! CLI's binary. Each test binary uses a part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use stepline::domain::Execution;
use stepline::Coordinator;
use uuid::Uuid;

/// A `stepline-local run --stage <stage> <args>` process logging JSON lines to a file; killed
/// (SIGKILL) when dropped.
pub struct RunProcess {
    child: Child,
    log: PathBuf,
}

impl RunProcess {
    pub fn start(stage: &str, tag: &str, args: &[&str]) -> Result<Self> {
        let log = std::env::temp_dir().join(format!("{stage}-{tag}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_stepline-local"))
            .args(["run", "--stage", stage])
            .args(args)
            .env("RUST_LOG", "info")
            .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        Ok(Self { child, log })
    }

    /// Starts a runner and waits until it has provisioned the stage, registered its releases and
    /// started its functions.
    pub fn started(stage: &str, tag: &str, args: &[&str]) -> Result<Self> {
        let mut process = Self::start(stage, tag, args)?;
        let timeout = Duration::from_secs(60);
        let deadline = Instant::now() + timeout;
        loop {
            let log = std::fs::read_to_string(&process.log).unwrap_or_default();
            if log.contains("running stage") {
                return Ok(process);
            }
            if let Some(status) = process.child.try_wait()? {
                bail!("the runner exited ({status}):\n{log}");
            }
            ensure!(
                Instant::now() < deadline,
                "the runner did not start within {timeout:?}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the process where it stands (SIGSTOP): it holds its leases and in-flight messages, and
    /// carries on from the same point on [`RunProcess::resume`], like a stalled Lambda invocation.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Lets a paused process go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let _ = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status();
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }

    /// The address of the HTTP API the runner serves (`--api`), from its log.
    pub fn api_address(&self) -> Option<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("api http://").map(str::to_string))
    }

    /// Log lines (JSON) whose message is `message`.
    pub fn events(&self, message: &str) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["message"] == message)
            .collect()
    }
}

impl Drop for RunProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `binary <args>` to its end.
pub fn run(binary: &str, args: &[&str]) -> Output {
    Command::new(binary)
        .args(args)
        .output()
        .expect("the binary runs")
}

/// The operator CLI (`stepline`, package stepline-cli), built before the tests.
pub fn stepline_binary() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = stepline_local::binaries::path("stepline").expect("the CLI was built");
        path.to_string_lossy().into_owned()
    })
}

/// Waits until every execution is terminal, asking every `poll`.
pub async fn wait_all(
    api: &Coordinator,
    ids: &[Uuid],
    timeout: Duration,
    poll: Duration,
) -> Result<Vec<Execution>> {
    let records = wait_for(api, ids, timeout, poll, |r| r.status.is_terminal()).await?;
    let open: Vec<_> = records
        .iter()
        .filter(|r| !r.status.is_terminal())
        .map(|r| (r.id, r.status, r.step))
        .collect();
    if !open.is_empty() {
        bail!("not finished within {timeout:?}: {open:?}");
    }
    Ok(records)
}

/// Waits until every execution is at rest: terminal, and off the due index (a failed execution's
/// dead letter, sent after its end, confirmed). Returns the records as they are at the deadline
/// otherwise, for the caller to judge.
pub async fn wait_at_rest(
    api: &Coordinator,
    ids: &[Uuid],
    timeout: Duration,
    poll: Duration,
) -> Result<Vec<Execution>> {
    wait_for(api, ids, timeout, poll, |r| {
        r.status.is_terminal() && r.due_at().is_none()
    })
    .await
}

/// Asks for every execution's record every `poll` until each satisfies `done` or `timeout` passes;
/// returns the last records read.
async fn wait_for(
    api: &Coordinator,
    ids: &[Uuid],
    timeout: Duration,
    poll: Duration,
    done: impl Fn(&Execution) -> bool,
) -> Result<Vec<Execution>> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut records = Vec::new();
        for id in ids {
            records.push(api.get(*id).await?);
        }
        if records.iter().all(&done) || Instant::now() > deadline {
            return Ok(records);
        }
        tokio::time::sleep(poll).await;
    }
}

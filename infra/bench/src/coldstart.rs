//! P4: the function binaries as Lambda runs them. Each binary starts under a loopback Runtime API with
//! its environment from the template; init time is process start to its first `next`, then it handles a
//! real event (an execution is carried through launch, worker, completion, claim, the HTTP API and the
//! operator function) and its peak RSS is read from the kernel.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::Serialize;
use stepline_local::runtime_api::{fixture, sqs_event, Function};
use stepline_local::stack::Physical;
use stepline_local::{fresh_stage, workspace_root, LocalStack};

/// The example pipeline the binaries are driven with (examples/order-worker).
const ORDERS: &str = "orders";

/// The deployed binaries and the template functions they serve.
pub const BINARIES: [(&str, &str); 8] = [
    ("launch", "LaunchFunction"),
    ("order-worker", "OrderWorkerFunction"),
    ("completion", "CompletionFunction"),
    ("claim", "ClaimFunction"),
    ("api", "ApiFunction"),
    ("redrive", "RedriveFunction"),
    ("restaurant-approval", "RestaurantWorkerFunction"),
    ("csv-payments", "CsvWorkerFunction"),
];

#[derive(Debug, Clone, Default, Serialize)]
pub struct BinaryFigures {
    pub binary: String,
    pub bytes: u64,
    /// Init time of each run, milliseconds.
    pub init_ms: Vec<f64>,
    pub init_ms_median: f64,
    /// Peak resident set over the runs, after handling an event (KiB).
    pub peak_rss_kib: u64,
    /// Whether the binary handled an event before its RSS was read.
    pub handled_event: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ColdStart {
    pub profile_dir: String,
    pub binaries: Vec<BinaryFigures>,
    pub init_ms_max: f64,
    pub binary_mb_max: f64,
    pub rss_mb_max: f64,
}

/// Runs every binary in `dir` `runs` times.
pub async fn measure(dir: &Path, runs: usize) -> Result<ColdStart> {
    for (binary, _) in BINARIES {
        if !dir.join(binary).is_file() {
            bail!(
                "{} is missing: build the release binaries first (cargo build --release --bins)",
                dir.join(binary).display()
            );
        }
    }
    let local = LocalStack::up(&fresh_stage("bench-cold")).await?;
    let (queue, _) = local.stack.queue("OrderRequestQueue")?;
    local.release_example(queue, "1", 60).await?;
    let env = |function: &str| -> Result<BTreeMap<String, String>> {
        let mut env = local.stack.function(function)?.env.clone();
        for (key, value) in std::env::vars() {
            if key.starts_with("AWS_") {
                env.insert(key, value);
            }
        }
        env.insert("RUST_LOG".into(), "warn".into());
        if function == "CsvWorkerFunction" {
            env.insert("WORKER_PIPELINE".into(), "csv-payments".into());
        }
        Ok(env)
    };
    let arn = |logical: &str| -> Result<String> {
        match local.stack.resources.get(logical) {
            Some(Physical::Queue { arn, .. }) => Ok(arn.clone()),
            _ => bail!("no queue {logical}"),
        }
    };
    let mut figures: BTreeMap<&str, BinaryFigures> = BTreeMap::new();
    for _ in 0..runs.max(1) {
        // One at a time, as Lambda gives each new environment its own share of a CPU.
        let mut started: BTreeMap<&str, Function> = BTreeMap::new();
        for (binary, function) in BINARIES {
            let f = Function::start(&dir.join(binary), &env(function)?).await?;
            wait_init(&f).await?;
            started.insert(binary, f);
        }
        // One execution through the binaries, as Lambda would deliver it (what the previous run left
        // behind, the next step's request and the cancel notice, is cleared first).
        for queue in ["OrderRequestQueue", "ReplyQueue"] {
            local.take_all(queue).await?;
        }
        let mut handled = Vec::new();
        let event = stepline_local::start_event(
            &uuid::Uuid::new_v4().to_string(),
            serde_json::json!({"pipelineId": ORDERS, "tenant": "bench", "input": {"orderId": "o-1", "lines": [{"sku": "tea", "qty": 1, "unitCents": 300}]}}),
        );
        let mut id = None;
        for (name, queue) in [
            ("launch", "StartQueue"),
            ("order-worker", "OrderRequestQueue"),
            ("completion", "ReplyQueue"),
        ] {
            let body = match queue {
                "StartQueue" => event.to_string(),
                _ => take_one(&local, queue).await?,
            };
            if queue == "OrderRequestQueue" {
                let request: serde_json::Value = serde_json::from_str(&body)?;
                id = request["header"]["executionId"]
                    .as_str()
                    .map(str::to_string);
            }
            let answer = started
                .get_mut(name)
                .expect("started above")
                .invoke(sqs_event(&body, &arn(queue)?)?)
                .await?;
            if answer["batchItemFailures"] != serde_json::json!([]) {
                bail!("{name} did not process {body}: {answer}");
            }
            handled.push(name);
        }
        let id = id.as_deref().unwrap_or_default();
        for (binary, event) in [
            ("claim", fixture("scheduled-event.json", &[])?),
            (
                "api",
                fixture("function-url-get-execution.json", &[("EXECUTION_ID", id)])?,
            ),
            (
                "redrive",
                fixture("operator-cancel.json", &[("EXECUTION_ID", id)])?,
            ),
        ] {
            let function = started.get_mut(binary).expect("started above");
            function.invoke(event).await?;
            handled.push(binary);
        }
        for (binary, f) in &started {
            let binary = *binary;
            let entry = figures.entry(binary).or_insert_with(|| BinaryFigures {
                binary: binary.to_string(),
                bytes: std::fs::metadata(dir.join(binary))
                    .map(|m| m.len())
                    .unwrap_or(0),
                ..BinaryFigures::default()
            });
            entry.init_ms.push(f.init_ms().unwrap_or(f64::NAN));
            entry.peak_rss_kib = entry.peak_rss_kib.max(f.peak_rss_kib().unwrap_or(0));
            entry.handled_event = handled.contains(&binary);
        }
    }
    let shown = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let root = workspace_root()
        .canonicalize()
        .unwrap_or_else(|_| workspace_root());
    let mut out = ColdStart {
        profile_dir: shown
            .strip_prefix(&root)
            .unwrap_or(&shown)
            .display()
            .to_string(),
        ..ColdStart::default()
    };
    for (_, mut f) in figures {
        let mut sorted = f.init_ms.clone();
        sorted.sort_by(f64::total_cmp);
        f.init_ms_median = sorted[sorted.len() / 2];
        out.init_ms_max = out.init_ms_max.max(f.init_ms_median);
        // Megabytes of 10^6 bytes (the stricter reading of the targets).
        out.binary_mb_max = out.binary_mb_max.max(f.bytes as f64 / 1e6);
        out.rss_mb_max = out.rss_mb_max.max(f.peak_rss_kib as f64 * 1024.0 / 1e6);
        out.binaries.push(f);
    }
    Ok(out)
}

/// The message the previous binary left on `queue` (polled until it is visible).
async fn take_one(local: &LocalStack, queue: &str) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(body) = local.take_all(queue).await?.into_iter().next() {
            return Ok(body);
        }
        if Instant::now() > deadline {
            bail!("nothing arrived on {queue} within 30 s");
        }
    }
}

async fn wait_init(f: &Function) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while f.init_ms().is_none() {
        if Instant::now() > deadline {
            bail!("{} did not ask for an event within 30 s", f.name);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// The default directory of release binaries.
pub fn release_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("release")
}

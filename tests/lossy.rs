//! Behind a lossy network: the functions' calls to DynamoDB, SQS, EventBridge and S3 go through a
//! fault-injecting proxy (infra/lossy.sh: responses of applied writes killed, throttling and 5xx
//! answered in each service's protocol without forwarding, delays), while Lambda's event sources
//! and the checks read the emulator directly. Step timeouts are 300 s and the run must end well
//! before them: nothing here is recovered by a deadline.
//!
//! The checks: every execution SUCCEEDS with one write per hop (its version is the happy path's: no
//! write applied twice), each step ran under its first attempt's launch id only, nothing is in any
//! dead-letter queue, and the time from each lost write response or failed send to the next
//! request's send (read from the proxy's log) stays under 10 s at p99.
//!
//! Two more tests arm one fault each on top of the random ones, on one execution: every attempt of
//! its commit losing its response, and every attempt of its next request's send failing. Each must
//! recover in under 10 s (the reply comes back within seconds and re-sends), not at the deadline.
//!
//! Runs in the `lossy` lane of the full tier (`infra/test.sh --full`), which starts the proxy.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use order_worker::OrderSteps;
use serde_json::Value;
use stepline::domain::{launch_id, Status, StepError};
use stepline::envelope::RequestHeader;
use stepline::worker::StepFunction;
use stepline_suite::TestStack;
use uuid::Uuid;

/// Executions run at once.
const EXECUTIONS: usize = 30;
/// Writes per execution of the three-step pipeline without retries: its create and three replies.
const HAPPY_PATH_VERSION: u64 = 4;
/// Every step's timeout: far beyond the run, so that no deadline recovers anything.
const STEP_TIMEOUT_SECS: u32 = 300;

/// Runs the order steps, recording each (execution, step, launch id) it was asked to run.
#[derive(Default)]
struct Recorded(Mutex<BTreeSet<(Uuid, u32, Uuid)>>);

#[async_trait]
impl StepFunction for Recorded {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        self.0.lock().expect("runs").insert((
            request.execution_id,
            request.step_index,
            request.launch_id,
        ));
        OrderSteps.run(request, input).await
    }
}

/// Holds step 0 until released; runs the order steps (recording them) otherwise.
struct Gated {
    runs: Recorded,
    open: tokio::sync::watch::Receiver<bool>,
}

#[async_trait]
impl StepFunction for Gated {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        if request.step_index == 0 {
            let mut open = self.open.clone();
            let _ = open.wait_for(|open| *open).await;
        }
        self.runs.run(request, input).await
    }
}

/// The proxy's endpoint and log, or None (the test is skipped) outside the lossy lane.
fn proxy() -> Option<(String, String)> {
    match (
        std::env::var("STEPLINE_LOSSY_ENDPOINT"),
        std::env::var("STEPLINE_LOSSY_LOG"),
    ) {
        (Ok(endpoint), Ok(log)) => Some((endpoint, log)),
        _ => {
            stepline_local::testing::skip(
                "runs in the lossy lane: STEPLINE_LOSSY_ENDPOINT is unset (infra/lossy.sh starts the proxy)",
            );
            None
        }
    }
}

/// A stack whose steps time out after 300 s and whose functions call the services through the proxy.
async fn lossy_stack(prefix: &str, endpoint: &str) -> Result<TestStack> {
    let stack = TestStack::new(prefix, |def| {
        for step in &mut def.steps {
            step.timeout_secs = STEP_TIMEOUT_SECS;
        }
    })
    .await?;
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .load()
        .await;
    stack.with_function_clients(stepline::aws::Clients::new(&sdk))
}

/// Arms a fault at the proxy (see infra/lossy_proxy.py).
fn arm(endpoint: &str, rule: Value) -> Result<()> {
    let out = std::process::Command::new("curl")
        .args(["-sS", "-f", "-X", "POST", "--data"])
        .arg(rule.to_string())
        .arg(format!("{endpoint}/__lossy/arm"))
        .output()
        .context("running curl")?;
    if !out.status.success() {
        bail!(
            "arming {rule} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn read_log(path: &str) -> Result<Vec<Logged>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(Logged::parse)
        .collect()
}

/// One line of the proxy's log.
#[derive(Debug)]
struct Logged {
    t: f64,
    service: String,
    op: String,
    fault: Option<String>,
    armed: bool,
    ids: Vec<String>,
    queue: Option<String>,
}

impl Logged {
    fn parse(line: &str) -> Result<Self> {
        let value: Value =
            serde_json::from_str(line).with_context(|| format!("log line {line}"))?;
        let text = |key: &str| value[key].as_str().map(str::to_string);
        Ok(Self {
            t: value["t"].as_f64().context("t")?,
            service: text("service").context("service")?,
            op: text("op").context("op")?,
            fault: text("fault"),
            armed: value["armed"].as_bool().unwrap_or(false),
            ids: value["ids"]
                .as_array()
                .map(|ids| {
                    ids.iter()
                        .filter_map(|id| id.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            queue: text("queue"),
        })
    }
}

impl Logged {
    fn is_send_to(&self, queue: &str) -> bool {
        self.service == "sqs"
            && self.op.starts_with("SendMessage")
            && self.queue.as_deref() == Some(queue)
    }

    /// Whether the request reached the queue (answered, or applied with its response killed).
    fn applied(&self) -> bool {
        self.fault.as_deref() != Some("error")
    }
}

/// Nearest-rank percentile of sorted seconds.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// Times from each fault that lost a commit's response or a request's send (of an execution of
/// `ids`) to the next request of that execution reaching `queue`: (lost write responses, failed
/// sends). A fault followed by no request (the last step's commit) is not counted.
fn recoveries(log: &[Logged], ids: &BTreeSet<String>, queue: &str) -> (Vec<f64>, Vec<f64>) {
    let (mut writes, mut sends) = (Vec::new(), Vec::new());
    for (at, entry) in log.iter().enumerate() {
        let lost_write = entry.service == "dynamodb"
            && entry.fault.as_deref() == Some("kill")
            && matches!(
                entry.op.as_str(),
                "PutItem" | "UpdateItem" | "TransactWriteItems"
            );
        let failed_send = entry.is_send_to(queue) && entry.fault.as_deref() == Some("error");
        if !(lost_write || failed_send) {
            continue;
        }
        for id in entry.ids.iter().filter(|id| ids.contains(*id)) {
            let next = log[at + 1..]
                .iter()
                .find(|later| later.is_send_to(queue) && later.applied() && later.ids.contains(id));
            if let Some(next) = next {
                let took = next.t - entry.t;
                if lost_write {
                    writes.push(took);
                } else {
                    sends.push(took);
                }
            }
        }
    }
    writes.sort_by(f64::total_cmp);
    sends.sort_by(f64::total_cmp);
    (writes, sends)
}

fn figures(name: &str, sorted: &[f64]) -> Value {
    if sorted.is_empty() {
        return serde_json::json!({ "case": name, "count": 0 });
    }
    serde_json::json!({
        "case": name,
        "count": sorted.len(),
        "p50_s": percentile(sorted, 50.0),
        "p99_s": percentile(sorted, 99.0),
        "max_s": sorted[sorted.len() - 1],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_network_that_loses_responses_every_execution_succeeds_once_per_step_and_recovers_in_seconds(
) -> Result<()> {
    stepline_local::needs_emulator!();
    let Some((endpoint, log_path)) = proxy() else {
        return Ok(());
    };
    let mut stack = lossy_stack("lossy", &endpoint).await?;
    let runs = Arc::new(Recorded::default());
    stack.start(runs.clone())?;
    let (queue, _) = stack.local.stack.queue("OrderRequestQueue")?;
    let queue = queue.to_string();
    let began = Instant::now();
    // Submits go through the lossy network too (the submit function's calls): a submit whose
    // response was lost is retried with its idempotency key, as a caller would.
    let mut ids = Vec::with_capacity(EXECUTIONS);
    for n in 0..EXECUTIONS {
        // Keys of this run only: an execution's id derives from its key.
        let key = format!("lossy-{}", Uuid::new_v4());
        ids.push(
            stack
                .submit_keyed(order_worker::sample_order(n), &key)
                .await?,
        );
    }

    // Well before any step deadline (300 s): nothing may wait for one.
    let deadline = Duration::from_secs(150);
    let mut records = BTreeMap::new();
    for id in &ids {
        let left = deadline
            .saturating_sub(began.elapsed())
            .max(Duration::from_secs(1));
        let record = stack
            .wait_for(*id, left, |r| r.status.is_terminal())
            .await?;
        records.insert(*id, record);
    }
    let elapsed = began.elapsed();

    for (id, record) in &records {
        assert_eq!(record.status, Status::Succeeded, "{id}: {record:#?}");
        assert_eq!(
            (record.version, record.resends),
            (HAPPY_PATH_VERSION, 0),
            "{id}: one write per hop, and no deadline re-send"
        );
    }
    let runs = runs.0.lock().expect("runs").clone();
    for id in &ids {
        let launches: BTreeSet<(u32, Uuid)> = runs
            .iter()
            .filter(|(execution, ..)| execution == id)
            .map(|(_, step, launch)| (*step, *launch))
            .collect();
        let expected: BTreeSet<(u32, Uuid)> = (0..3).map(|s| (s, launch_id(*id, s, 1))).collect();
        assert_eq!(
            launches, expected,
            "{id}: each step under its first attempt's launch id"
        );
    }
    for dlq in [
        "ExecutionDeadLetterQueue",
        "LaunchDeadLetterQueue",
        "ReplyDeadLetterQueue",
        "StartDeadLetterQueue",
        "OrderRequestDeadLetterQueue",
    ] {
        assert_eq!(stack.queue_depth(dlq).await?, 0, "{dlq} is empty");
    }

    let log = read_log(&log_path)?;
    let faults = log.iter().filter(|l| l.fault.is_some()).count();
    let kills = log
        .iter()
        .filter(|l| l.fault.as_deref() == Some("kill"))
        .count();
    if kills == 0 {
        bail!(
            "the proxy killed no response in {} requests: the lane tested nothing",
            log.len()
        );
    }
    let names: BTreeSet<String> = ids.iter().map(Uuid::to_string).collect();
    let (writes, sends) = recoveries(&log, &names, &queue);
    let all: Vec<f64> = {
        let mut all = [writes.clone(), sends.clone()].concat();
        all.sort_by(f64::total_cmp);
        all
    };
    let report = serde_json::json!({
        "executions": EXECUTIONS,
        "step_timeout_s": STEP_TIMEOUT_SECS,
        "elapsed_s": elapsed.as_secs_f64(),
        "requests": log.len(),
        "faults": faults,
        "killed_responses": kills,
        "recovery": [
            figures("lost write response", &writes),
            figures("failed send", &sends),
            figures("all", &all),
        ],
    });
    let out = stepline_local::workspace_root().join("target/lossy");
    std::fs::create_dir_all(&out)?;
    std::fs::write(
        out.join("recovery.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    stepline_local::testing::say(&format!("lossy: {report}"));
    assert!(
        !all.is_empty(),
        "no lost write or failed send was followed by a request: {report}"
    );
    let p99 = percentile(&all, 99.0);
    assert!(
        p99 < 10.0,
        "recovery p99 {p99:.2} s is not under 10 s: {report}"
    );
    Ok(())
}

/// The time from the first armed fault on execution `id` to the next request of `id` that reached
/// `queue`.
fn recovery_after_armed(log: &[Logged], id: Uuid, queue: &str) -> Result<f64> {
    let id = id.to_string();
    let at = log
        .iter()
        .position(|l| l.armed && l.ids.contains(&id))
        .context("the armed fault never happened")?;
    let next = log[at + 1..]
        .iter()
        .find(|l| l.is_send_to(queue) && l.applied() && !l.armed && l.ids.contains(&id))
        .context("no request followed the armed fault")?;
    Ok(next.t - log[at].t)
}

/// Submits one execution with step 0 held, arms `rule` (naming the execution's id as `id`), lets
/// step 0 run, and checks that the execution SUCCEEDS once per step, and that the request after the
/// armed fault went out in under 10 s.
async fn recovers_from_an_armed_fault(
    prefix: &str,
    rule: impl Fn(&TestStack, Uuid) -> Result<Value>,
) -> Result<()> {
    let Some((endpoint, log_path)) = proxy() else {
        return Ok(());
    };
    let mut stack = lossy_stack(prefix, &endpoint).await?;
    let (release, open) = tokio::sync::watch::channel(false);
    let steps = Arc::new(Gated {
        runs: Recorded::default(),
        open,
    });
    stack.start(steps.clone())?;
    let key = format!("{prefix}-{}", Uuid::new_v4());
    let id = stack
        .submit_keyed(order_worker::sample_order(1), &key)
        .await?;
    stack
        .wait_for(id, Duration::from_secs(60), |r| {
            r.step == 0 && r.launch_id.is_some()
        })
        .await?;
    arm(&endpoint, rule(&stack, id)?)?;
    release.send(true)?;

    // Well before the 300 s deadline.
    let record = stack
        .wait_for(id, Duration::from_secs(120), |r| r.status.is_terminal())
        .await?;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    assert_eq!(
        (record.version, record.resends),
        (HAPPY_PATH_VERSION, 0),
        "one write per hop, no deadline re-send"
    );
    let launches: BTreeSet<(u32, Uuid)> = steps
        .runs
        .0
        .lock()
        .expect("runs")
        .iter()
        .map(|(_, step, launch)| (*step, *launch))
        .collect();
    let expected: BTreeSet<(u32, Uuid)> = (0..3).map(|s| (s, launch_id(id, s, 1))).collect();
    assert_eq!(
        launches, expected,
        "each step under its first attempt's launch id"
    );
    let (queue, _) = stack.local.stack.queue("OrderRequestQueue")?;
    let took = recovery_after_armed(&read_log(&log_path)?, id, queue)?;
    stepline_local::testing::say(&format!(
        "lossy: {prefix}: the next request went out {took:.2} s after the fault"
    ));
    assert!(took < 10.0, "recovered after {took:.2} s, not under 10 s");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_every_attempt_lost_its_response_sends_the_next_request_within_seconds(
) -> Result<()> {
    stepline_local::needs_emulator!();
    // The SDK makes three attempts: the first applies, the next two meet its condition; all three
    // answers are lost, so the completion cannot know, and leaves the reply to come back.
    recovers_from_an_armed_fault("lossy-write", |_, id| {
        Ok(serde_json::json!({
            "service": "dynamodb", "op": "PutItem", "id": id, "fault": "kill", "count": 3
        }))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_whose_every_attempt_failed_after_its_commit_goes_out_within_seconds() -> Result<()>
{
    stepline_local::needs_emulator!();
    // Every attempt of the send of step 1's request is answered with throttling or a 5xx, after
    // the commit that launched it.
    recovers_from_an_armed_fault("lossy-send", |stack, id| {
        let (queue, _) = stack.local.stack.queue("OrderRequestQueue")?;
        Ok(serde_json::json!({
            "service": "sqs", "op": "SendMessageBatch", "queue": queue, "id": id,
            "fault": "error", "count": 3
        }))
    })
    .await
}

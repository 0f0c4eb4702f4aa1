//! The fault campaign on the emulator, with real processes: two `stepline-local run` processes per
//! role (claim, launch, completion, worker) over one stage, and rounds (20 in the full tier, 6 in the
//! quick one) in which a random process is
//! killed (SIGKILL, then started again) or paused (SIGSTOP, then SIGCONT after up to seven seconds:
//! longer than the lease, so a paused sweeper or launcher comes back a zombie holder). Executions are
//! submitted before and during the rounds; some are invalid orders, planned to fail at their first step.
//! Afterwards the campaign's end-state checker (`stepline_sim::judge_end`) judges every execution from
//! its item and the execution DLQ, and nothing may be lost: every queue drained, no DLQ holding a
//! message. The run's seed (`STEPLINE_SEED`, fresh and printed when unset) chooses the rounds' victims
//! (timing is the machine's).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::{json, Value};
use stepline::domain::{launch_id, Execution};
use stepline::{Coordinator, SubmitRequest};
use stepline_local::{fresh_stage, LocalStack};
use stepline_sim::{judge_end, End};
use uuid::Uuid;

mod support;

use support::{wait_all, wait_at_rest, RunProcess};

/// How often a wait asks for the executions' records.
const POLL: Duration = Duration::from_millis(250);

const PARAMS: [(&str, &str); 2] = [("LeaseSeconds", "5"), ("QueueVisibilitySeconds", "10")];
const STEP_TIMEOUT_SECS: u32 = 20;
const ROLES: [&str; 4] = ["claim", "launch", "completion", "worker"];
const EXECUTIONS: usize = 40;
const QUEUES: [&str; 3] = ["LaunchQueue", "ReplyQueue", "OrderRequestQueue"];
const DLQS: [&str; 3] = [
    "LaunchDeadLetterQueue",
    "ReplyDeadLetterQueue",
    "OrderRequestDeadLetterQueue",
];

/// Execution `n`'s order: every fifth has a line without a quantity (planned to fail at `validate`).
fn order(n: usize) -> Value {
    let mut order = order_worker::sample_order(n);
    if n % 5 == 4 {
        order["lines"][0]["qty"] = json!(0);
    }
    order
}

fn expected(n: usize) -> End {
    if n % 5 == 4 {
        End::Failed {
            step: 0,
            code: "INVALID_ORDER".into(),
        }
    } else {
        End::Succeeded
    }
}

fn runner(stage: &str, role: &str, tag: &str) -> Result<RunProcess> {
    let params: Vec<String> = PARAMS.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let timeout = STEP_TIMEOUT_SECS.to_string();
    let mut args = vec![
        "--step-timeout-secs",
        &timeout,
        "--worker-delay-ms",
        "100",
        "--functions",
        role,
    ];
    for param in &params {
        args.extend(["--param", param]);
    }
    RunProcess::start(stage, tag, &args)
}

async fn submit(api: &Coordinator, n: usize) -> Result<Uuid> {
    let request = SubmitRequest {
        pipeline_id: order_worker::PIPELINE_ID.into(),
        tenant: "campaign".into(),
        input: order(n),
        ..Default::default()
    };
    Ok(api.submit(request).await?.execution)
}

/// Waits until the work queues are drained (duplicates and late copies consumed).
async fn drained(local: &LocalStack, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut left = BTreeMap::new();
        for queue in QUEUES {
            let depth = local.queue_depth(queue).await?;
            if depth > 0 {
                left.insert(queue, depth);
            }
        }
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("messages left on the work queues: {left:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A successful execution's result: the order's total, and the confirmation of the launch its last
/// step's outcome came from.
fn result_violations(record: &Execution, n: usize) -> Vec<String> {
    let mut violations = Vec::new();
    let order = order(n);
    let total = order_worker::total_cents(&order);
    let result = record.result.as_ref().map(|r| r.value().clone());
    let receipt = record.steps.last().and_then(|s| s.receipt.as_ref());
    let confirmation = receipt.map(|r| format!("C-{}", &r.launch_id.simple().to_string()[..8]));
    let want = json!({
        "orderId": order["orderId"],
        "totalCents": total,
        "confirmation": confirmation,
    });
    if result.as_ref() != Some(&want) {
        violations.push(format!(
            "{} SUCCEEDED with {result:?}, expected {want}",
            record.id
        ));
    }
    violations
}

/// Each step's outcome was applied from a reply to one of that step's own launches.
fn receipt_violations(record: &Execution) -> Vec<String> {
    let mut violations = Vec::new();
    for (step, k) in record.steps.iter().zip(record.first_step..) {
        let Some(receipt) = step.receipt.as_ref() else {
            continue;
        };
        if !(1..=10).any(|a| receipt.launch_id == launch_id(record.id, k, a)) {
            violations.push(format!(
                "step {k} of {} applied from a foreign launch",
                record.id
            ));
        }
    }
    violations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_of_killed_and_paused_processes_end_every_execution_as_planned() -> Result<()> {
    stepline_local::needs_emulator!();
    let rounds: usize = stepline_local::testing::sized(6, 20);
    let seed = stepline_local::testing::seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let params: BTreeMap<String, String> = PARAMS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let local = LocalStack::up_with(&fresh_stage("campaign"), &params).await?;
    let stage = local.stack.stage.clone();
    let api = local.operator()?;
    let (queue, _) = local.stack.queue("OrderRequestQueue")?;
    local
        .release_example(queue, order_worker::RELEASE_VERSION, STEP_TIMEOUT_SECS)
        .await?;

    let mut processes: Vec<(&str, RunProcess)> = Vec::new();
    for role in ROLES {
        for i in 0..2 {
            processes.push((role, runner(&stage, role, &format!("{role}{i}"))?));
        }
    }
    let mut ids = Vec::new();
    for n in 0..EXECUTIONS / 2 {
        ids.push(submit(&api, n).await?);
    }
    let (mut kills, mut pauses) = (0, 0);
    for round in 0..rounds {
        tokio::time::sleep(Duration::from_millis(rng.u64(200..1_200))).await;
        let index = rng.usize(0..processes.len());
        let role = processes[index].0;
        if rng.bool() {
            kills += 1;
            processes[index].1.kill();
            processes[index].1 = runner(&stage, role, &format!("{role}-round{round}"))?;
        } else {
            pauses += 1;
            processes[index].1.pause();
            tokio::time::sleep(Duration::from_millis(rng.u64(1_000..7_000))).await;
            processes[index].1.resume();
        }
        // The second half of the executions arrives during the rounds.
        while ids.len() < EXECUTIONS / 2 + (round + 1) * EXECUTIONS / (2 * rounds) {
            let n = ids.len();
            ids.push(submit(&api, n).await?);
        }
    }
    eprintln!(
        "emulator campaign (seed {seed}): {rounds} rounds, {kills} processes killed, {pauses} paused, {} executions",
        ids.len()
    );

    wait_all(&api, &ids, Duration::from_secs(240), POLL).await?;
    drained(&local, Duration::from_secs(60)).await?;
    // A failed execution's dead letter goes out after its end (again from the sweeper when the
    // process that ended it was killed first): judge each execution once it is at rest.
    let records = wait_at_rest(&api, &ids, Duration::from_secs(120), POLL).await?;
    for (_, process) in &mut processes {
        process.kill();
    }

    let dead_letters = local.take_all("ExecutionDeadLetterQueue").await?;
    let dead_letters: Vec<&str> = dead_letters.iter().map(String::as_str).collect();
    let mut violations = Vec::new();
    for (n, record) in records.iter().enumerate() {
        violations.extend(judge_end(record, Some(&expected(n)), &dead_letters));
        violations.extend(receipt_violations(record));
        if expected(n) == End::Succeeded {
            violations.extend(result_violations(record, n));
        }
    }
    for dlq in DLQS {
        let depth = local.queue_depth(dlq).await?;
        if depth > 0 {
            violations.push(format!("{depth} messages in {dlq}: something was lost"));
        }
    }
    let failed = records
        .iter()
        .filter(|r| End::of(r) != Some(End::Succeeded))
        .count();
    eprintln!(
        "emulator campaign: {} executions ({} succeeded, {failed} failed as planned), {} violations",
        records.len(),
        records.len() - failed,
        violations.len()
    );
    assert!(violations.is_empty(), "{violations:#?}");
    Ok(())
}

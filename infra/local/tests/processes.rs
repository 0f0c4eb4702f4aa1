//! Crash tests with real processes on the local emulator: several `stepline-local run` processes
//! sweeping the same executions in parallel, and a runner killed with SIGKILL mid-run and restarted.
//! Every execution must end correct with nothing lost.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use stepline::domain::{launch_id, Execution, Status, StepStatus};
use stepline::{Coordinator, SubmitRequest};
use stepline_local::{fresh_stage, LocalStack};
use uuid::Uuid;

const PARAMS: [(&str, &str); 2] = [("LeaseSeconds", "5"), ("QueueVisibilitySeconds", "10")];
const STEP_TIMEOUT_SECS: &str = "15";

mod support;

use support::{wait_all, RunProcess};

/// How often a wait asks for the executions' records.
const POLL: Duration = Duration::from_millis(200);

/// A `stepline-local run` process with the test's parameters and step timeout, running `functions`
/// (all when empty).
fn runner(stage: &str, functions: &str, tag: &str, extra: &[&str]) -> Result<RunProcess> {
    let mut args = vec!["--step-timeout-secs", STEP_TIMEOUT_SECS];
    let params: Vec<String> = PARAMS.iter().map(|(k, v)| format!("{k}={v}")).collect();
    for param in &params {
        args.extend(["--param", param]);
    }
    if !functions.is_empty() {
        args.extend(["--functions", functions]);
    }
    args.extend(extra);
    RunProcess::start(stage, tag, &args)
}

async fn stack(prefix: &str) -> Result<(LocalStack, Coordinator)> {
    let params: BTreeMap<String, String> = PARAMS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let local = LocalStack::up_with(&fresh_stage(prefix), &params).await?;
    let api = local.operator()?;
    Ok((local, api))
}

/// Submits once the first process has registered the pipeline.
async fn submit(api: &Coordinator, n: usize) -> Result<Uuid> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let request = SubmitRequest {
            pipeline_id: order_worker::PIPELINE_ID.into(),
            tenant: "proc".into(),
            input: order_worker::sample_order(n),
            ..Default::default()
        };
        match api.submit(request).await {
            Ok(s) => return Ok(s.execution),
            Err(e) if Instant::now() < deadline && e.code() == "NO_ACTIVE_RELEASE" => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn assert_correct(record: &Execution, n: usize) {
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    let order = order_worker::sample_order(n);
    let expected: u64 = order["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["qty"].as_u64().unwrap() * l["unitCents"].as_u64().unwrap())
        .sum();
    let result = record.result.as_ref().unwrap().value();
    assert_eq!(result["orderId"], order["orderId"]);
    assert_eq!(result["totalCents"], expected);
    assert_eq!((record.first_step, record.steps.len()), (2, 1));
    assert!(record
        .steps
        .iter()
        .all(|s| s.status == StepStatus::Succeeded));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_claim_processes_take_each_lease_once_and_every_execution_finishes() -> Result<()>
{
    stepline_local::needs_emulator!();
    let (local, api) = stack("proc-claim").await?;
    let stage = local.stack.stage.clone();
    // Register what the processes register (identical, so theirs is a no-op), then submit before any
    // process runs and drop the first requests the submits sent: only the sweepers can recover these
    // executions (at their step deadline).
    let (queue, _) = local.stack.queue("OrderRequestQueue")?;
    local
        .release_example(
            queue,
            order_worker::RELEASE_VERSION,
            STEP_TIMEOUT_SECS.parse()?,
        )
        .await?;
    let mut ids = Vec::new();
    for n in 0..30 {
        ids.push(submit(&api, n).await?);
    }
    assert_eq!(local.take_all("OrderRequestQueue").await?.len(), ids.len());
    // One process runs launch, completion and the worker; three others only sweep.
    let mut workers = runner(&stage, "launch,completion,worker", "work", &[])?;
    let mut sweepers: Vec<RunProcess> = (0..3)
        .map(|i| runner(&stage, "claim", &format!("claim{i}"), &[]))
        .collect::<Result<_>>()?;

    let records = wait_all(&api, &ids, Duration::from_secs(90), POLL).await?;

    for s in &mut sweepers {
        s.kill();
    }
    workers.kill();
    for (n, record) in records.iter().enumerate() {
        assert_correct(record, n);
    }
    // Every lease taken shows as one generation step, whichever process took it: no two sweepers took
    // the same lease (a lost race is a conditional write that failed, never a second claim).
    let mut claims: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_process = Vec::new();
    for s in &sweepers {
        let events = s.events("lease taken");
        by_process.push(events.len());
        for e in events {
            *claims
                .entry(e["execution_id"].as_str().unwrap_or_default().to_string())
                .or_default() += 1;
        }
    }
    for record in &records {
        let taken = claims.get(&record.id.to_string()).copied().unwrap_or(0);
        assert!(taken >= 1, "{} was never claimed", record.id);
        assert_eq!(
            record.generation as usize, taken,
            "generation of {} disagrees with the leases the sweepers report",
            record.id
        );
    }
    for s in &sweepers {
        assert!(!s.events("claim run").is_empty(), "a sweeper never swept");
    }
    eprintln!("leases taken per sweeper process: {by_process:?}");
    for dlq in [
        "LaunchDeadLetterQueue",
        "ReplyDeadLetterQueue",
        "OrderRequestDeadLetterQueue",
    ] {
        assert_eq!(local.queue_depth(dlq).await?, 0, "{dlq} is not empty");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_with_sigkill_mid_run_and_restarted_finishes_every_execution() -> Result<()>
{
    stepline_local::needs_emulator!();
    let (local, api) = stack("proc-kill").await?;
    let stage = local.stack.stage.clone();
    let slow = ["--worker-delay-ms", "150"];
    // The first runner never finishes the last step, so however fast or slow the machine, the kill
    // comes while every execution is mid-run; the second runner finishes what it left.
    let held = ["--worker-delay-ms", "150", "--worker-hold-step", "confirm"];
    let mut first = runner(&stage, "", "first", &held)?;
    let mut ids = Vec::new();
    for n in 0..12 {
        ids.push(submit(&api, n).await?);
    }
    // Kill once some, not all, executions have advanced.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut advanced = 0;
        for id in &ids {
            let record = api.get(*id).await?;
            if record.step > 0 || record.status.is_terminal() {
                advanced += 1;
            }
        }
        if advanced >= 3 {
            break;
        }
        if Instant::now() > deadline {
            bail!("nothing advanced before the kill");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.kill();
    let unfinished = {
        let mut count = 0;
        for id in &ids {
            if !api.get(*id).await?.status.is_terminal() {
                count += 1;
            }
        }
        count
    };
    assert_eq!(
        unfinished,
        ids.len(),
        "an execution finished past a held step"
    );

    let _second = runner(&stage, "", "second", &slow)?;
    let records = wait_all(&api, &ids, Duration::from_secs(120), POLL).await?;

    for (n, record) in records.iter().enumerate() {
        assert_correct(record, n);
        for (step, k) in record.steps.iter().zip(record.first_step..) {
            // Each step's outcome was applied from a reply to one of its own launches.
            let receipt = step.receipt.as_ref().expect("receipt");
            assert!(
                (1..=5).any(|a| receipt.launch_id == launch_id(record.id, k, a)),
                "step {k} of {} applied from a foreign launch",
                record.id
            );
        }
    }
    for dlq in [
        "LaunchDeadLetterQueue",
        "ReplyDeadLetterQueue",
        "OrderRequestDeadLetterQueue",
    ] {
        assert_eq!(
            local.queue_depth(dlq).await?,
            0,
            "{dlq} is not empty: something was lost"
        );
    }
    Ok(())
}

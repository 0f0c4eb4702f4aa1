//! Fan-out children keep their identity across their parent's attempts: a parent whose fan-out step
//! failed is re-driven, and only the children that failed run again; those that succeeded tell the
//! parent's new attempt their result without running (no row is paid twice). Child ids derive from
//! the parent, the step and the item (`fan_out_child_id`), never from the attempt.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use stepline::domain::{fan_out_child_id, Execution, Status, StepError};
use stepline::envelope::RequestHeader;
use stepline::handlers::{self, RedriveRequest};
use stepline::worker::StepFunction;
use stepline::SubmitRequest;
use stepline_local::{fresh_stage, LocalStack, RunnerOptions};
use stepline_suite::wait_until;
use uuid::Uuid;

/// The csv example's steps, with `pay` counted per row: the rows on the `held` lines hold their first
/// run until `release` is set, the row on line 4 is declined while `declining` is set.
struct CountedPayments {
    runs: Mutex<BTreeMap<u64, u32>>,
    held: Vec<u64>,
    declining: AtomicBool,
    release: AtomicBool,
    /// Held rows fail (retryably) instead of holding their run, so no worker invocation stays open.
    bouncing: bool,
}

impl CountedPayments {
    fn new(held: &[u64], declining: bool) -> Arc<Self> {
        Arc::new(Self {
            runs: Mutex::default(),
            held: held.to_vec(),
            declining: AtomicBool::new(declining),
            release: AtomicBool::new(false),
            bouncing: false,
        })
    }

    /// Held rows bounce (fail retryably) until released.
    fn bouncing(held: &[u64], declining: bool) -> Arc<Self> {
        let mut steps = Arc::into_inner(Self::new(held, declining)).expect("the only reference");
        steps.bouncing = true;
        Arc::new(steps)
    }
}

const SLOW_LINE: u64 = 3;
const DECLINED_LINE: u64 = 4;

#[async_trait]
impl StepFunction for CountedPayments {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        if request.step_id != "pay" {
            return csv_payments::CsvSteps.run(request, input).await;
        }
        let line = input["line"].as_u64().unwrap_or_default();
        let run = {
            let mut runs = self.runs.lock().unwrap();
            let run = runs.entry(line).or_default();
            *run += 1;
            *run
        };
        let held = self.held.contains(&line) && !self.release.load(Ordering::SeqCst);
        if held && self.bouncing {
            return Err(StepError::new("HELD", "held until released", true));
        }
        while self.held.contains(&line) && run == 1 && !self.release.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if line == DECLINED_LINE && self.declining.load(Ordering::SeqCst) {
            return Err(StepError::new("DECLINED", "the bank said no", false));
        }
        csv_payments::CsvSteps.run(request, input).await
    }
}

/// What a batch runs on: the stack, its workers' runner, the operator's coordinator, and the batch.
type Batch = (
    LocalStack,
    stepline_local::Runner,
    stepline::Coordinator,
    Uuid,
);

/// A stack of the csv example with `steps` as both workers, the fan-out's children given
/// `fan_out_secs`; the batch of four rows (lines 2 to 5) submitted.
async fn batch_of_four(
    prefix: &str,
    steps: &Arc<CountedPayments>,
    fan_out_secs: u32,
) -> anyhow::Result<Batch> {
    let csv = "payee,iban,amount_cents\n\
        Ada Lovelace,GB33BUKB20201555555555,12500\n\
        Alan Turing,GB94BARC10201530093459,990\n\
        Grace Hopper,DE89370400440532013000,500\n\
        Barbara Liskov,FR1420041010050500013M02606,4200\n";
    batch_of(
        prefix,
        steps,
        |fan_out, _| fan_out.timeout_secs = fan_out_secs,
        csv,
    )
    .await
}

/// A CSV of `rows` payments, each within the bank's limit (row n on line n + 2).
fn csv_of(rows: usize) -> String {
    let mut csv = String::from("payee,iban,amount_cents\n");
    for n in 0..rows {
        csv.push_str(&format!("Payee {n},GB33BUKB20201555555555,{}\n", 100 + n));
    }
    csv
}

/// A stack of the csv example with `steps` as both workers, its fan-out step and its children's
/// step as `configure` leaves them; a batch of `csv` submitted.
async fn batch_of(
    prefix: &str,
    steps: &Arc<CountedPayments>,
    configure: impl FnOnce(&mut stepline::domain::StepDef, &mut stepline::domain::StepDef),
    csv: &str,
) -> anyhow::Result<Batch> {
    let local = LocalStack::up(&fresh_stage(prefix)).await?;
    let (batch_queue, _) = local.stack.queue("CsvRequestQueue")?;
    let (payment_queue, _) = local.stack.queue("PaymentRequestQueue")?;
    let mut batch = csv_payments::batch_pipeline(batch_queue);
    let mut payment = csv_payments::payment_pipeline(payment_queue);
    configure(&mut batch.steps[1], &mut payment.steps[0]);
    // The workers serve the contracts of the pipelines as configured (a retry policy is contract).
    let contracts = [&batch, &payment].map(stepline::domain::contract::Contract::of);
    for def in [batch, payment] {
        local.release(def, Vec::new()).await?;
    }
    // A held row keeps its worker invocation open: its batch's poller receives nothing more until
    // it returns. Lambda scales its pollers out; here there is one per held row at least, so the
    // rows run together however their requests were split into batches.
    let [batch_contract, payment_contract] = contracts;
    let runner = local.run_workers_with(
        vec![
            ("CsvWorkerFunction", batch_contract, steps.clone()),
            ("PaymentWorkerFunction", payment_contract, steps.clone()),
        ],
        RunnerOptions {
            pollers: RunnerOptions::default().pollers.max(steps.held.len()),
            ..RunnerOptions::default()
        },
    )?;
    let api = local.operator()?;
    let id = api
        .submit(SubmitRequest {
            pipeline_id: csv_payments::BATCH_PIPELINE.into(),
            tenant: "finance".into(),
            input: json!({ "csv": csv }),
            ..Default::default()
        })
        .await?
        .execution;
    Ok((local, runner, api, id))
}

/// The ids of the batch's four children (items 0 to 3 of its fan-out step).
fn children_of(parent: Uuid) -> Vec<Uuid> {
    (0..4)
        .map(|i| {
            let item = format!("item-{i}");
            fan_out_child_id("finance", csv_payments::PAYMENT_PIPELINE, parent, 1, &item)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_driven_fan_out_runs_only_the_children_that_did_not_succeed() -> anyhow::Result<()> {
    stepline_local::needs_emulator!();
    // The slow row holds its first run past the fan-out's deadline (4 s).
    let steps = CountedPayments::new(&[SLOW_LINE], true);
    let (_local, _runner, api, id) = batch_of_four("fanout", &steps, 4).await?;

    // The slow row keeps the fan-out past its deadline: the batch fails with AWAIT_TIMEOUT.
    let failed = wait_for(&api, id, Duration::from_secs(90), |r| {
        r.status.is_terminal()
    })
    .await?;
    assert_eq!(failed.status, Status::Failed, "{failed:#?}");
    assert_eq!(
        failed.error.as_ref().map(|e| e.code.as_str()),
        Some("AWAIT_TIMEOUT")
    );
    assert_eq!(failed.step, 1, "failed at the fan-out");

    // The slow row finishes; every child ends: three paid, one declined.
    steps.release.store(true, Ordering::SeqCst);
    let mut ended = Vec::new();
    for child in &children_of(id) {
        ended.push(
            wait_for(&api, *child, Duration::from_secs(60), |r| {
                r.status.is_terminal()
            })
            .await?
            .status,
        );
    }
    assert_eq!(
        ended,
        [
            Status::Succeeded,
            Status::Succeeded,
            Status::Failed,
            Status::Succeeded
        ]
    );

    // The bank accepts the row now.
    steps.declining.store(false, Ordering::SeqCst);

    // The re-driven fan-out has the same 4 s deadline: on a machine too busy to finish it in time it
    // fails with AWAIT_TIMEOUT again, and is re-driven again (what an operator would do).
    let mut redrives = 0;
    let done = loop {
        redrive(&api, id).await?;
        redrives += 1;
        let done = wait_for(&api, id, Duration::from_secs(90), |r| {
            r.status.is_terminal()
        })
        .await?;
        let timed_out = done
            .error
            .as_ref()
            .is_some_and(|e| e.code == "AWAIT_TIMEOUT");
        if done.status == Status::Failed && timed_out && redrives < 10 {
            continue;
        }
        break done;
    };
    assert_eq!(done.status, Status::Succeeded, "{done:#?}");
    let summary = done.result.clone().expect("a summary").value().clone();
    assert_eq!(summary["paid"], 4, "{summary}");
    assert_eq!(summary["failed"], json!([]));

    // The rows that succeeded ran once, however often the batch was re-driven; the declined one ran
    // again.
    let runs = steps.runs.lock().unwrap().clone();
    eprintln!("re-drives: {redrives}; runs of `pay` per line: {runs:?}");
    assert_eq!(
        [2, SLOW_LINE, 5].map(|line| runs.get(&line).copied()),
        [Some(1); 3],
        "runs of `pay` per line: {runs:?}"
    );
    assert!(
        runs[&DECLINED_LINE] >= 2,
        "runs of `pay` per line: {runs:?}"
    );
    Ok(())
}

/// Re-drives the batch as an operator does: against the version read, again if it moved meanwhile
/// (a dead letter marked sent, a child's late notice noted on it).
async fn redrive(api: &stepline::Coordinator, id: Uuid) -> anyhow::Result<()> {
    let response = loop {
        let request = RedriveRequest {
            execution_id: id,
            expected_version: api.get(id).await?.version,
            reason: "the bank is back".into(),
            release_version: None,
        };
        match handlers::redrive(api, request).await {
            Err(e) if e.code() == "VERSION_CONFLICT" => continue,
            other => break other?,
        }
    };
    assert_eq!(response.status, Status::Queued);
    Ok(())
}

async fn wait_for(
    api: &stepline::Coordinator,
    id: Uuid,
    timeout: Duration,
    done: impl Fn(&Execution) -> bool,
) -> anyhow::Result<Execution> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        // A child may not have started yet.
        let record = match api.get(id).await {
            Err(stepline::CoordinatorError::NotFound(_)) => None,
            other => Some(other?),
        };
        if let Some(record) = record.as_ref().filter(|r| done(r)) {
            return Ok(record.clone());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "not reached within {timeout:?}: {record:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_fan_out_cancels_its_children_still_running() -> anyhow::Result<()> {
    stepline_local::needs_emulator!();
    // Every row holds its first run: all four children are running when the batch is cancelled.
    let steps = CountedPayments::new(&[2, 3, 4, 5], false);
    let (local, _runner, api, id) = batch_of_four("fanout-cancel", &steps, 600).await?;
    wait_until(Duration::from_secs(60), || {
        let steps = steps.clone();
        async move { Ok(steps.runs.lock().unwrap().len() == 4) }
    })
    .await
    .map_err(|e| e.context(format!("rows running: {:?}", steps.runs.lock().unwrap())))?;

    // Its progress, as `stepline status` and `watch` show it: four children, none answered.
    let waiting = wait_for(&api, id, Duration::from_secs(30), |r| {
        r.status == Status::WaitingExternal
    })
    .await?;
    let progress = api.unit_progress(&waiting).await?.expect("a fan-out unit");
    assert_eq!((progress.interactions, progress.open), (4, 4));

    let cancelled = handlers::cancel(
        &api,
        stepline::handlers::CancelRequest {
            execution_id: id,
            reason: "wrong file".into(),
        },
    )
    .await?;
    assert_eq!(cancelled.status, Status::Cancelled);
    for child in children_of(id) {
        let record = wait_for(&api, child, Duration::from_secs(60), |r| {
            r.status.is_terminal()
        })
        .await?;
        assert_eq!(record.status, Status::Cancelled, "{record:#?}");
    }

    // The steps finish now: their replies change nothing, and the children's notices to the
    // cancelled parent are acknowledged without a write (no incident, nothing dead-lettered).
    steps.release.store(true, Ordering::SeqCst);
    wait_until(Duration::from_secs(60), || {
        let local = &local;
        async move { Ok(local.queue_depth("ReplyQueue").await? == 0) }
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let parent = api.get(id).await?;
    assert_eq!(parent.status, Status::Cancelled);
    assert!(parent.incidents.is_empty(), "{:?}", parent.incidents);
    assert_eq!(local.queue_depth("ReplyDeadLetterQueue").await?, 0);
    for child in children_of(id) {
        assert_eq!(api.get(child).await?.status, Status::Cancelled);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_children_succeed_and_their_parent_is_written_a_constant_number_of_times(
) -> anyhow::Result<()> {
    stepline_local::needs_emulator!();
    // A thousand children in the full tier, a hundred in the quick one.
    let rows: usize = stepline_local::testing::sized(100, 1000);
    let steps = CountedPayments::new(&[], false);
    let started = std::time::Instant::now();
    // The requests are sent at once. A child still waiting in the queue when its step's
    // deadline passes is retried, as any timed-out step is, and its row runs twice: on a slow machine
    // the last few hundred of a thousand did with the example's 120 s. What this test checks is not deadlines, so
    // the children get as long as it waits for them.
    let (_local, _runner, api, id) = batch_of(
        "fanout-many",
        &steps,
        |fan_out, pay| {
            fan_out.timeout_secs = 900;
            pay.timeout_secs = 900;
        },
        &csv_of(rows),
    )
    .await?;
    let done = wait_for(&api, id, Duration::from_secs(900), |r| {
        r.status.is_terminal()
    })
    .await?;
    let elapsed = started.elapsed();
    assert_eq!(done.status, Status::Succeeded, "{done:#?}");
    let summary = done.result.clone().expect("a summary").value().clone();
    assert_eq!(summary["paid"], rows, "{summary}");
    assert_eq!(summary["failed"], json!([]));
    assert_eq!(
        summary["badRows"],
        json!([]),
        "the parsed rows' report reaches the summary"
    );
    // Every row paid once.
    let runs = steps.runs.lock().unwrap().clone();
    assert_eq!(runs.len(), rows);
    assert!(runs.values().all(|n| *n == 1), "a row paid twice: {runs:?}");
    // Created, the rows parsed (the fan-out launched in that write), sized, children started,
    // settled (the summary launched in that write), summary done: six writes of the parent's item,
    // whatever the number of children.
    eprintln!(
        "fan-out of {rows} children: {:.1} s, the parent's item written {} times",
        elapsed.as_secs_f64(),
        done.version
    );
    assert!(
        done.version <= 8,
        "the parent was written {} times",
        done.version
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_failed_beyond_its_tolerance_is_re_driven_and_only_children_that_did_not_succeed_run_again(
) -> anyhow::Result<()> {
    stepline_local::needs_emulator!();
    // No failure tolerated: the declined row fails the batch, and the children still running then
    // are cancelled.
    let steps = CountedPayments::new(&[], true);
    let (_local, _runner, api, id) = batch_of(
        "fanout-tolerance",
        &steps,
        |f, _| {
            f.tolerated_failures = None;
            f.tolerated_failure_percent = None;
        },
        &csv_of(4),
    )
    .await?;
    let failed = wait_for(&api, id, Duration::from_secs(60), |r| {
        r.status.is_terminal()
    })
    .await?;
    assert_eq!(failed.status, Status::Failed, "{failed:#?}");
    let error = failed.error.clone().expect("an error");
    assert_eq!(error.code, "FAN_OUT_FAILED");
    assert!(
        error.message.ends_with("children failed, 0 tolerated"),
        "{error:?}"
    );

    // Every child ends: paid, declined, or cancelled before it was paid.
    let mut before = Vec::new();
    for child in children_of(id) {
        let ended = wait_for(&api, child, Duration::from_secs(60), |r| {
            r.status.is_terminal()
        })
        .await?;
        before.push(ended.status);
    }
    assert_eq!(before[2], Status::Failed, "line 4 was declined");
    let runs_before = steps.runs.lock().unwrap().clone();

    steps.declining.store(false, Ordering::SeqCst);
    redrive(&api, id).await?;
    let done = wait_for(&api, id, Duration::from_secs(90), |r| {
        r.status.is_terminal()
    })
    .await?;
    assert_eq!(done.status, Status::Succeeded, "{done:#?}");
    assert_eq!(done.result.expect("a summary").value()["paid"], 4);
    // Each child's worker invocations: a child that succeeded never ran again; each of the others
    // ran again. (A child cancelled while its request still waited on the worker's queue may have
    // that request run after it ended, before the re-drive: its count can grow by two.)
    let runs = steps.runs.lock().unwrap().clone();
    for (n, status) in before.iter().enumerate() {
        let line = n as u64 + 2;
        let (was, now) = (
            runs_before.get(&line).copied().unwrap_or(0),
            runs.get(&line).copied().unwrap_or(0),
        );
        match status {
            Status::Succeeded => assert_eq!(now, was, "line {line} paid again"),
            _ => assert!(now > was, "line {line} ({status}): runs {was} then {now}"),
        }
    }
    assert_eq!(runs[&DECLINED_LINE], 2, "the declined row ran again");
    Ok(())
}

/// The payment step, counting how many rows it pays at once (each payment takes a moment).
#[derive(Default)]
struct ConcurrentPayments {
    running: std::sync::atomic::AtomicU32,
    most: std::sync::atomic::AtomicU32,
    paid: Mutex<BTreeMap<u64, u32>>,
}

#[async_trait]
impl StepFunction for ConcurrentPayments {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        if request.step_id != "pay" {
            return csv_payments::CsvSteps.run(request, input).await;
        }
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        *self
            .paid
            .lock()
            .unwrap()
            .entry(input["line"].as_u64().unwrap_or_default())
            .or_default() += 1;
        self.running.fetch_sub(1, Ordering::SeqCst);
        csv_payments::CsvSteps.run(request, input).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_over_json_lines_in_the_payload_bucket_runs_at_most_its_window_at_once(
) -> anyhow::Result<()> {
    stepline_local::needs_emulator!();
    const ROWS: u64 = 12;
    const WINDOW: u32 = 3;
    let local = LocalStack::up(&fresh_stage("fanout-window")).await?;
    let (batch_queue, _) = local.stack.queue("CsvRequestQueue")?;
    let (payment_queue, _) = local.stack.queue("PaymentRequestQueue")?;
    // The csv batch without its parse step: the fan-out reads the rows from an object.
    let mut batch = csv_payments::batch_pipeline(batch_queue);
    batch.steps.remove(0);
    batch.steps[0].max_concurrency = Some(WINDOW);
    let batch_contract = stepline::contract::Contract::of(&batch);
    for def in [batch, csv_payments::payment_pipeline(payment_queue)] {
        local.release(def, Vec::new()).await?;
    }
    let steps = Arc::new(ConcurrentPayments::default());
    let _runner = local.run_workers(vec![
        ("CsvWorkerFunction", batch_contract, steps.clone()),
        (
            "PaymentWorkerFunction",
            csv_payments::payment_contract(),
            steps.clone(),
        ),
    ])?;
    let api = local.operator()?;
    let claims = api.claims().expect("the stage has a payload bucket");
    let rows: String = (0..ROWS)
        .map(|n| {
            let row = json!({"line": n + 2, "payee": format!("Payee {n}"), "amountCents": 100 + n});
            format!("{row}\n")
        })
        .collect();
    let key = format!("payloads/batches/{}.jsonl", Uuid::new_v4());
    claims.put_named(&key, rows.into_bytes()).await?;
    let id = api
        .submit(SubmitRequest {
            pipeline_id: csv_payments::BATCH_PIPELINE.into(),
            tenant: "finance".into(),
            input: json!({"itemsFrom": {"bucket": claims.bucket(), "key": key, "format": "jsonl"}, "badRows": []}),
            ..Default::default()
        })
        .await?
        .execution;
    // Twelve children three at a time, then the summary: seconds on a quiet machine, minutes when
    // the full tier's heaviest tests share its cores (it once took over 120 s there).
    let done = wait_for(&api, id, Duration::from_secs(300), |r| {
        r.status.is_terminal()
    })
    .await?;
    assert_eq!(done.status, Status::Succeeded, "{done:#?}");
    assert_eq!(done.result.expect("a summary").value()["paid"], ROWS);
    let paid = steps.paid.lock().unwrap().clone();
    assert_eq!(paid.len() as u64, ROWS);
    assert!(paid.values().all(|n| *n == 1), "{paid:?}");
    let most = steps.most.load(Ordering::SeqCst);
    assert!(
        most <= WINDOW,
        "{most} rows were paid at once, the window is {WINDOW}"
    );
    assert!(most > 1, "the window's children run together");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_re_driven_while_its_parent_waits_replaces_its_outcome_and_is_counted_once(
) -> anyhow::Result<()> {
    stepline_local::needs_emulator!();
    // Three rows (lines 2 to 4): line 2 is retried until released, line 3 pays, line 4 is declined.
    // The fan-out tolerates every failure, so the declined row alone settles nothing.
    let steps = CountedPayments::bouncing(&[2], true);
    let (_local, _runner, api, id) = batch_of(
        "fanout-child-redrive",
        &steps,
        |_, pay| pay.retry = stepline::domain::RetryPolicy::doubling(1_000, 500, 500),
        &csv_of(3),
    )
    .await?;
    let children = children_of(id);
    let minute = Duration::from_secs(60);
    wait_for(&api, children[1], minute, |r| r.status == Status::Succeeded).await?;
    wait_for(&api, children[2], minute, |r| r.status == Status::Failed).await?;
    let counted = |want: (usize, usize)| {
        let api = &api;
        async move {
            let parent = api.get(id).await?;
            let progress = api.unit_progress(&parent).await?.unwrap_or_default();
            let count = |outcome: &str| progress.answered.get(outcome).copied().unwrap_or(0);
            anyhow::Ok((parent, (count("SUCCEEDED"), count("FAILED")) == want))
        }
    };
    wait_until(minute, || async { Ok(counted((1, 1)).await?.1) }).await?;

    // The bank is back; an operator re-drives the declined child while its parent still waits.
    steps.declining.store(false, Ordering::SeqCst);
    redrive(&api, children[2]).await?;
    wait_for(&api, children[2], minute, |r| r.status == Status::Succeeded).await?;
    // Its success replaces its failure: two children counted, both succeeded, and the parent still
    // waits for the held row (counted twice, the child would complete the fan-out early).
    wait_until(minute, || async {
        let (parent, replaced) = counted((2, 0)).await?;
        anyhow::ensure!(
            parent.status == Status::WaitingExternal,
            "the parent moved on while a child runs: {parent:#?}"
        );
        Ok(replaced)
    })
    .await?;

    steps.release.store(true, Ordering::SeqCst);
    let done = wait_for(&api, id, minute, |r| r.status.is_terminal()).await?;
    assert_eq!(done.status, Status::Succeeded, "{done:#?}");
    let summary = done.result.clone().expect("a summary").value().clone();
    assert_eq!(summary["paid"], 3, "{summary}");
    assert_eq!(summary["failed"], json!([]), "{summary}");
    Ok(())
}

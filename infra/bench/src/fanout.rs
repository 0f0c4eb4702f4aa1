//! A fan-out at scale on the emulator (`--fan-out N`): the csv example's batch of N rows, each paid by
//! a child execution, through the real handlers behind the local runner on metered clients. Measures
//! the wall time, every AWS request by side, service and operation with its bill, the writes of the
//! parent's item and of the fan-out ledger.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;
use stepline::domain::Status;
use stepline::SubmitRequest;
use stepline_local::{Runner, RunnerOptions, Template};

use crate::analysis::{billed, line_of, Keyed};
use crate::pricing::{gb_seconds, Prices};
use crate::workload::{memory_sizes, metered, metered_stage, FUNCTION_NAMES};

const BATCH_QUEUE: &str = "CsvRequestQueue";
const PAYMENT_QUEUE: &str = "PaymentRequestQueue";

/// One line of the fan-out's bill.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FanOutLine {
    pub side: String,
    pub service: String,
    pub operation: String,
    pub calls: u64,
    pub units: f64,
    pub usd: f64,
}

/// What the run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FanOut {
    pub children: usize,
    pub wall_s: f64,
    pub status: Status,
    pub paid: u64,
    /// Writes of the parent's item, its creation included (its version at the end).
    pub parent_writes: u64,
    /// Writes and reads of the fan-out ledger.
    pub ledger_writes: u64,
    pub ledger_reads: u64,
    pub lines: Vec<FanOutLine>,
    pub calls: u64,
    pub lambda_invocations: u64,
    pub coordinator_usd: f64,
    pub worker_usd: f64,
}

impl Keyed for FanOutLine {
    fn key_mut(&mut self) -> [&mut String; 3] {
        [&mut self.side, &mut self.service, &mut self.operation]
    }
}

/// The bill being drawn up: its lines and each side's total.
#[derive(Default)]
struct Bill {
    lines: BTreeMap<(String, String, String), FanOutLine>,
    coordinator_usd: f64,
    worker_usd: f64,
}

impl Bill {
    /// Adds a call of `units` costing `usd` to its line and to its side's total.
    fn charge(&mut self, side: &str, service: &str, operation: &str, units: f64, usd: f64) {
        let line = line_of(&mut self.lines, side, service, operation);
        line.calls += 1;
        line.units += units;
        line.usd += usd;
        if side == "worker" {
            self.worker_usd += usd;
        } else {
            self.coordinator_usd += usd;
        }
    }
}

impl FanOut {
    pub fn per_child(&self, value: f64) -> f64 {
        value / self.children.max(1) as f64
    }
}

/// A CSV of `rows` payments within the bank's limit.
fn csv_of(rows: usize) -> String {
    let mut csv = String::from("payee,iban,amount_cents\n");
    for n in 0..rows {
        csv.push_str(&format!("Payee {n},GB33BUKB20201555555555,{}\n", 100 + n));
    }
    csv
}

pub async fn run(children: usize, prices: &Prices) -> Result<FanOut> {
    ensure!(
        std::env::var_os("AWS_ENDPOINT_URL").is_some(),
        "AWS_ENDPOINT_URL is not set: start the emulator (infra/emulator.sh) or use infra/bench.sh"
    );
    let template = Template::load(&Template::default_path())?;
    // The batch is submitted through the observer: only the stack's work is billed.
    let (local, meter, observer) =
        metered_stage("bench-fanout", &Default::default(), &template).await?;
    let (batch_queue, _) = local.stack.queue(BATCH_QUEUE)?;
    let (payment_queue, _) = local.stack.queue(PAYMENT_QUEUE)?;
    let mut batch = csv_payments::batch_pipeline(batch_queue);
    batch.steps[1].timeout_secs = 3600;
    for def in [batch, csv_payments::payment_pipeline(payment_queue)] {
        local.release(def, Vec::new()).await?;
    }
    let mut bindings = local.coordinator_bindings()?;
    for (function, contract) in [
        ("CsvWorkerFunction", csv_payments::batch_contract()),
        ("PaymentWorkerFunction", csv_payments::payment_contract()),
    ] {
        bindings.push(local.worker_binding(
            function,
            &contract,
            Arc::new(csv_payments::CsvSteps),
        )?);
    }
    let bindings = bindings.into_iter().map(|b| metered(&meter, b)).collect();
    let _runner = Runner::start(
        local.clients.sqs.clone(),
        &local.stack,
        bindings,
        RunnerOptions::default(),
    )?;

    meter.take();
    let started = Instant::now();
    let id = observer
        .submit(SubmitRequest {
            pipeline_id: csv_payments::BATCH_PIPELINE.into(),
            tenant: "bench".into(),
            input: json!({ "csv": csv_of(children) }),
            ..Default::default()
        })
        .await?
        .execution;
    let deadline = started + Duration::from_secs(600 + children as u64);
    let record = loop {
        let record = observer.get(id).await?;
        if record.status.is_terminal() {
            break record;
        }
        ensure!(
            Instant::now() < deadline,
            "the batch did not end: {}",
            record.status
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let wall_s = started.elapsed().as_secs_f64();
    let (calls, invocations) = meter.take();

    let mut bill = Bill::default();
    let (mut ledger_writes, mut ledger_reads, mut counted) = (0, 0, 0);
    for call in &calls {
        if call.function == Some("claim")
            || (call.operation == "ReceiveMessage" && call.messages == 0)
        {
            continue;
        }
        let side = match call.function {
            Some("worker") => "worker",
            Some(_) => "coordinator",
            // The pollers' receives and deletes (Lambda's event source), and calls made off a
            // handler's task.
            None => "event source",
        };
        if call.ledger {
            if call.operation == "BatchGetItem" {
                ledger_reads += 1;
            } else {
                ledger_writes += 1;
            }
        }
        let (units, usd) = billed(call, prices);
        bill.charge(side, &call.service, &call.operation, units, usd);
        counted += 1;
    }
    // Lambda: a request per invocation and its duration at the function's memory size.
    let memory = memory_sizes(&template);
    let mut lambda_invocations = 0;
    for invocation in invocations.iter().filter(|i| i.function != "claim") {
        let function = FUNCTION_NAMES
            .iter()
            .find(|(_, short)| *short == invocation.function)
            .map_or("ApiFunction", |(f, _)| f);
        let mb = memory.get(function).copied().unwrap_or(128);
        let usd = prices.lambda_request
            + gb_seconds(invocation.duration_ms, mb) * prices.lambda_gb_second;
        let side = if invocation.function == "worker" {
            "worker"
        } else {
            "coordinator"
        };
        bill.charge(side, "lambda", "Invoke", 1.0, usd);
        lambda_invocations += 1;
    }
    let paid = record
        .result
        .as_ref()
        .and_then(|r| r.value()["paid"].as_u64())
        .unwrap_or_default();
    Ok(FanOut {
        children,
        wall_s,
        status: record.status,
        paid,
        parent_writes: record.version,
        ledger_writes,
        ledger_reads,
        lines: bill.lines.into_values().collect(),
        calls: counted,
        lambda_invocations,
        coordinator_usd: bill.coordinator_usd,
        worker_usd: bill.worker_usd,
    })
}

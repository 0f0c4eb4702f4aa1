//! The `csv-payments` example: a CSV of payments is parsed and validated (bad rows are reported, not
//! fatal), each good row is paid by a child execution of the `csv-payment` pipeline (a fan-out step),
//! and a summary aggregates the outcomes. A payment that fails fails its row, not the batch.

use async_trait::async_trait;
use serde_json::{json, Value};
use stepline_worker::contract::Contract;
use stepline_worker::domain::{PipelineDef, RetryPolicy, StepDef, StepError};
use stepline_worker::envelope::RequestHeader;
use stepline_worker::worker::StepFunction;

pub const BATCH_PIPELINE: &str = "csv-payments";
pub const PAYMENT_PIPELINE: &str = "csv-payment";
pub const RELEASE_VERSION: &str = "1";
/// Payments above this many cents are declined by the (simulated) bank.
pub const LIMIT_CENTS: u64 = 100_000;

/// A step typed `input` -> `output`, retried quickly; a declined or unreadable payment is final.
fn typed(step: StepDef, input: &str, output: &str) -> StepDef {
    step.types(input, output)
        .timeout_secs(120)
        .retry(RetryPolicy::doubling(3, 500, 5_000))
        .non_retryable(["DECLINED", "INVALID_CSV"])
}

/// parse (task) -> payments (fan-out over `items`, children of `csv-payment`; a failed payment fails
/// its row, not the batch) -> summary (task).
pub fn batch_pipeline(queue: &str) -> PipelineDef {
    PipelineDef::new(
        BATCH_PIPELINE,
        RELEASE_VERSION,
        [
            typed(StepDef::task("parse", queue), "csv.Text/1", "csv.Rows/1"),
            typed(
                StepDef::fan_out("payments", PAYMENT_PIPELINE).tolerating(None, Some(100.0)),
                "csv.Rows/1",
                "csv.PaidRows/1",
            ),
            typed(
                StepDef::task("summary", queue),
                "csv.PaidRows/1",
                "csv.Summary/1",
            ),
        ],
    )
}

/// pay (task): one row.
pub fn payment_pipeline(queue: &str) -> PipelineDef {
    PipelineDef::new(
        PAYMENT_PIPELINE,
        RELEASE_VERSION,
        [typed(
            StepDef::task("pay", queue),
            "csv.Row/1",
            "csv.Payment/1",
        )],
    )
}

pub fn batch_contract() -> Contract {
    Contract::of(&batch_pipeline(""))
}

pub fn payment_contract() -> Contract {
    Contract::of(&payment_pipeline(""))
}

/// A sample batch: good rows, a malformed row, a negative amount, and one over the bank's limit.
pub fn sample_csv() -> Value {
    json!({"csv": "payee,iban,amount_cents\n\
        Ada Lovelace,GB33BUKB20201555555555,12500\n\
        Alan Turing,GB94BARC10201530093459,990\n\
        broken row without fields\n\
        Grace Hopper,DE89370400440532013000,-5\n\
        Edsger Dijkstra,NL91ABNA0417164300,250000\n\
        Barbara Liskov,FR1420041010050500013M02606,4200\n"})
}

/// The steps of both pipelines.
pub struct CsvSteps;

#[async_trait]
impl StepFunction for CsvSteps {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        match request.step_id.as_str() {
            "parse" => parse(&input),
            "pay" => pay(&input, request),
            "summary" => Ok(summary(&input)),
            other => Err(StepError::new(
                "UNKNOWN_STEP",
                format!("no step {other:?}"),
                false,
            )),
        }
    }
}

fn parse(input: &Value) -> Result<Value, StepError> {
    let text = input["csv"]
        .as_str()
        .ok_or_else(|| StepError::new("INVALID_CSV", "input needs a csv string", false))?;
    let mut items = Vec::new();
    let mut bad = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        let line_no = n + 1;
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        match fields.as_slice() {
            [payee, iban, amount] if !payee.is_empty() && iban.len() >= 15 => match amount
                .parse::<i64>()
            {
                Ok(cents) if cents > 0 => items.push(json!({
                    "line": line_no, "payee": payee, "iban": iban, "amountCents": cents
                })),
                _ => bad
                    .push(json!({"line": line_no, "reason": format!("invalid amount {amount:?}")})),
            },
            [] | [""] => {}
            _ => bad.push(json!({"line": line_no, "reason": "expected payee,iban,amount_cents"})),
        }
    }
    Ok(json!({"items": items, "badRows": bad}))
}

fn pay(row: &Value, request: &RequestHeader) -> Result<Value, StepError> {
    let cents = row["amountCents"].as_u64().unwrap_or(0);
    if cents > LIMIT_CENTS {
        return Err(StepError::new(
            "DECLINED",
            format!("{} cents is over the limit", cents),
            false,
        ));
    }
    Ok(json!({
        "line": row["line"],
        "payee": row["payee"],
        "amountCents": cents,
        // Idempotent per row: the child execution's id is the row's (stable across retries of the
        // step and re-drives of the batch), so every run for a row pays under the same reference.
        "reference": payment_reference(request),
    }))
}

/// The bank's idempotency reference of a row's payment: the child execution's id, the same for every
/// attempt and every re-drive of the batch.
pub fn payment_reference(request: &RequestHeader) -> String {
    format!("PAY-{}", request.execution_id.simple())
}

/// A batch of `rows` payments: every 100th row malformed, every 50th otherwise over the bank's
/// limit (declined), the rest good. Returns the input and the (paid, declined, bad) counts it makes.
pub fn generated_csv(rows: usize) -> (Value, (usize, usize, usize)) {
    let mut csv = String::from("payee,iban,amount_cents\n");
    let (mut paid, mut declined, mut bad) = (0, 0, 0);
    for n in 0..rows {
        if n % 100 == 99 {
            csv.push_str(&format!("row {n} without fields\n"));
            bad += 1;
        } else if n % 50 == 49 {
            csv.push_str(&format!(
                "Payee {n},GB33BUKB20201555555555,{}\n",
                LIMIT_CENTS + 1
            ));
            declined += 1;
        } else {
            csv.push_str(&format!("Payee {n},GB33BUKB20201555555555,{}\n", 100 + n));
            paid += 1;
        }
    }
    (json!({ "csv": csv }), (paid, declined, bad))
}

fn summary(input: &Value) -> Value {
    // The fan-out's children's ends, in row order.
    let outcomes = input["results"].as_array().cloned().unwrap_or_default();
    let mut paid = Vec::new();
    let mut failed = Vec::new();
    for outcome in &outcomes {
        match outcome["status"].as_str() {
            Some("SUCCEEDED") => paid.push(outcome["result"].clone()),
            _ => failed.push(json!({
                "execution": outcome["executionId"],
                "code": outcome["error"]["code"],
                "message": outcome["error"]["message"],
            })),
        }
    }
    let total: u64 = paid.iter().filter_map(|p| p["amountCents"].as_u64()).sum();
    json!({
        "paid": paid.len(),
        "paidCents": total,
        "failed": failed,
        // A fan-out over a claim-checked input wraps it: `{"input": <the rows>, "results", ...}`.
        "badRows": input.get("input").unwrap_or(input)["badRows"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_reads_the_bad_rows_beside_the_results_or_in_a_wrapped_input() {
        let results = json!([
            {"item": 0, "status": "SUCCEEDED", "result": {"amountCents": 500}},
            {"item": 1, "status": "FAILED", "error": {"code": "DECLINED", "message": "no"}},
        ]);
        let bad = json!([{"line": 4, "reason": "expected payee,iban,amount_cents"}]);
        let inline = json!({"items": [], "badRows": bad, "results": results});
        let wrapped = json!({"input": {"items": [], "badRows": bad}, "results": results});
        for input in [inline, wrapped] {
            let summary = summary(&input);
            assert_eq!(summary["paid"], 1);
            assert_eq!(summary["paidCents"], 500);
            assert_eq!(summary["failed"][0]["code"], "DECLINED");
            assert_eq!(summary["badRows"], bad);
        }
    }
}

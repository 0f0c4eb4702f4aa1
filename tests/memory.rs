//! The completion function under the template's 128 MB with large outputs: its hot-path cache of
//! committed records is bounded by bytes (a share of `AWS_LAMBDA_FUNCTION_MEMORY_SIZE`), not only by
//! count, so a thousand executions carrying 100 KB outputs do not exhaust the function's memory (an
//! out-of-memory kill lands between a commit and its send). The real binary runs under the
//! test-served Runtime API; its peak resident set (`VmHWM`) is read from /proc.

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use serde_json::json;
use stepline::envelope::{RawRequest, ReplyEnvelope, ReplyOutcome};
use stepline_suite::{binaries, on_emulator, TestStack};

const EXECUTIONS: usize = 1_100;
const OUTPUT_BYTES: usize = 100 * 1024;
/// The template's `MemorySize`.
const FUNCTION_MEMORY_KIB: u64 = 128 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_completion_function_stays_within_its_memory_under_large_outputs() -> anyhow::Result<()>
{
    stepline_local::full_tier_only!("the peak memory of 1,100 outputs of 100 KB");
    // Outputs kept inline (the threshold at its largest), as a worker without claim checks sends them.
    let stack = on_emulator!(
        TestStack::with_parameters(
            "mem-completion",
            &[("PayloadThresholdBytes", "204800")],
            |_| {},
        )
        .await?
    );
    stack.submit_orders(EXECUTIONS).await?;
    let requests = stack.take_all("OrderRequestQueue").await?;
    assert_eq!(requests.len(), EXECUTIONS);

    let mut completion =
        binaries::start("completion", &stack.function_env("CompletionFunction")?).await?;
    let reply_arn = match stack.local.stack.resources.get("ReplyQueue") {
        Some(stepline_local::stack::Physical::Queue { arn, .. }) => arn.clone(),
        _ => anyhow::bail!("no reply queue"),
    };
    let blob = "x".repeat(OUTPUT_BYTES);
    for (batch, chunk) in requests.chunks(10).enumerate() {
        let mut event = SqsEvent::default();
        for (i, body) in chunk.iter().enumerate() {
            let request: RawRequest = serde_json::from_str(body)?;
            let reply = ReplyEnvelope::for_request(
                &request.header,
                ReplyOutcome::Succeeded {
                    output: json!({"orderId": request.header.execution_id, "blob": blob}),
                },
            );
            let mut message = SqsMessage::default();
            message.message_id = Some(format!("m-{batch}-{i}"));
            message.receipt_handle = Some(format!("r-{batch}-{i}"));
            message.body = Some(serde_json::to_string(&reply)?);
            message.event_source = Some("aws:sqs".into());
            message.event_source_arn = Some(reply_arn.clone());
            event.records.push(message);
        }
        let answer = completion.invoke(serde_json::to_string(&event)?).await?;
        assert_eq!(answer["batchItemFailures"], json!([]), "batch {batch}");
    }
    // Every reply was applied (each execution is at its second step, carrying a 100 KB input).
    let record = stack
        .api
        .get(
            serde_json::from_str::<RawRequest>(&requests[0])?
                .header
                .execution_id,
        )
        .await?;
    assert_eq!(record.step, 1);

    let peak = completion.peak_rss_kib().expect("VmHWM of the function");
    println!("completion: peak RSS {peak} KiB after {EXECUTIONS} replies of {OUTPUT_BYTES} bytes");
    assert!(
        peak < FUNCTION_MEMORY_KIB,
        "peak RSS {peak} KiB exceeds the function's {FUNCTION_MEMORY_KIB} KiB"
    );
    Ok(())
}

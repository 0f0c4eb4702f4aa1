//! Await units on the local emulator: an order is validated, waits for a manager's approval, then is
//! priced. The test plays the manager: it reads the await notice from the notice queue and answers on
//! the queue the notice names.

use std::time::Duration;

use serde_json::{json, Value};
use stepline::domain::{Status, Verdict};
use stepline::envelope::{AwaitNotice, InteractionMessage, AWAIT_NOTICE_KIND, INTERACTION_KIND};
use stepline::handlers;
use stepline::CoordinatorError;
use stepline_suite::{on_emulator, TestStack};
use uuid::Uuid;

async fn notice(stack: &TestStack, url: &str) -> anyhow::Result<AwaitNotice> {
    let messages = stack.receive_from(url, Duration::from_secs(30)).await?;
    assert_eq!(messages.len(), 1, "one notice");
    let notice: AwaitNotice = serde_json::from_str(messages[0].body.as_deref().unwrap())?;
    assert_eq!(notice.kind, AWAIT_NOTICE_KIND);
    Ok(notice)
}

/// The manager's answer to execution `id`'s approval, proved with `token`.
fn manager_answer(id: Uuid, token: &str, approve: bool, payload: Value) -> InteractionMessage {
    InteractionMessage {
        kind: INTERACTION_KIND.into(),
        execution_id: id,
        interaction: "manager".into(),
        token: token.into(),
        verdict: if approve {
            Verdict::Approved
        } else {
            Verdict::Rejected
        },
        payload,
        unit: None,
    }
}

/// An approval through the API path that must be refused; returns the refusal.
async fn refused_approval(stack: &TestStack, id: Uuid, token: &str) -> CoordinatorError {
    handlers::complete_interaction(&stack.api, manager_answer(id, token, true, json!({})))
        .await
        .unwrap_err()
}

/// A stack waiting on a manager's approval (`TestStack::with_approval`) with sample order `n`
/// submitted: the stack, the notice queue, the execution and the approval's notice.
async fn awaiting_approval(
    prefix: &str,
    wait_secs: u32,
    n: usize,
) -> anyhow::Result<(TestStack, String, Uuid, AwaitNotice)> {
    let (stack, notices) = TestStack::with_approval(prefix, wait_secs).await?;
    let id = stack.submit(order_worker::sample_order(n)).await?;
    let notice = notice(&stack, &notices).await?;
    Ok((stack, notices, id, notice))
}

async fn answer(
    stack: &TestStack,
    notice: &AwaitNotice,
    token: &str,
    approve: bool,
    payload: Value,
) -> anyhow::Result<()> {
    let message = manager_answer(notice.execution_id, token, approve, payload);
    stack
        .send_message(&notice.complete_to, serde_json::to_string(&message)?)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_resumes_the_execution_and_a_second_one_changes_nothing() -> anyhow::Result<()>
{
    let (stack, _, id, notice) = on_emulator!(awaiting_approval("e2e-approve", 600, 1).await?);
    assert_eq!(notice.execution_id, id);
    assert_eq!(notice.step_id, "approve");
    assert_eq!(
        notice.input["orderId"], "order-1",
        "the notice shows what is to be approved"
    );
    let waiting = stack.api.get(id).await?;
    assert_eq!(waiting.status, Status::WaitingExternal);
    let token = notice.interactions[0].token.clone();

    // Approved twice (a double click): one resume.
    answer(&stack, &notice, &token, true, json!({"by": "maria"})).await?;
    answer(&stack, &notice, &token, true, json!({"by": "maria"})).await?;
    let record = stack.wait_terminal(id).await?;
    stack
        .wait_drained("ReplyQueue", Duration::from_secs(30))
        .await?;

    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    // The manager's answer is recorded on the await unit by its verdict and fingerprint; the answer
    // itself travelled on in the step's output, to pricing (stored once).
    let unit = record.await_unit.as_ref().expect("await unit kept");
    let completion = unit.interactions[0].completion.as_ref().expect("answered");
    assert_eq!(completion.verdict, Verdict::Approved);
    assert!(!completion.fingerprint.is_empty());
    assert!(completion.payload.is_null(), "the answer is not kept twice");
    assert_eq!(record.result.as_ref().unwrap().value()["totalCents"], 820);
    let settled = stack.api.get(id).await?;
    assert_eq!(
        settled.version, record.version,
        "the second approval resumed nothing"
    );
    stack
        .assert_empty("ReplyDeadLetterQueue", "the duplicate was absorbed")
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_fails_the_execution_with_its_reason() -> anyhow::Result<()> {
    let (stack, _, id, notice) = on_emulator!(awaiting_approval("e2e-reject", 600, 2).await?);
    let token = notice.interactions[0].token.clone();
    answer(
        &stack,
        &notice,
        &token,
        false,
        json!({"reason": "kitchen closed"}),
    )
    .await?;

    let record = stack.wait_terminal(id).await?;
    assert_eq!(record.status, Status::Failed);
    let error = record.error.as_ref().unwrap();
    assert_eq!(error.code, "REJECTED");
    assert!(error.message.contains("kitchen closed"), "{error:?}");
    assert_eq!(
        (record.first_step, record.step, record.steps.len()),
        (1, 1, 1),
        "nothing after the rejected approval ran"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_approval_fails_with_await_timeout_at_its_deadline() -> anyhow::Result<()> {
    let (stack, _, id, notice) = on_emulator!(awaiting_approval("e2e-timeout", 2, 3).await?);

    let record = stack.wait_terminal(id).await?;
    assert_eq!(record.status, Status::Failed);
    assert_eq!(record.error.as_ref().unwrap().code, "AWAIT_TIMEOUT");
    assert!(
        record.updated_at >= notice.deadline,
        "not before the deadline"
    );

    // A late answer is refused and the execution stays failed.
    let late = refused_approval(&stack, id, &notice.interactions[0].token).await;
    assert_eq!(late.code(), "NOT_WAITING");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_or_wrong_resume_token_is_refused() -> anyhow::Result<()> {
    let (stack, notices, id, notice) = on_emulator!(awaiting_approval("e2e-forge", 600, 4).await?);
    let other = stack.submit(order_worker::sample_order(5)).await?;
    let other_notice = self::notice(&stack, &notices).await?;
    assert_eq!(other_notice.execution_id, other);

    // Through the API path: a made-up token, and another execution's token.
    for token in [
        Uuid::new_v4().simple().to_string(),
        other_notice.interactions[0].token.clone(),
    ] {
        let refused = refused_approval(&stack, id, &token).await;
        assert_eq!(refused.code(), "INVALID_TOKEN");
    }
    // Through the queue: dead-lettered with its reason. The token is checked before anything else:
    // naming an interaction the execution does not have, or carrying an answer over the claim-check
    // threshold, gets a forger no further.
    let before = stack.api.get(id).await?;
    let large = json!({"note": "x".repeat(stack.claims()?.threshold() + 1)});
    answer(&stack, &notice, "not-the-token", true, large.clone()).await?;
    let mut owner = manager_answer(id, "not-the-token", true, json!({}));
    owner.interaction = "owner".into();
    stack
        .send_message(&notice.complete_to, serde_json::to_string(&owner)?)
        .await?;
    assert_eq!(
        stack.dead_letter_reasons(2).await?,
        vec!["INVALID_TOKEN"; 2]
    );
    // A message that did not prove it may answer writes nothing to the execution (anyone can name
    // one): no incident, no stored answer. The execution keeps waiting for the real answer.
    let record = stack.api.get(id).await?;
    assert_eq!(record, before);
    assert!(!stack.holds_payload(id, &large).await?);
    assert_eq!(record.status, Status::WaitingExternal);
    Ok(())
}

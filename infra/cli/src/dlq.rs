//! The dead-letter queues' commands: list, peek, replay and move, on the stage's four queues.

use super::*;

/// The stage's four DLQs: execution, launch, reply, start.
pub(crate) fn dead_letter_queues(stage: &Stage) -> Result<[SqsDeadLetterQueue; 4]> {
    let sqs = aws_sdk_sqs::Client::new(&stage.sdk);
    let queue = |logical: &str| -> Result<SqsDeadLetterQueue> {
        Ok(SqsDeadLetterQueue::new(
            sqs.clone(),
            stage.stack.queue(logical)?.1,
        ))
    };
    Ok([
        queue("ExecutionDeadLetterQueue")?,
        queue("LaunchDeadLetterQueue")?,
        queue("ReplyDeadLetterQueue")?,
        queue("StartDeadLetterQueue")?,
    ])
}

pub(crate) fn dlqs_of(queues: &[SqsDeadLetterQueue; 4]) -> DeadLetterQueues<'_> {
    DeadLetterQueues {
        execution: &queues[0],
        launch: &queues[1],
        reply: &queues[2],
        start: Some(&queues[3]),
    }
}

/// A DLQ by name.
pub(crate) fn dlq_reader<'a>(
    queues: &'a [SqsDeadLetterQueue; 4],
    name: &str,
) -> Result<&'a SqsDeadLetterQueue> {
    Ok(match name {
        "execution" => &queues[0],
        "launch" => &queues[1],
        "reply" => &queues[2],
        "start" => &queues[3],
        other => bail!("unknown DLQ {other:?} (execution, launch, reply, start)"),
    })
}

/// Up to `max` messages of a DLQ, left in place (made visible again at once).
pub(crate) async fn peek(reader: &SqsDeadLetterQueue, max: usize) -> Result<Vec<Value>> {
    let mut seen = Vec::new();
    while seen.len() < max {
        let batch = reader.receive(max - seen.len()).await?;
        if batch.is_empty() {
            break;
        }
        seen.extend(batch);
    }
    for m in &seen {
        reader.release(&m.handle).await?;
    }
    Ok(seen
        .iter()
        .map(|m| json!({"body": serde_json::from_str::<Value>(&m.body).unwrap_or(Value::String(m.body.clone())), "attributes": m.attributes, "sentAt": m.sent_at}))
        .collect())
}

pub(crate) async fn dlq(
    stage: &Stage,
    api: &Coordinator,
    action: DlqAction,
    out: &Output,
) -> Result<()> {
    let queues = dead_letter_queues(stage)?;
    let dlqs = dlqs_of(&queues);
    match action {
        DlqAction::Inspect { queue: name, max } => {
            let listed = peek(dlq_reader(&queues, &name)?, max).await?;
            out.show(&Value::Array(listed.clone()), || {
                listed
                    .iter()
                    .map(|m| m.to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            });
        }
        DlqAction::Replay { filter } => {
            let response =
                handlers::operator(api, &dlqs, OperatorRequest::Replay(filter.request())).await?;
            out.show(&serde_json::to_value(&response)?, || {
                serde_json::to_string_pretty(&response).unwrap_or_default()
            });
        }
        DlqAction::Move {
            queue: name,
            filter,
        } => {
            let source = match name.as_str() {
                "launch" => MoveSource::Launch,
                "reply" => MoveSource::Reply,
                "start" => MoveSource::Start,
                other => bail!("unknown queue {other:?} (launch, reply, start)"),
            };
            let request = OperatorRequest::Move(MoveRequest {
                queue: source,
                replay: filter.request(),
            });
            let response = handlers::operator(api, &dlqs, request).await?;
            out.show(&serde_json::to_value(&response)?, || {
                serde_json::to_string_pretty(&response).unwrap_or_default()
            });
        }
    }
    Ok(())
}

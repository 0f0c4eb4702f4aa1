//! The dead-letter queues' commands: list, peek, replay and move, on the stage's four queues.

use super::*;

/// The stage's four DLQs (execution, launch, reply, start), as its operator function reads them.
pub(crate) fn dead_letter_queues(stage: &Stage) -> Result<DeadLetterQueues> {
    let config = CoordinatorConfig::from_lookup(stage.stack.env_of(functions::REDRIVE)?)?;
    let sqs = aws_sdk_sqs::Client::new(&stage.sdk);
    Ok(stepline::aws::dead_letter_queues(&sqs, &config.queues))
}

/// A DLQ by name.
pub(crate) fn dlq_reader<'a>(
    queues: &'a DeadLetterQueues,
    name: &str,
) -> Result<&'a dyn DeadLetterQueue> {
    let names = DeadLetterQueues::NAMES.join(", ");
    Ok(queues
        .named(name)
        .with_context(|| format!("unknown DLQ {name:?} ({names})"))?
        .as_ref())
}

/// Up to `max` messages of a DLQ, left in place (made visible again at once).
pub(crate) async fn peek(reader: &dyn DeadLetterQueue, max: usize) -> Result<Vec<Value>> {
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
    let dlqs = dead_letter_queues(stage)?;
    match action {
        DlqAction::Inspect { queue: name, max } => {
            let listed = peek(dlq_reader(&dlqs, &name)?, max).await?;
            out.show(&Value::Array(listed.clone()), || {
                listed
                    .iter()
                    .map(|m| m.to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            });
        }
        DlqAction::Replay { filter, onto } => {
            let request = OperatorRequest::Replay(filter.request(onto));
            let response = handlers::operator(api, &dlqs, request).await?;
            out.show(&response, || {
                serde_json::to_string_pretty(&response).unwrap_or_default()
            });
        }
        DlqAction::Move {
            queue: name,
            filter,
        } => {
            let Some(source) = Inbox::ALL.into_iter().find(|q| q.name() == name) else {
                bail!("unknown queue {name:?} (launch, reply, start)");
            };
            let request = OperatorRequest::Move(MoveRequest {
                queue: source,
                replay: filter.request(None),
            });
            let response = handlers::operator(api, &dlqs, request).await?;
            out.show(&response, || {
                serde_json::to_string_pretty(&response).unwrap_or_default()
            });
        }
    }
    Ok(())
}

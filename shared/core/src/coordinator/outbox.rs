//! The one place where committed actions are carried out: `stage` turns a decision's actions into
//! messages (requests, launch work, notices, dead-letter envelopes, lifecycle events), `flush` sends
//! them batched per queue and records what went out on the execution (acknowledgements).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use uuid::Uuid;

use super::{Coordinator, CoordinatorError, Read, Role};
use crate::domain::fan_out::item_name;
use crate::domain::ids::fan_out_token;
use crate::domain::seal::{self, SealKeys};
use crate::domain::{
    self, Action, AwaitUnit, ChildEnd, Event, Execution, ParentLink, PipelineDef, StepDef, StepKind,
};
use crate::envelope::{
    AwaitNotice, ChildCancel, ChildEnded, DeadLetterEnvelope, Identity, LaunchWork,
    NoticeInteraction, RequestEnvelope, RequestHeader, StartDetail, StartEvent, AWAIT_NOTICE_KIND,
    CANCEL_CHILD_KIND, CANCEL_KIND, DEAD_LETTER_KIND, REQUEST_KIND, START_DETAIL_TYPE,
    START_SOURCE,
};
use crate::ports::{BusEvent, OutMessage, SendError, StoreError};

impl Coordinator {
    /// Turns a committed decision's actions into messages.
    pub(super) fn stage(
        &self,
        outbox: &mut Outbox,
        record: &Execution,
        definition: &PipelineDef,
        actions: &[Action],
        source: usize,
    ) {
        for action in actions {
            match action {
                Action::EnqueueLaunch {
                    generation,
                    token,
                    delay_secs,
                } => {
                    let work = LaunchWork {
                        execution_id: record.id,
                        generation: *generation,
                        token: *token,
                    };
                    outbox.push(
                        &self.settings.queues.launch,
                        source,
                        OutMessage {
                            delay_secs: *delay_secs,
                            ..json(&work)
                        },
                        None,
                    );
                }
                Action::SendRequest {
                    step,
                    attempt,
                    launch_id,
                    deadline,
                } => {
                    let (Some(step_def), Some(input)) =
                        (definition.step(*step), record.step_input(*step))
                    else {
                        tracing::error!(execution_id = %record.id, step, "request without step definition or input");
                        continue;
                    };
                    let mut header = self.request_header(
                        record,
                        &step_def.id,
                        *step,
                        *attempt,
                        *launch_id,
                        *deadline,
                    );
                    // The record travels sealed in the token, for the reply's completion.
                    let sealed = outbox
                        .keys
                        .as_deref()
                        .and_then(|keys| seal::seal(keys.current(), record));
                    if let (false, Some(sealed)) = (header.reply_token.is_empty(), sealed) {
                        header.reply_token = seal::sealed_token(&header.reply_token, &sealed);
                    }
                    tracing::info!(
                        execution_id = %record.id, tenant = %record.tenant, step = %step_def.id,
                        attempt, launch_id = %launch_id, "step launched"
                    );
                    let envelope = RequestEnvelope {
                        header,
                        payload: input.value(),
                    };
                    outbox.push(&step_def.queue, source, json(&envelope), None);
                }
                Action::NotifyCancel { step, launch_id } => {
                    let Some(step_def) = definition.step(*step) else {
                        continue;
                    };
                    let mut header = self.request_header(
                        record,
                        &step_def.id,
                        *step,
                        record.attempt,
                        *launch_id,
                        record.updated_at,
                    );
                    header.kind = CANCEL_KIND.to_string();
                    let envelope = RequestEnvelope {
                        header,
                        payload: &Value::Null,
                    };
                    outbox.push(&step_def.queue, source, json(&envelope), None);
                }
                Action::SendAwaitNotice { unit } => {
                    let (Some(await_unit), Some(step_def)) =
                        (record.await_unit.as_ref(), definition.step(record.step))
                    else {
                        tracing::error!(execution_id = %record.id, "await notice without an await unit");
                        continue;
                    };
                    if step_def.kind == StepKind::FanOut {
                        self.stage_children(outbox, record, step_def, await_unit, source);
                        continue;
                    }
                    let notice = AwaitNotice {
                        kind: AWAIT_NOTICE_KIND.to_string(),
                        execution_id: record.id,
                        tenant: record.tenant.clone(),
                        pipeline_id: record.pipeline_id.clone(),
                        release_version: record.release_version.clone(),
                        step_id: step_def.id.clone(),
                        step_index: record.step,
                        await_unit_id: *unit,
                        deadline: await_unit.deadline,
                        interactions: await_unit
                            .interactions
                            .iter()
                            .map(|i| NoticeInteraction {
                                id: i.id.clone(),
                                idempotency_key: i.idempotency_key.clone(),
                                token: i.token.clone(),
                            })
                            .collect(),
                        input: record
                            .step_input(record.step)
                            .map(|p| p.value().clone())
                            .unwrap_or_default(),
                        complete_to: self.settings.queues.awaits.clone(),
                    };
                    tracing::info!(execution_id = %record.id, step = %step_def.id, await_unit = %unit, "await requested");
                    outbox.push(
                        &step_def.queue,
                        source,
                        json(&notice),
                        Some((record.id, Event::AwaitNoticeSent { unit: *unit })),
                    );
                }
                Action::CancelChildren { unit } => {
                    self.stage_child_cancels(outbox, record, definition, *unit, source);
                }
                Action::NotifyParent => {
                    let Some(parent) = &record.parent else {
                        continue;
                    };
                    let Some(item) = crate::domain::fan_out::item_number(&parent.interaction)
                    else {
                        tracing::error!(execution_id = %record.id, interaction = %parent.interaction, "a fan-out child's link names no item");
                        continue;
                    };
                    // A child's end is counted in the parent's fan-out.
                    let end = ChildEnd {
                        item,
                        execution_id: record.id,
                        status: record.status,
                        result: record.result.as_ref().map(|r| r.value().clone()),
                        error: record.error.clone(),
                    };
                    // To this coordinator's own queue, whatever the link says.
                    outbox.push(
                        &self.settings.queues.awaits,
                        source,
                        json(&ChildEnded::of(parent, end, record.version)),
                        Some((record.id, Event::ParentNotified)),
                    );
                }
                Action::PublishEvents => {
                    let events = record
                        .events
                        .iter()
                        .map(|e| BusEvent {
                            detail_type: format!("{:?}", e.kind),
                            detail: serde_json::json!({
                                "eventId": format!("{}/{}", record.id, e.seq),
                                "executionId": record.id,
                                "seq": e.seq,
                                "tenant": record.tenant,
                                "pipelineId": record.pipeline_id,
                                "releaseVersion": record.release_version,
                                "step": e.step,
                                "stepId": e.step.and_then(|k| definition.step(k)).map(|s| s.id.clone()),
                                "code": e.code,
                                "at": e.at,
                            }),
                        })
                        .collect::<Vec<_>>();
                    if let Some(last) = record.events.last() {
                        outbox.events.push((record.id, last.seq, events));
                    }
                }
                Action::SendDeadLetter { id } => {
                    let envelope = DeadLetterEnvelope {
                        kind: DEAD_LETTER_KIND.to_string(),
                        dead_letter_id: *id,
                        execution_id: record.id,
                        tenant: record.tenant.clone(),
                        pipeline_id: record.pipeline_id.clone(),
                        release_version: record.release_version.clone(),
                        status: record.status,
                        step_index: record.step,
                        step_id: definition
                            .step(record.step)
                            .map(|s| s.id.clone())
                            .unwrap_or_default(),
                        attempt: record.attempt,
                        error: record.error.clone(),
                        failed_at: record.updated_at,
                        version: record.version,
                    };
                    tracing::warn!(
                        execution_id = %record.id, tenant = %record.tenant, step = record.step,
                        attempt = record.attempt, code = record.error.as_ref().map(|e| e.code.as_str()).unwrap_or(""),
                        "execution dead-lettered"
                    );
                    outbox.push(
                        &self.settings.queues.execution_dlq,
                        source,
                        json(&envelope),
                        Some((record.id, Event::DeadLetterSent { id: *id })),
                    );
                }
            }
        }
    }

    /// A fan-out step's children: one StartExecution message per item on the start queue, each with
    /// the interaction it completes. Started idempotently (the message id names parent, step and item,
    /// not the attempt), so re-sending them after a crash starts nothing twice, and a later attempt of
    /// the step (a retry, a re-drive) meets the same children: see `Event::Rejoin`.
    fn stage_children(
        &self,
        outbox: &mut Outbox,
        record: &Execution,
        step_def: &StepDef,
        await_unit: &AwaitUnit,
        source: usize,
    ) {
        let Some(start_queue) = &self.settings.queues.start else {
            tracing::error!(execution_id = %record.id, step = %step_def.id, "fan-out without a start queue");
            return;
        };
        if record
            .step_input(record.step)
            .is_some_and(domain::machine::items_in_an_object)
        {
            // Read in pages after the commits (`start_from_object`).
            outbox.fan_outs.push(FanOutJob {
                source,
                record: record.clone(),
                step: step_def.clone(),
            });
            return;
        }
        let items = record
            .step_input(record.step)
            .and_then(|p| p.value().get("items").and_then(Value::as_array).cloned())
            .unwrap_or_default();
        // With a window, the first wave only: each child's end starts the next (`child_ended`).
        let count = await_unit
            .fan_out
            .map_or(items.len(), |f| f.first_wave() as usize)
            .min(items.len());
        for (i, item) in items.into_iter().take(count).enumerate() {
            let keys = outbox.keys.as_deref();
            let start = match self.child_start(
                keys,
                record,
                step_def,
                await_unit.id,
                i as u32,
                item,
            ) {
                Ok(start) => start,
                // Not marked sent: the sweeper starts the children again.
                Err(e) => {
                    tracing::error!(execution_id = %record.id, code = %e.code(), error = %e, "fan-out children not started");
                    return;
                }
            };
            // Marked sent once the last one went out and none of this execution's sends failed.
            let then = (i + 1 == count).then_some((
                record.id,
                Event::AwaitNoticeSent {
                    unit: await_unit.id,
                },
            ));
            outbox.push(start_queue, source, start, then);
        }
        tracing::info!(execution_id = %record.id, step = %step_def.id, children = count, "fan-out started");
    }

    /// The start of the child of item `item` (its input `input`) of fan-out `unit`: a StartExecution
    /// event whose id names parent, step and item (not the attempt), with the parent's link signed
    /// under the coordinator's key (without the key, nothing is started: the caller tries again).
    pub(super) fn child_start(
        &self,
        keys: Option<&SealKeys>,
        record: &Execution,
        step_def: &StepDef,
        unit: Uuid,
        item: u32,
        input: Value,
    ) -> Result<OutMessage, CoordinatorError> {
        let Some(child) = &step_def.child_pipeline else {
            return Err(CoordinatorError::Invalid(format!(
                "fan-out step {} without a child pipeline",
                step_def.id
            )));
        };
        let Some(keys) = keys else {
            return Err(StoreError::Unavailable(
                "the coordinator's key, to sign a child's link".into(),
            )
            .into());
        };
        let name = item_name(item);
        let event = StartEvent {
            id: crate::domain::fan_out_event_id(record.id, record.step, &name),
            detail_type: START_DETAIL_TYPE.to_string(),
            source: START_SOURCE.to_string(),
            detail: StartDetail {
                pipeline_id: child.clone(),
                tenant: record.tenant.clone(),
                input,
                release_version: None,
                parent: Some(
                    ParentLink {
                        execution_id: record.id,
                        token: fan_out_token(&record.secret, record.id, record.step, &name),
                        interaction: name,
                        complete_to: self.settings.queues.awaits.clone(),
                        unit: Some(unit),
                        step: record.step,
                        signature: None,
                    }
                    .signed(keys.current(), &record.tenant, child),
                ),
            },
        };
        Ok(json(&event))
    }

    /// A cancelled fan-out's children that have not answered: a cancel message for each on the launch
    /// queue (the launch function applies it to the child).
    fn stage_child_cancels(
        &self,
        outbox: &mut Outbox,
        record: &Execution,
        definition: &PipelineDef,
        unit: Uuid,
        source: usize,
    ) {
        let (Some(await_unit), Some(child)) = (
            record.await_unit.as_ref().filter(|u| u.id == unit),
            definition
                .step(record.step)
                .and_then(|s| s.child_pipeline.as_ref()),
        ) else {
            return;
        };
        // The ledger is not read here: a child that has ended ignores its cancel.
        let items = await_unit.fan_out.map_or(0, |f| f.items);
        let cancelled = items;
        for item in 0..items {
            let name = item_name(item);
            let message = ChildCancel {
                kind: CANCEL_CHILD_KIND.to_string(),
                execution_id: crate::domain::fan_out_child_id(
                    &record.tenant,
                    child,
                    record.id,
                    await_unit.step,
                    &name,
                ),
                token: fan_out_token(&record.secret, record.id, await_unit.step, &name),
                reason: format!("the parent {} was cancelled", record.id),
            };
            outbox.push(&self.settings.queues.launch, source, json(&message), None);
        }
        tracing::info!(execution_id = %record.id, children = cancelled, "fan-out cancelled");
    }

    fn request_header(
        &self,
        record: &Execution,
        step_id: &str,
        step: u32,
        attempt: u32,
        launch_id: Uuid,
        deadline: crate::domain::Timestamp,
    ) -> RequestHeader {
        RequestHeader {
            kind: REQUEST_KIND.to_string(),
            identity: Identity {
                pipeline_id: record.pipeline_id.clone(),
                contract_version: record.contract_version.clone(),
                release_version: record.release_version.clone(),
            },
            tenant: record.tenant.clone(),
            execution_id: record.id,
            step_id: step_id.to_string(),
            step_index: step,
            attempt,
            launch_id,
            step_key: match record.secret.is_empty() {
                true => String::new(),
                false => domain::ids::step_key(&record.secret, record.id, step),
            },
            reply_to: self.settings.queues.reply.clone(),
            deadline,
            reply_token: match record.secret.is_empty() {
                true => String::new(),
                false => domain::reply_token(&record.secret, launch_id),
            },
        }
    }

    /// Sends everything staged, batched per queue, then applies the follow-up event of each message
    /// that went out. Returns the failures, by the index of the message whose commit staged them: a
    /// batch leaves that message unacknowledged, and its redelivery sends again what its commit
    /// staged (`domain::reply_actions`). The sweeper stays the last resort: the committed record is
    /// due at its lease expiry, step deadline or dead-letter check.
    pub(super) async fn flush(&self, outbox: Outbox) -> Vec<(usize, SendError)> {
        let mut failures = Vec::new();
        let mut follow_ups = Vec::new();
        if let Some(publisher) = &self.publisher {
            let all: Vec<BusEvent> = outbox
                .events
                .iter()
                .flat_map(|(_, _, events)| events.iter().cloned())
                .collect();
            if !all.is_empty() {
                let mut results = publisher.publish(&all).await.into_iter();
                for (execution, through, events) in &outbox.events {
                    // Consume every event's result, so the next execution's line up.
                    let mut ok = true;
                    for _ in events {
                        ok &= results.next().is_some_and(|r| r.is_ok());
                    }
                    if ok {
                        follow_ups.push((*execution, Event::EventsPublished { through: *through }));
                    } else {
                        tracing::warn!(execution_id = %execution, "lifecycle events not published; the sweeper will retry");
                    }
                }
            }
        }
        for (queue, entries) in outbox.by_queue {
            let messages: Vec<OutMessage> = entries.iter().map(|e| e.message.clone()).collect();
            let results = self.sender.send(&queue, &messages).await;
            for (entry, result) in entries.into_iter().zip(results) {
                match result {
                    Ok(()) => follow_ups.extend(entry.then),
                    Err(e) => {
                        tracing::warn!(error = %e, "send failed after commit");
                        failures.push((entry.source, e));
                    }
                }
            }
        }
        // An await notice may span several messages (a fan-out's children): confirm it only when no
        // send of this flush failed; otherwise the sweeper sends it all again (idempotently).
        if !failures.is_empty() {
            follow_ups.retain(|(_, event)| !matches!(event, Event::AwaitNoticeSent { .. }));
        }
        for (id, event) in follow_ups {
            if let Err(e) = self
                .commit_event(id, &event, Role::Outbox, Read::Fresh)
                .await
            {
                tracing::warn!(execution_id = %id, code = %e.code(), error = %e, "follow-up not recorded; the sweeper will repeat it");
            }
        }
        for job in outbox.fan_outs {
            let id = job.record.id;
            let keys = outbox.keys.clone();
            if let Err(e) = self.start_from_object(keys, &job.record, &job.step).await {
                tracing::warn!(execution_id = %id, code = %e.code(), error = %e, "fan-out not started; the sweeper will start it again");
                failures.push((
                    job.source,
                    SendError {
                        queue: "start".into(),
                        reason: e.to_string(),
                    },
                ));
            }
        }
        failures
    }
}

/// A message of a wire type.
fn json(body: &impl serde::Serialize) -> OutMessage {
    OutMessage::new(serde_json::to_string(body).expect("wire types serialize"))
}

/// Messages staged during a batch, grouped by destination queue so each queue gets `SendMessageBatch`es.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    /// The sealing keys the cycle seals requests and signs children's links with, taken once at
    /// its start (none: requests go unsealed and children cannot start).
    pub(super) keys: Option<Arc<SealKeys>>,
    by_queue: BTreeMap<String, Vec<Staged>>,
    /// Lifecycle events to publish: (execution, last sequence, events).
    events: Vec<(Uuid, u64, Vec<BusEvent>)>,
    /// Fan-outs whose items are read from an object, to start after the sends.
    pub(super) fan_outs: Vec<FanOutJob>,
}

/// A fan-out to start from an object: the committed record and its step.
#[derive(Debug)]
pub(super) struct FanOutJob {
    pub source: usize,
    pub record: Execution,
    pub step: StepDef,
}

#[derive(Debug)]
struct Staged {
    /// Index of the message (of the batch being handled) whose decision staged this one.
    source: usize,
    message: OutMessage,
    /// Event to apply once the message is sent.
    then: Option<(Uuid, Event)>,
}

impl Outbox {
    /// An empty outbox sealing with `keys`.
    pub(super) fn sealing_with(keys: Option<Arc<SealKeys>>) -> Self {
        Self {
            keys,
            ..Self::default()
        }
    }

    /// Appends what another outbox staged (a batch merges its messages' outboxes in message order).
    pub(super) fn extend(&mut self, other: Outbox) {
        for (queue, entries) in other.by_queue {
            self.by_queue.entry(queue).or_default().extend(entries);
        }
        self.events.extend(other.events);
        self.fan_outs.extend(other.fan_outs);
    }

    fn push(
        &mut self,
        queue: &str,
        source: usize,
        message: OutMessage,
        then: Option<(Uuid, Event)>,
    ) {
        self.by_queue
            .entry(queue.to_string())
            .or_default()
            .push(Staged {
                source,
                message,
                then,
            });
    }
}

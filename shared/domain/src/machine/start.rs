//! A new execution: its record at step 0 and what its creation sends.

use super::*;

/// Creates the record of a new execution together with the lease and launch work of its first step.
pub fn start(new: NewExecution<'_>, ctx: &Context) -> (Execution, Vec<Action>) {
    let def = new.definition;
    let mut record = Execution {
        id: new.id,
        tenant: new.tenant.to_string(),
        pipeline_id: def.pipeline_id.clone(),
        release_version: def.release_version.clone(),
        contract_version: new.contract_version,
        idempotency_key: new.idempotency_key,
        status: Status::Queued,
        step: 0,
        attempt: 0,
        budget_base: 0,
        version: 1,
        generation: 0,
        lease: None,
        wake_at: Some(ctx.now),
        launch_id: None,
        resends: 0,
        input: Payload::new(new.input),
        first_step: 0,
        steps: Vec::new(),
        result: None,
        error: None,
        redrives: Vec::new(),
        dead_letter: None,
        incidents: Vec::new(),
        await_unit: None,
        parent: None,
        parent_notified: false,
        events: Vec::new(),
        event_seq: 0,
        publish_by: None,
        publish_attempts: 0,
        secret: new_secret(ctx.secret),
        launched_at: None,
        write_id: write_id(ctx),
        history: Vec::new(),
        history_base: 0,
        indexed_due: None,
        created_at: ctx.now,
        updated_at: ctx.now,
    };
    history::started(&mut record);
    let mut actions = vec![take_lease(&mut record, ctx, Duration::ZERO)];
    announce_start(&mut record, None, ctx, &mut actions);
    record.indexed_due = record.index_due();
    (record, actions)
}

/// With lifecycle events on: `ExecutionStarted`, then what launching the first step amounted to (from
/// `queued`, the record before it), in the outbox of the creating write.
pub(super) fn announce_start(
    record: &mut Execution,
    queued: Option<&Execution>,
    ctx: &Context,
    actions: &mut Vec<Action>,
) {
    if !ctx.lifecycle {
        return;
    }
    record.events.push(LifecycleEvent {
        seq: 0,
        kind: LifecycleKind::ExecutionStarted,
        at: ctx.now,
        step: None,
        code: None,
    });
    record.event_seq = 1;
    if let Some(queued) = queued {
        record_lifecycle(queued, record, ctx);
    }
    record.publish_by = Some(ctx.now + ctx.lease);
    actions.push(Action::PublishEvents);
}

/// Creates the record of a new execution with its first step already launched: the record is saved
/// as launching, with the step's deterministic launch id, in the same write that creates it, and the
/// returned actions send the request (or await notice, or children). No launch work, no second write:
/// this is how the coordinator submits. A crash before the send leaves the record due at the step's
/// deadline, when the sweeper re-sends the same launch id.
pub fn start_launched(new: NewExecution<'_>, ctx: &Context) -> (Execution, Vec<Action>) {
    let def = new.definition;
    // The start is announced below, once the first step is launched.
    let unannounced = Context {
        lifecycle: false,
        ..ctx.clone()
    };
    let (mut record, _) = start(new, &unannounced);
    record.lease = None;
    record.generation = 0;
    let queued = record.clone();
    let mut actions = launch_attempt(&mut record, def, ctx, 1);
    history::observe(&queued, &mut record, history::Cause::Other, ctx.now);
    announce_start(&mut record, Some(&queued), ctx, &mut actions);
    // Its first write: the entry is keyed by the launched step's due time (the lease `start` took
    // for the launch is never written).
    record.indexed_due = None;
    record.indexed_due = record.index_due();
    (record, actions)
}

/// What the creating write of `record` launched, to send again while nothing has happened since (the
/// record is at its first version): a duplicate submit cannot tell whether the first submitter's send
/// went out, and the worker deduplicates on the launch id.
pub fn creation_actions(record: &Execution) -> Vec<Action> {
    if record.version != 1 {
        return Vec::new();
    }
    match (record.status, &record.await_unit, record.launch_id) {
        (Status::WaitingExternal, Some(unit), _) => vec![Action::SendAwaitNotice { unit: unit.id }],
        (Status::Running, _, Some(launch_id)) => vec![Action::SendRequest {
            step: record.step,
            attempt: record.attempt,
            launch_id,
            deadline: record.wake_at.unwrap_or(record.created_at),
        }],
        _ => Vec::new(),
    }
}

//! The coordinator's state machine: `decide(record, definition, context, event)` returns the new record
//! and the effects to carry out, or why nothing is written. No I/O: handlers load, decide, commit
//! conditionally on the version read, then perform the actions.
//!
//! | status                    | event               | guard                                         | next status / effect                                  |
//! |---------------------------|---------------------|-----------------------------------------------|-------------------------------------------------------|
//! | not terminal              | Claim               | due, lease absent or expired                  | lease (gen+1) · EnqueueLaunch                         |
//! | terminal                  | Claim               | due: dead letter/parent notice unsent         | SendDeadLetter/NotifyParent again                     |
//! | any                       | Claim               | only the outbox due, tries left               | PublishEvents again, next check backed off            |
//! | any                       | Claim               | only the outbox due, none left/events off     | outbox dropped, EVENTS_DROPPED incident               |
//! | QUEUED/WAIT_RETRY         | LaunchWork          | lease generation+token match, task            | RUNNING, step `launching` · SendRequest               |
//! | QUEUED/WAIT_RETRY         | LaunchWork          | lease match, await step                       | WAITING_EXTERNAL, await unit · SendAwaitNotice        |
//! | QUEUED/WAIT_RETRY         | LaunchWork          | lease match, fan-out over n > 0 items         | WAITING_EXTERNAL, fan-out unit of n · SendAwaitNotice |
//! | QUEUED/WAIT_RETRY         | LaunchWork          | lease match, fan-out over no items            | step done: next step launched, or SUCCEEDED           |
//! | QUEUED/WAIT_RETRY         | LaunchWork          | lease match, fan-out, items in an object      | WAITING_EXTERNAL, unit to size · SendAwaitNotice      |
//! | RUNNING                   | LaunchWork          | lease match, deadline passed, no resend       | same launch re-sent · SendRequest                     |
//! | RUNNING                   | LaunchWork          | lease match, deadline passed, resent          | attempt failed: STEP_TIMEOUT, retryable               |
//! | RUNNING/WAITING_EXTERNAL  | LaunchWork          | lease match, nothing due under it             | lease released                                        |
//! | WAITING_EXTERNAL          | LaunchWork          | lease match, due, before the deadline         | SendAwaitNotice again, checked a lease later          |
//! | WAITING_EXTERNAL          | LaunchWork          | lease match, await deadline passed            | step failed: AWAIT_TIMEOUT, FAILED                    |
//! | RUNNING                   | Reply               | current launch, ok, steps left                | output kept, next step launched (as above)            |
//! | RUNNING                   | Reply               | current launch, ok, last step                 | SUCCEEDED with result, off the due index              |
//! | RUNNING                   | Reply               | current launch, error, retry in ≤ 900 s       | WAIT_RETRY, lease · EnqueueLaunch(delay)              |
//! | RUNNING                   | Reply               | current launch, error, retry in > 900 s       | WAIT_RETRY, no lease, due at the retry time           |
//! | RUNNING                   | Reply               | current launch, error, no retry               | FAILED, dead letter marked · SendDeadLetter           |
//! | RUNNING/WAIT_RETRY/QUEUED | Reply               | ok of an unanswered attempt of the step       | adopted: applied like the current one                 |
//! | RUNNING                   | Heartbeat           | current launch, extends the deadline          | deadline extended (≤ 12 step timeouts)                |
//! | FAILED/DLQ                | Redrive             | expected version                              | QUEUED, new budget, lease · EnqueueLaunch             |
//! | not terminal              | Cancel              |                                               | CANCELLED · NotifyCancel / CancelChildren             |
//! | not terminal              | CancelFromParent    | the parent's token                            | CANCELLED · NotifyCancel if RUNNING                   |
//! | FAILED/DLQ                | DeadLetterSent      | same dead-letter id, unsent                   | marked sent, leaves the due index                     |
//! | WAITING_EXTERNAL          | AwaitNoticeSent     | same unit, notice unsent                      | notice marked sent, due at the deadline               |
//! | WAITING_EXTERNAL          | CompleteInteraction | right token, approved, others pending         | completion noted, still waiting                       |
//! | WAITING_EXTERNAL          | CompleteInteraction | right token, approved, the last one           | succeeds, output = input + answers (as ok)            |
//! | WAITING_EXTERNAL          | CompleteInteraction | right token, rejected                         | step failed: REJECTED, FAILED                         |
//! | WAITING_EXTERNAL          | FanOutSized         | current unit to size, n > 0 items             | unit sized: n children, its tolerance                 |
//! | WAITING_EXTERNAL          | FanOutSized         | current unit to size, no items                | step done: next step launched, or SUCCEEDED           |
//! | WAITING_EXTERNAL          | FanOutSized         | current unit to size, items unreadable        | step failed with the reading's error                  |
//! | WAITING_EXTERNAL          | FanOutSettled       | current unit, all counted, failures tolerated | succeeds, output = input + results (as ok)            |
//! | WAITING_EXTERNAL          | FanOutSettled       | current unit, failures beyond tolerance       | step failed: FAN_OUT_FAILED · CancelChildren          |
//! | any                       | Incident            |                                               | noted on the record (latest ones kept)                |
//! | any                       | EventsPublished     | outbox holds events up to `through`           | those events leave the outbox                         |
//! | terminal                  | ParentNotified      | has a parent, not yet told                    | parent told, leaves the due index                     |
//! | FAILED/DLQ/CANCELLED      | Rejoin              | parent's token, another attempt               | QUEUED, new budget, lease · EnqueueLaunch             |
//! | SUCCEEDED                 | Rejoin              | parent's token, another attempt               | parent told again · NotifyParent                      |
//! | not terminal              | Rejoin              | parent's token, another attempt               | answers that attempt when it ends                     |
//!
//! "lease match": the launch work's generation and token are the record's lease's. "current launch":
//! the reply names the RUNNING record's step, attempt and launch id. "no retry": the attempt budget is
//! used up, or the error is not retryable (by the worker's word or the step's policy); such a failure
//! marks a dead-letter envelope in the same commit, sent after (`SendDeadLetter`) and marked sent by
//! `DeadLetterSent`. AWAIT_TIMEOUT, REJECTED and FAN_OUT_FAILED are never retried. A step is launched
//! by kind: a task as a request, an await step as an await unit announced on its queue, a fan-out as
//! an await unit of n children whose `SendAwaitNotice` is carried out as one child start per item on
//! the start queue (no notice). A child's end is counted in the fan-out ledger, outside the record
//! (`fan_out`); the count that settles the step is applied as `FanOutSettled`.
//!
//! A reply whose launch id already has a receipt is a duplicate (same bytes) or a conflict (other
//! bytes); a worker's message (`FromWorker`) is applied as the event it wraps once its reply token and
//! pinned release check out, else refused. An event that matches no row is skipped or refused
//! (`Skip`, `Rejection`): nothing is written.
//!
//! `decide` adds to the commit of any row:
//!
//! | status       | event                                                        | guard                                      | effect added                             |
//! |--------------|--------------------------------------------------------------|--------------------------------------------|------------------------------------------|
//! | not terminal | Reply/LaunchWork/CompleteInteraction/Cancel/CancelFromParent | ends a fan-out child (parent set)          | + NotifyParent, due until ParentNotified |
//! | any          | any                                                          | lifecycle events on, the change makes some | + events in the outbox · PublishEvents   |
//!
//! The rows are `TRANSITIONS` and `APPENDED`, each naming the tests that cover it; the state-machine
//! tests check that these tables are complete and that every test they name exists.

use serde_json::{json, Value};
use uuid::Uuid;

use super::codes::Code;
use super::crypto::same;
use super::execution::{
    AwaitUnit, DeadLetterMark, Execution, Incident, Interaction, InteractionCompletion, Lease,
    LifecycleEvent, LifecycleKind, Receipt, RedriveNote, Status, StepError, StepProgress,
    StepStatus, Verdict, MAX_EARLIER_RECEIPTS, MAX_INCIDENTS, MAX_INCIDENT_DETAIL,
    MAX_REDRIVE_NOTES,
};
use super::fan_out::{item_name, FanOutUnit, Tally};
use super::history;
use super::ids::{fan_out_token, launch_id, new_secret, reply_token};
use super::payload::{Payload, REF_FIELD};
use super::pipeline::{PipelineDef, StepKind};
use crate::planted::{self, Bug};

mod transitions;

pub use transitions::{EventKind, Transition, ANY_STATUS, APPENDED, LIVE, TERMINAL, TRANSITIONS};

/// A launched attempt with no reply by its deadline has its request re-sent this many times (same launch
/// id, recovering a crash between save and send) before the attempt is declared timed out.
pub const MAX_RESENDS: u32 = 1;
/// SQS `DelaySeconds` upper bound; longer retry waits are left to the due-time index.
pub const MAX_DELAY_SECONDS: u64 = 900;

/// Inputs from the world that the machine must not fetch itself.
#[derive(Debug, Clone)]
pub struct Context {
    /// Epoch milliseconds.
    pub now: i64,
    /// Uniform in `[0, 1)`, for full-jitter backoff.
    pub jitter: f64,
    /// A fresh token for a lease this decision may take.
    pub token: Uuid,
    /// A fresh reply secret for an execution this decision may create: 128 random bits drawn on their
    /// own, sharing nothing with `token` (whose bits the record shows as its lease and write id).
    pub secret: [u8; 16],
    /// Who acts (handler name and instance), recorded as lease owner.
    pub owner: String,
    pub lease_ms: i64,
    /// Record lifecycle events in the outbox (published to the event bus after each commit).
    pub lifecycle: bool,
}

/// Outcome reported by a worker for one launch.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Succeeded(Value),
    Failed(StepError),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The sweeper found the execution due.
    Claim,
    /// Launch work carrying the lease it was enqueued under.
    LaunchWork {
        generation: u64,
        token: Uuid,
    },
    /// A worker's reply.
    Reply {
        launch_id: Uuid,
        step: u32,
        attempt: u32,
        fingerprint: String,
        outcome: Outcome,
    },
    /// Operator re-drive of a FAILED or DLQ execution.
    Redrive {
        expected_version: u64,
        reason: String,
    },
    Cancel {
        reason: String,
    },
    /// A fan-out child's parent was cancelled: the child is cancelled too. `token` is the parent's
    /// resume token for this child (only the parent's coordinator can derive it).
    CancelFromParent {
        token: String,
        reason: String,
    },
    /// A running worker's sign of life: extends the attempt's deadline.
    Heartbeat {
        launch_id: Uuid,
        step: u32,
        attempt: u32,
    },
    /// The dead-letter envelope `id` reached the execution DLQ.
    DeadLetterSent {
        id: Uuid,
    },
    /// A message about this execution went to a DLQ.
    Incident {
        code: String,
        detail: String,
    },
    /// The announcement of await unit `unit` reached its queue.
    AwaitNoticeSent {
        unit: Uuid,
    },
    /// Lifecycle events up to sequence `through` reached the event bus.
    EventsPublished {
        through: u64,
    },
    /// The parent (of a fan-out child) was told of this execution's end.
    ParentNotified,
    /// The parent's fan-out step ran again (a retry, a re-drive) and started this child again: child
    /// ids are stable per item, so it is the same execution. `token` is the parent's resume token for
    /// it, which only the parent's coordinator can derive.
    Rejoin {
        token: String,
        /// The parent's await unit of this attempt: the child's end answers it.
        unit: Option<Uuid>,
    },
    /// A reply or heartbeat as a worker sent it: applied only if `sender` proves it answers a request
    /// the coordinator issued for this execution (the launch's reply token) and names the execution's
    /// pinned release. Everything read off the reply queue arrives wrapped so.
    FromWorker {
        sender: Sender,
        event: Box<Event>,
    },
    /// The items of fan-out `unit`, held in an object (a claim-checked input, `itemsFrom`), were
    /// counted before any child starts: `items`, or why they cannot be read (the step fails).
    FanOutSized {
        unit: Uuid,
        items: Result<u32, StepError>,
    },
    /// The fan-out ledger counted enough of fan-out `unit`'s children to settle the step: all of them,
    /// or more failed ones than it tolerates. `results`: every child's end in item order (as the
    /// coordinator read them from the ledger, possibly claim-checked), when all were counted.
    FanOutSettled {
        unit: Uuid,
        tally: Tally,
        results: Value,
    },
    /// Someone completed an interaction of the current await unit.
    CompleteInteraction {
        interaction: String,
        token: String,
        verdict: Verdict,
        payload: Value,
        /// Fingerprint of the verdict and payload.
        fingerprint: String,
        /// The await unit the answer is for (none: the current one); an earlier unit's is stale.
        unit: Option<Uuid>,
    },
}

/// What a worker's reply says of who sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sender {
    /// The reply token of the launch (copied from the request).
    pub token: String,
    pub pipeline_id: String,
    pub contract_version: String,
    pub release_version: String,
}

/// The sweeper re-publishes an unconfirmed outbox this many times (backing off) before dropping it.
pub const MAX_PUBLISH_ATTEMPTS: u32 = 8;
/// The incident code of a dropped outbox.
pub const EVENTS_DROPPED: &str = Code::EventsDropped.as_str();

/// A heartbeat extends an attempt's deadline to at most this many step timeouts after its launch.
pub const MAX_HEARTBEAT_TIMEOUTS: i64 = 12;

/// Effects to carry out after the commit.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send the request envelope of the record's current step and attempt to its worker.
    SendRequest {
        step: u32,
        attempt: u32,
        launch_id: Uuid,
        deadline: i64,
    },
    /// Put launch work on the launch queue, under the lease the decision took.
    EnqueueLaunch {
        generation: u64,
        token: Uuid,
        delay_secs: u32,
    },
    /// Send the dead-letter envelope of the record's failure to the execution DLQ.
    SendDeadLetter { id: Uuid },
    /// Tell the worker of an in-flight launch that the execution was cancelled (best effort).
    NotifyCancel { step: u32, launch_id: Uuid },
    /// Announce the record's await unit (interactions, tokens, deadline) on the await step's queue.
    SendAwaitNotice { unit: Uuid },
    /// Publish the record's outbox of lifecycle events.
    PublishEvents,
    /// Tell the parent (of a fan-out child) that this execution ended (its end is counted in the
    /// parent's fan-out ledger).
    NotifyParent,
    /// Cancel the children of fan-out `unit` (a message to each, proving the parent's token for it; a
    /// child that has ended ignores it).
    CancelChildren { unit: Uuid },
}

/// Why a decision writes nothing. None of these is an error: the message is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Not due yet (a held lease makes an execution due only at its expiry).
    NotDue,
    Terminal,
    /// The lease the work was enqueued under is no longer the record's (taken over or released).
    Fenced,
    /// A reply for an attempt that is no longer current (superseded by a timeout retry).
    Stale,
    /// The same reply, byte for byte, was already applied.
    Duplicate,
    /// A heartbeat for an attempt that already ran as long as heartbeats may extend it.
    Capped,
}

/// A decision that refuses the event: reported, never applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error(
        "launch id {launch_id} does not belong to this execution's step {step} attempt {attempt}"
    )]
    UnknownCorrelation {
        launch_id: Uuid,
        step: u32,
        attempt: u32,
    },
    #[error("launch id {launch_id} was already applied with different bytes")]
    Conflict { launch_id: Uuid },
    #[error("expected version {expected}, found {actual}")]
    VersionMismatch { expected: u64, actual: u64 },
    #[error("status {0} cannot be re-driven (only FAILED or DLQ)")]
    NotRedrivable(Status),
    #[error("execution is already {0}")]
    AlreadyTerminal(Status),
    #[error("execution is {0}, not waiting on this interaction")]
    NotWaiting(Status),
    #[error("no interaction {0:?} in the current await unit")]
    UnknownInteraction(String),
    #[error("the resume token does not match")]
    InvalidToken,
    #[error("interaction {0:?} was already completed with another answer")]
    InteractionConflict(String),
    #[error("the await unit's deadline has passed")]
    AwaitExpired,
    #[error("the reply token does not match launch {0}")]
    Unauthenticated(Uuid),
    #[error("the reply names {claimed}, the execution is pinned to {pinned}")]
    IdentityMismatch { claimed: String, pinned: String },
}

impl Rejection {
    /// Stable error code.
    pub fn code(&self) -> Code {
        match self {
            Rejection::UnknownCorrelation { .. } => Code::UnknownCorrelation,
            Rejection::Conflict { .. } => Code::ReceiptConflict,
            Rejection::VersionMismatch { .. } => Code::VersionConflict,
            Rejection::NotRedrivable(_) => Code::NotRedrivable,
            Rejection::AlreadyTerminal(_) => Code::AlreadyTerminal,
            Rejection::NotWaiting(_) => Code::NotWaiting,
            Rejection::UnknownInteraction(_) => Code::UnknownInteraction,
            Rejection::InvalidToken => Code::InvalidToken,
            Rejection::InteractionConflict(_) => Code::InteractionConflict,
            Rejection::AwaitExpired => Code::AwaitExpired,
            Rejection::Unauthenticated(_) => Code::Unauthenticated,
            Rejection::IdentityMismatch { .. } => Code::IdentityMismatch,
        }
    }

    /// Whether the message failed to prove it came from a party the coordinator addressed (wrong
    /// reply token or resume token): such a message writes nothing to the execution it names.
    pub fn is_unauthenticated(&self) -> bool {
        matches!(
            self,
            Rejection::Unauthenticated(_) | Rejection::InvalidToken
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Commit {
        record: Box<Execution>,
        actions: Vec<Action>,
    },
    Skip(Skip),
    Reject(Rejection),
}

/// What a new execution is created from.
#[derive(Debug, Clone)]
pub struct NewExecution<'a> {
    pub id: Uuid,
    pub tenant: &'a str,
    /// The pinned release's definition.
    pub definition: &'a PipelineDef,
    /// The pinned release's contract version, as registered (never hashed again on a submit).
    pub contract_version: String,
    pub input: Value,
    pub idempotency_key: Option<String>,
}

impl<'a> NewExecution<'a> {
    /// A new execution of `definition`, its contract version computed from it (tests and tools; the
    /// coordinator takes the registered one).
    pub fn of(id: Uuid, tenant: &'a str, definition: &'a PipelineDef, input: Value) -> Self {
        Self {
            id,
            tenant,
            definition,
            contract_version: super::contract::Contract::of(definition).contract_version,
            input,
            idempotency_key: None,
        }
    }
}

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
    let mut actions = vec![take_lease(&mut record, ctx, 0)];
    announce_start(&mut record, None, ctx, &mut actions);
    record.indexed_due = record.index_due();
    (record, actions)
}

/// With lifecycle events on: `ExecutionStarted`, then what launching the first step amounted to (from
/// `queued`, the record before it), in the outbox of the creating write.
fn announce_start(
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
    record.publish_by = Some(ctx.now + ctx.lease_ms);
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

/// What an event tells the execution's history about its cause.
fn cause(event: &Event) -> history::Cause<'_> {
    match event {
        Event::FromWorker { event, .. } => cause(event),
        Event::Heartbeat { step, attempt, .. } => history::Cause::Heartbeat {
            step: *step,
            attempt: *attempt,
        },
        Event::Reply {
            step,
            attempt,
            outcome,
            ..
        } => history::Cause::Reply {
            step: *step,
            attempt: *attempt,
            output: match outcome {
                Outcome::Succeeded(v) => Some(v),
                Outcome::Failed(_) => None,
            },
        },
        _ => history::Cause::Other,
    }
}

/// The transition function.
pub fn decide(record: &Execution, def: &PipelineDef, ctx: &Context, event: &Event) -> Decision {
    let mut decision = transition(record, def, ctx, event);
    if let Decision::Commit {
        record: next,
        actions,
    } = &mut decision
    {
        // A fan-out child that just ended tells its parent (again by the sweeper until confirmed).
        if next.parent.is_some() && next.status.is_terminal() && !record.status.is_terminal() {
            next.parent_notified = false;
            next.wake_at = next.wake_at.or(Some(ctx.now + ctx.lease_ms));
            actions.push(Action::NotifyParent);
        }
        history::observe(record, next, cause(event), ctx.now);
    }
    let claimed = matches!(event, Event::Claim);
    if !ctx.lifecycle {
        return keyed(decision, claimed);
    }
    keyed(
        match decision {
            Decision::Commit {
                record: mut next,
                mut actions,
            } => {
                record_lifecycle(record, &mut next, ctx);
                if !next.events.is_empty()
                    && !matches!(event, Event::EventsPublished { .. })
                    && !actions.contains(&Action::PublishEvents)
                {
                    actions.push(Action::PublishEvents);
                }
                Decision::Commit {
                    record: next,
                    actions,
                }
            }
            other => other,
        },
        claimed,
    )
}

/// Appends to the outbox the lifecycle events a transition from `before` to `next` amounts to.
fn record_lifecycle(before: &Execution, next: &mut Execution, ctx: &Context) {
    let mut found: Vec<(LifecycleKind, Option<u32>, Option<String>)> = Vec::new();
    for k in next.steps_succeeded_since(before) {
        found.push((LifecycleKind::StepSucceeded, Some(k), None));
    }
    for (step, k) in next.steps.iter().zip(next.first_step..) {
        let was = before.progress(k);
        let k = Some(k);
        if step.status == StepStatus::Failed
            && (was.map(|w| (w.status, w.receipt.as_ref(), w.error.as_ref()))
                != Some((
                    StepStatus::Failed,
                    step.receipt.as_ref(),
                    step.error.as_ref(),
                )))
        {
            let code = step.error.as_ref().map(|e| e.code.clone());
            found.push((LifecycleKind::StepFailed, k, code));
        }
    }
    if next.status != before.status {
        let kind = match next.status {
            Status::WaitingExternal => Some(LifecycleKind::AwaitRequested),
            Status::Succeeded => Some(LifecycleKind::ExecutionSucceeded),
            Status::Failed | Status::Dlq => Some(LifecycleKind::ExecutionFailed),
            Status::Cancelled => Some(LifecycleKind::ExecutionCancelled),
            _ => None,
        };
        if let Some(kind) = kind {
            let code = next.error.as_ref().map(|e| e.code.clone());
            found.push((kind, Some(next.step), code));
        }
    }
    for (kind, step, code) in found {
        next.events.push(LifecycleEvent {
            seq: next.event_seq,
            kind,
            at: ctx.now,
            step,
            code,
        });
        next.event_seq += 1;
    }
    if !next.events.is_empty() && before.events.len() < next.events.len() {
        next.publish_by = Some(ctx.now + ctx.lease_ms);
    }
}

fn transition(record: &Execution, def: &PipelineDef, ctx: &Context, event: &Event) -> Decision {
    match event {
        Event::Claim => claim(record, ctx),
        Event::LaunchWork { generation, token } => {
            launch_work(record, def, ctx, *generation, *token)
        }
        Event::Reply {
            launch_id,
            step,
            attempt,
            fingerprint,
            outcome,
        } => reply(
            record,
            def,
            ctx,
            (*launch_id, *step, *attempt),
            fingerprint,
            outcome,
        ),
        Event::Redrive {
            expected_version,
            reason,
        } => redrive(record, ctx, *expected_version, reason),
        Event::Cancel { reason } => cancel(record, def, ctx, reason),
        Event::CancelFromParent { token, reason } => {
            let Some(parent) = &record.parent else {
                return Decision::Reject(Rejection::InvalidToken);
            };
            if !same(parent.token.as_bytes(), token.as_bytes()) {
                return Decision::Reject(Rejection::InvalidToken);
            }
            if record.status.is_terminal() {
                return Decision::Skip(Skip::Terminal);
            }
            cancel(record, def, ctx, reason)
        }
        Event::Heartbeat {
            launch_id,
            step,
            attempt,
        } => heartbeat(record, def, ctx, (*launch_id, *step, *attempt)),
        Event::FromWorker { sender, event } => match authenticate(record, sender, event) {
            Ok(()) => transition(record, def, ctx, event),
            Err(rejection) => Decision::Reject(rejection),
        },
        Event::DeadLetterSent { id } => dead_letter_sent(record, ctx, *id),
        Event::AwaitNoticeSent { unit } => await_notice_sent(record, ctx, *unit),
        Event::Rejoin { token, unit } => rejoin(record, ctx, token, *unit),
        Event::ParentNotified => {
            if record.parent.is_none() || record.parent_notified || !record.status.is_terminal() {
                return Decision::Skip(Skip::Duplicate);
            }
            let mut next = bump(record, ctx);
            next.parent_notified = true;
            if !next.terminal_work_pending() {
                next.wake_at = None;
            }
            commit(next, Vec::new())
        }
        Event::EventsPublished { through } => {
            if !record.events.iter().any(|e| e.seq <= *through) {
                return Decision::Skip(Skip::Duplicate);
            }
            let mut next = bump(record, ctx);
            next.events.retain(|e| e.seq > *through);
            if next.events.is_empty() {
                next.publish_by = None;
                next.publish_attempts = 0;
            }
            commit(next, Vec::new())
        }
        Event::CompleteInteraction {
            interaction,
            token,
            verdict,
            payload,
            fingerprint,
            unit,
        } => complete_interaction(
            record,
            def,
            ctx,
            (interaction, *unit),
            token,
            *verdict,
            payload,
            fingerprint,
        ),
        Event::FanOutSettled {
            unit,
            tally,
            results,
        } => settle_fan_out(record, def, ctx, *unit, tally, results),
        Event::FanOutSized { unit, items } => size_fan_out(record, def, ctx, *unit, items),
        Event::Incident { code, detail } => {
            let mut next = bump(record, ctx);
            note_incident(&mut next, ctx, code, detail);
            commit(next, Vec::new())
        }
    }
}

/// Notes an incident on the record: the latest `MAX_INCIDENTS` are kept, each detail cut to
/// `MAX_INCIDENT_DETAIL` bytes (the DLQ the message went to holds it whole).
fn note_incident(next: &mut Execution, ctx: &Context, code: &str, detail: &str) {
    next.incidents.push(Incident {
        at: ctx.now,
        code: code.to_string(),
        detail: truncated(detail, MAX_INCIDENT_DETAIL),
    });
    let excess = next.incidents.len().saturating_sub(MAX_INCIDENTS);
    next.incidents.drain(..excess);
}

/// `text` cut to at most `max` bytes on a character boundary, marked when cut.
pub fn truncated(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// Checks a worker's message against the record: the reply token of the launch it names (when the
/// record has a secret: records created before reply tokens have none) and the pinned release.
fn authenticate(record: &Execution, sender: &Sender, event: &Event) -> Result<(), Rejection> {
    let launch = match event {
        Event::Reply { launch_id, .. } | Event::Heartbeat { launch_id, .. } => *launch_id,
        _ => return Err(Rejection::Unauthenticated(Uuid::nil())),
    };
    if !record.secret.is_empty()
        && !planted::active(Bug::AcceptsUnauthenticatedReplies)
        && !same(
            reply_token(&record.secret, launch).as_bytes(),
            super::seal::split_token(&sender.token).0.as_bytes(),
        )
    {
        return Err(Rejection::Unauthenticated(launch));
    }
    let pinned = (record.pipeline_id.as_str(), record.release_version.as_str());
    let contract_matches =
        record.contract_version.is_empty() || record.contract_version == sender.contract_version;
    if pinned != (sender.pipeline_id.as_str(), sender.release_version.as_str()) || !contract_matches
    {
        return Err(Rejection::IdentityMismatch {
            claimed: format!(
                "{} release {} ({})",
                sender.pipeline_id, sender.release_version, sender.contract_version
            ),
            pinned: format!(
                "{} release {} ({})",
                record.pipeline_id, record.release_version, record.contract_version
            ),
        });
    }
    Ok(())
}

fn claim(record: &Execution, ctx: &Context) -> Decision {
    // Only the outbox is due: publish it (again) and look back later, less often each time. An
    // outbox that cannot be published (events switched off, or a bus that keeps failing) is not
    // rewritten forever: it is dropped, and the drop noted on the record and counted.
    let outbox_due = record.publish_by.is_some_and(|p| p <= ctx.now) && !record.events.is_empty();
    if outbox_due && record.work_due_at().is_none_or(|w| w > ctx.now) {
        let mut next = bump(record, ctx);
        if !ctx.lifecycle || record.publish_attempts + 1 >= MAX_PUBLISH_ATTEMPTS {
            let reason = if ctx.lifecycle {
                format!("not confirmed after {MAX_PUBLISH_ATTEMPTS} attempts")
            } else {
                "lifecycle events are switched off".to_string()
            };
            let detail = format!("{} lifecycle events dropped: {reason}", next.events.len());
            note_incident(&mut next, ctx, EVENTS_DROPPED, &detail);
            next.events.clear();
            next.publish_by = None;
            next.publish_attempts = 0;
            return commit(next, Vec::new());
        }
        next.publish_attempts += 1;
        next.publish_by = Some(ctx.now + ctx.lease_ms * (1_i64 << next.publish_attempts.min(6)));
        return commit(next, vec![Action::PublishEvents]);
    }
    match record.work_due_at() {
        Some(due) if due <= ctx.now => {}
        _ if record.status.is_terminal() => return Decision::Skip(Skip::Terminal),
        _ => return rekeyed(record, ctx).unwrap_or(Decision::Skip(Skip::NotDue)),
    }
    if record.status.is_terminal() {
        // Due only while its dead-letter envelope or its parent's notice is unsent: send them (again)
        // and look back later.
        let mut actions = Vec::new();
        if let Some(mark) = record.dead_letter.as_ref().filter(|d| !d.sent) {
            actions.push(Action::SendDeadLetter { id: mark.id });
        }
        if record.parent.is_some() && !record.parent_notified {
            actions.push(Action::NotifyParent);
        }
        if actions.is_empty() {
            return Decision::Skip(Skip::Terminal);
        }
        let mut next = bump(record, ctx);
        next.wake_at = Some(ctx.now + ctx.lease_ms);
        return commit(next, actions);
    }
    // (A held lease makes the record due at its expiry, so a due record's lease has expired.)
    let mut next = bump(record, ctx);
    let action = take_lease(&mut next, ctx, 0);
    commit(next, vec![action])
}

fn launch_work(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    generation: u64,
    token: Uuid,
) -> Decision {
    if record.status.is_terminal() {
        return Decision::Skip(Skip::Terminal);
    }
    let holds = matches!(&record.lease, Some(lease) if lease.token == token)
        && record.generation == generation
        || planted::active(Bug::LaunchIgnoresFencing);
    if !holds {
        return Decision::Skip(Skip::Fenced);
    }
    let mut next = bump(record, ctx);
    next.lease = None;
    match record.status {
        Status::Queued | Status::WaitRetry => {
            let actions = launch_attempt(&mut next, def, ctx, record.attempt + 1);
            commit(next, actions)
        }
        Status::WaitingExternal if record.wake_at.is_some_and(|w| w <= ctx.now) => {
            let Some(unit) = next.await_unit.as_mut() else {
                return commit(next, Vec::new());
            };
            if ctx.now >= unit.deadline {
                let error = StepError::new(
                    Code::AwaitTimeout.as_str(),
                    "no completion before the await deadline",
                    false,
                );
                unit.resolved = true;
                let actions = fail_attempt(&mut next, def, ctx, error);
                commit(next, actions)
            } else {
                // The announcement was not confirmed sent: send it again.
                let unit = unit.id;
                next.wake_at = Some(notice_check(&next, ctx));
                commit(next, vec![Action::SendAwaitNotice { unit }])
            }
        }
        Status::Running if record.wake_at.is_some_and(|w| w <= ctx.now) => {
            if record.resends < MAX_RESENDS {
                next.resends += 1;
                let deadline = ctx.now + step_timeout_ms(def, record.step);
                next.wake_at = Some(deadline);
                let action = Action::SendRequest {
                    step: record.step,
                    attempt: record.attempt,
                    launch_id: launch_id(record.id, record.step, record.attempt),
                    deadline,
                };
                commit(next, vec![action])
            } else {
                let error = StepError::new(
                    Code::StepTimeout.as_str(),
                    format!(
                        "no reply within {} s (request sent {} times)",
                        step_timeout_ms(def, record.step) / 1000,
                        record.resends + 1
                    ),
                    true,
                );
                let actions = fail_attempt(&mut next, def, ctx, error);
                commit(next, actions)
            }
        }
        // Nothing to do under this lease (the execution moved on meanwhile): release it.
        _ => commit(next, Vec::new()),
    }
}

/// A worker's reply to launch `(reply_launch, step, attempt)`.
fn reply(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    (reply_launch, step, attempt): (Uuid, u32, u32),
    fingerprint: &str,
    outcome: &Outcome,
) -> Decision {
    if attempt == 0
        || reply_launch != launch_id(record.id, step, attempt)
        || def.step(step).is_none()
    {
        return Decision::Reject(Rejection::UnknownCorrelation {
            launch_id: reply_launch,
            step,
            attempt,
        });
    }
    if let Some(receipt) = record.progress(step).and_then(|p| {
        p.receipt
            .iter()
            .chain(&p.earlier_receipts)
            .find(|r| r.launch_id == reply_launch)
    }) {
        return if receipt.fingerprint == fingerprint {
            Decision::Skip(Skip::Duplicate)
        } else {
            Decision::Reject(Rejection::Conflict {
                launch_id: reply_launch,
            })
        };
    }
    let current = is_current(record, reply_launch, step, attempt);
    // A success from an earlier attempt of the current step that never answered (it timed out; its
    // retry is running or waiting) is adopted: the step's outcome is applied once, whichever attempt
    // delivered it. (An attempt that answered has a receipt and was handled above.)
    let adopted = !current
        && matches!(outcome, Outcome::Succeeded(_))
        && record.step == step
        && record.adoptable(attempt)
        && match record.status {
            Status::Running => attempt < record.attempt,
            Status::WaitRetry | Status::Queued => attempt <= record.attempt,
            _ => false,
        };
    if !current && !adopted {
        if step > record.step || (step == record.step && attempt > record.attempt) {
            // A launch id that was never saved cannot have been sent.
            return Decision::Reject(Rejection::UnknownCorrelation {
                launch_id: reply_launch,
                step,
                attempt,
            });
        }
        return Decision::Skip(if record.status.is_terminal() {
            Skip::Terminal
        } else {
            Skip::Stale
        });
    }

    let mut next = bump(record, ctx);
    let receipt = Receipt {
        launch_id: reply_launch,
        fingerprint: fingerprint.to_string(),
    };
    let actions = apply_outcome(&mut next, def, ctx, receipt, outcome.clone());
    commit(next, actions)
}

/// Applies the outcome of the current step (a reply, or a resolved await unit): records it with its
/// receipt, then launches the next step, finishes the execution, or handles the failure.
fn apply_outcome(
    next: &mut Execution,
    def: &PipelineDef,
    ctx: &Context,
    receipt: Receipt,
    outcome: Outcome,
) -> Vec<Action> {
    let step = next.step;
    next.lease = None;
    let progress = next
        .progress_mut(step)
        .expect("the current step was launched");
    if let Some(earlier) = progress.receipt.replace(receipt) {
        progress.earlier_receipts.push(earlier);
        let excess = progress
            .earlier_receipts
            .len()
            .saturating_sub(MAX_EARLIER_RECEIPTS);
        progress.earlier_receipts.drain(..excess);
    }
    match outcome {
        Outcome::Succeeded(output) => {
            progress.status = StepStatus::Succeeded;
            progress.error = None;
            next.error = None;
            // The record keeps only what the current step needs: its input (for re-sends, retries and
            // re-drives) and its progress; at the end, the result. DynamoDB bills every write by the
            // whole item's size, so the item stays the same size however long the pipeline is.
            if (step as usize) + 1 == def.steps.len() {
                next.status = Status::Succeeded;
                next.input = Payload::default();
                next.result = Some(Payload::new(output));
                next.wake_at = None;
                next.launch_id = None;
                Vec::new()
            } else {
                next.input = Payload::new(output);
                next.steps.clear();
                next.first_step = step + 1;
                next.step = step + 1;
                next.budget_base = 0;
                launch_attempt(next, def, ctx, 1)
            }
        }
        Outcome::Failed(error) => fail_attempt(next, def, ctx, error),
    }
}

/// Whether a launch is the one the record is waiting for.
fn is_current(record: &Execution, launch: Uuid, step: u32, attempt: u32) -> bool {
    record.status == Status::Running
        && record.step == step
        && record.attempt == attempt
        && record.launch_id == Some(launch)
}

/// A running step's heartbeat for launch `(reply_launch, step, attempt)`.
fn heartbeat(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    (reply_launch, step, attempt): (Uuid, u32, u32),
) -> Decision {
    if !is_current(record, reply_launch, step, attempt) {
        return Decision::Skip(if record.status.is_terminal() {
            Skip::Terminal
        } else {
            Skip::Stale
        });
    }
    let timeout = step_timeout_ms(def, step);
    let extended = ctx.now + timeout;
    let wake = match record.launched_at {
        Some(launched) => extended.min(launched + MAX_HEARTBEAT_TIMEOUTS * timeout),
        None => extended,
    };
    if record.wake_at.is_some_and(|w| wake <= w) {
        return Decision::Skip(Skip::Capped);
    }
    let mut next = bump(record, ctx);
    next.wake_at = Some(wake);
    commit(next, Vec::new())
}

fn dead_letter_sent(record: &Execution, ctx: &Context, id: Uuid) -> Decision {
    match &record.dead_letter {
        Some(mark) if mark.id == id && !mark.sent => {
            let mut next = bump(record, ctx);
            next.dead_letter = Some(DeadLetterMark { id, sent: true });
            if !next.terminal_work_pending() {
                next.wake_at = None;
            }
            commit(next, Vec::new())
        }
        Some(mark) if mark.id == id => Decision::Skip(Skip::Duplicate),
        _ => Decision::Skip(Skip::Stale),
    }
}

fn await_notice_sent(record: &Execution, ctx: &Context, unit: Uuid) -> Decision {
    match &record.await_unit {
        Some(u) if u.id == unit && !u.notice_sent && record.status == Status::WaitingExternal => {
            let mut next = bump(record, ctx);
            let deadline = u.deadline;
            if let Some(u) = next.await_unit.as_mut() {
                u.notice_sent = true;
            }
            if next.lease.is_none() {
                next.wake_at = Some(deadline);
            }
            commit(next, Vec::new())
        }
        Some(u) if u.id == unit && u.notice_sent => Decision::Skip(Skip::Duplicate),
        _ => Decision::Skip(Skip::Stale),
    }
}

#[allow(clippy::too_many_arguments)]
fn complete_interaction(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    (interaction, named_unit): (&str, Option<Uuid>),
    token: &str,
    verdict: Verdict,
    payload: &Value,
    fingerprint: &str,
) -> Decision {
    // The token is checked before anything else, so that a forger learns nothing and costs nothing
    // (an unauthenticated refusal writes no incident): it must be the named interaction's, or, for
    // an interaction the unit does not have, one of the unit's.
    let Some(unit) = &record.await_unit else {
        return Decision::Reject(Rejection::InvalidToken);
    };
    let holds = |i: &crate::Interaction| same(i.token.as_bytes(), token.as_bytes());
    let Some(index) = unit.interactions.iter().position(|i| i.id == interaction) else {
        return Decision::Reject(if unit.interactions.iter().any(holds) {
            Rejection::UnknownInteraction(interaction.to_string())
        } else {
            Rejection::InvalidToken
        });
    };
    let found = &unit.interactions[index];
    if !holds(found) {
        return Decision::Reject(Rejection::InvalidToken);
    }
    // An answer naming an earlier await unit of the step (sent before a later attempt replaced it),
    // or one for a unit that is over (the execution moved on, failed or was cancelled): nothing waits
    // for it, and nothing is written.
    let over = unit.resolved || record.status != Status::WaitingExternal;
    if named_unit.is_some_and(|named| named != unit.id || over && found.completion.is_none()) {
        return Decision::Skip(Skip::Stale);
    }
    if let Some(done) = &found.completion {
        return if done.fingerprint == fingerprint {
            Decision::Skip(Skip::Duplicate)
        } else {
            Decision::Reject(Rejection::InteractionConflict(interaction.to_string()))
        };
    }
    if unit.resolved || record.status != Status::WaitingExternal {
        return Decision::Reject(Rejection::NotWaiting(record.status));
    }
    if ctx.now >= unit.deadline {
        return Decision::Reject(Rejection::AwaitExpired);
    }
    let mut next = bump(record, ctx);
    let unit = next.await_unit.as_mut().expect("checked above");
    unit.interactions[index].completion = Some(InteractionCompletion {
        verdict,
        payload: Payload::new(payload.clone()),
        fingerprint: fingerprint.to_string(),
        at: ctx.now,
    });
    let outcome = match verdict {
        Verdict::Rejected => {
            let reason = payload
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or("rejected");
            Outcome::Failed(StepError::new(
                Code::Rejected.as_str(),
                format!("{interaction}: {reason}"),
                false,
            ))
        }
        Verdict::Approved if unit.interactions.iter().all(|i| i.completion.is_some()) => {
            let answers: serde_json::Map<String, Value> = unit
                .interactions
                .iter()
                .filter_map(|i| {
                    Some((i.id.clone(), i.completion.as_ref()?.payload.value().clone()))
                })
                .collect();
            // The step's input flows on, with the answers beside it.
            Outcome::Succeeded(with_answers(record, record.step, answers))
        }
        // Waiting for the others.
        Verdict::Approved => return commit(next, Vec::new()),
    };
    unit.resolved = true;
    // The answers went on in the outcome (the step's output, or the rejection's error): the unit keeps
    // only their fingerprints, all that a repeated completion is checked against.
    for interaction in &mut unit.interactions {
        if let Some(done) = interaction.completion.as_mut() {
            done.payload = Payload::default();
        }
    }
    let receipt = Receipt {
        launch_id: unit.id,
        fingerprint: fingerprint.to_string(),
    };
    let actions = apply_outcome(&mut next, def, ctx, receipt, outcome);
    commit(next, actions)
}

/// When to check that an await notice went out: soon, but never after the deadline.
fn notice_check(next: &Execution, ctx: &Context) -> i64 {
    let deadline = next.await_unit.as_ref().map_or(i64::MAX, |u| u.deadline);
    (ctx.now + ctx.lease_ms).min(deadline)
}

fn redrive(record: &Execution, ctx: &Context, expected_version: u64, reason: &str) -> Decision {
    if !matches!(record.status, Status::Failed | Status::Dlq) {
        return Decision::Reject(Rejection::NotRedrivable(record.status));
    }
    if record.version != expected_version {
        return Decision::Reject(Rejection::VersionMismatch {
            expected: expected_version,
            actual: record.version,
        });
    }
    reopen(record, ctx, reason)
}

/// A FAILED or DLQ execution queued again: a new attempt of its step with a new retry budget, under
/// the same pinned release, noted with `reason`.
fn reopen(record: &Execution, ctx: &Context, reason: &str) -> Decision {
    let mut next = bump(record, ctx);
    next.redrives.push(RedriveNote {
        at: ctx.now,
        reason: truncated(reason, MAX_INCIDENT_DETAIL),
        from_status: record.status,
        from_version: record.version,
    });
    let excess = next.redrives.len().saturating_sub(MAX_REDRIVE_NOTES);
    next.redrives.drain(..excess);
    next.status = Status::Queued;
    next.budget_base = record.attempt;
    next.error = None;
    next.dead_letter = None;
    next.wake_at = Some(ctx.now);
    let action = take_lease(&mut next, ctx, 0);
    commit(next, vec![action])
}

/// A fan-out child started again by its parent's next attempt of the step (`unit`): a child that
/// failed or was cancelled runs again; one that succeeded tells the parent again without running; a
/// running one answers the new attempt when it ends.
fn rejoin(record: &Execution, ctx: &Context, token: &str, unit: Option<Uuid>) -> Decision {
    let Some(parent) = &record.parent else {
        return Decision::Reject(Rejection::InvalidToken);
    };
    if !same(parent.token.as_bytes(), token.as_bytes()) {
        return Decision::Reject(Rejection::InvalidToken);
    }
    if parent.unit == unit {
        // Started by this attempt already (a redelivered start).
        return Decision::Skip(Skip::Duplicate);
    }
    let decision = match record.status {
        // Every child that did not succeed runs again: a failed one, and one cancelled (its parent's
        // fan-out failed beyond its tolerance, or the parent was cancelled, before it ended).
        Status::Failed | Status::Dlq | Status::Cancelled => {
            reopen(record, ctx, "the parent ran its fan-out again")
        }
        status if status.is_terminal() => {
            let mut next = bump(record, ctx);
            next.parent_notified = false;
            next.wake_at = Some(ctx.now + ctx.lease_ms);
            commit(next, vec![Action::NotifyParent])
        }
        _ => commit(bump(record, ctx), Vec::new()),
    };
    match decision {
        Decision::Commit {
            record: mut next,
            actions,
        } => {
            if let Some(link) = next.parent.as_mut() {
                link.unit = unit;
            }
            Decision::Commit {
                record: next,
                actions,
            }
        }
        other => other,
    }
}

fn cancel(record: &Execution, def: &PipelineDef, ctx: &Context, reason: &str) -> Decision {
    if record.status.is_terminal() {
        return Decision::Reject(Rejection::AlreadyTerminal(record.status));
    }
    let mut next = bump(record, ctx);
    next.status = Status::Cancelled;
    next.lease = None;
    next.wake_at = None;
    next.launch_id = None;
    next.error = Some(StepError::new(Code::Cancelled.as_str(), reason, false));
    let fanned_out = def
        .step(record.step)
        .is_some_and(|s| s.kind == StepKind::FanOut);
    let actions = match (record.status, record.launch_id, &record.await_unit) {
        (Status::Running, Some(launch_id), _) => vec![Action::NotifyCancel {
            step: record.step,
            launch_id,
        }],
        // The children still running are cancelled too (each by a message naming its token).
        (Status::WaitingExternal, _, Some(unit)) if fanned_out && !unit.resolved => {
            vec![Action::CancelChildren { unit: unit.id }]
        }
        _ => Vec::new(),
    };
    commit(next, actions)
}

/// Starts attempt `attempt` of the record's current step: saved as `launching` with its deterministic
/// launch id, to be sent after the commit.
fn launch_attempt(
    next: &mut Execution,
    def: &PipelineDef,
    ctx: &Context,
    attempt: u32,
) -> Vec<Action> {
    let step = next.step;
    let id = launch_id(next.id, step, attempt);
    let deadline = ctx.now + step_timeout_ms(def, step);
    next.status = Status::Running;
    next.attempt = attempt;
    next.launch_id = Some(id);
    next.resends = 0;
    next.wake_at = Some(deadline);
    next.launched_at = Some(ctx.now);
    let progress = StepProgress {
        status: StepStatus::Launching,
        launch_id: id,
        receipt: None,
        earlier_receipts: Vec::new(),
        error: None,
    };
    match next.progress_mut(step) {
        Some(existing) => {
            existing.status = StepStatus::Launching;
            existing.launch_id = id;
        }
        None => next.steps.push(progress),
    }
    let Some(step_def) = def.step(step).filter(|s| s.kind != StepKind::Task) else {
        return vec![Action::SendRequest {
            step,
            attempt,
            launch_id: id,
            deadline,
        }];
    };
    if step_def.kind == StepKind::FanOut {
        return launch_fan_out(next, def, ctx, id, deadline);
    }
    // An await step parks the execution on an await unit; its tokens derive from this decision's
    // random token, so they cannot be guessed from anything stored elsewhere.
    let interactions = step_def
        .interaction_names()
        .into_iter()
        .map(|name| Interaction {
            idempotency_key: format!("{id}/{name}"),
            token: Uuid::new_v5(&ctx.token, name.as_bytes())
                .simple()
                .to_string(),
            id: name,
            completion: None,
        })
        .collect();
    next.status = Status::WaitingExternal;
    next.await_unit = Some(AwaitUnit {
        id,
        step,
        deadline,
        interactions,
        notice_sent: false,
        resolved: false,
        fan_out: None,
    });
    next.wake_at = Some(notice_check(next, ctx));
    vec![Action::SendAwaitNotice { unit: id }]
}

/// Launches a fan-out step (attempt launch id `id`): an await unit of one child per item, started
/// after the commit (`SendAwaitNotice`, carried out as the children's starts) and counted in the
/// ledger, not in the record. Each child's resume token derives from the execution's secret, the step
/// and the item, the same for every attempt of the step: a child started by an earlier attempt is the
/// same child, and answers this attempt (see `Event::Rejoin`).
fn launch_fan_out(
    next: &mut Execution,
    def: &PipelineDef,
    ctx: &Context,
    id: Uuid,
    deadline: i64,
) -> Vec<Action> {
    let step = next.step;
    // Items held in an object are counted by the coordinator before any child starts (`FanOutSized`).
    let fan_out = match next.step_input(step).is_some_and(items_in_an_object) {
        true => None,
        false => {
            let items = fan_out_items(next, step) as u32;
            if items == 0 {
                // Nothing to wait for: the step is done at once.
                let receipt = Receipt {
                    launch_id: id,
                    fingerprint: "no-items".into(),
                };
                let output = with_results(next, step, &Tally::default(), Value::Array(Vec::new()));
                return apply_outcome(next, def, ctx, receipt, Outcome::Succeeded(output));
            }
            Some(FanOutUnit::of(def.step(step), items))
        }
    };
    next.status = Status::WaitingExternal;
    next.await_unit = Some(AwaitUnit {
        id,
        step,
        deadline,
        interactions: Vec::new(),
        notice_sent: false,
        resolved: false,
        fan_out,
    });
    next.wake_at = Some(notice_check(next, ctx));
    vec![Action::SendAwaitNotice { unit: id }]
}

/// Whether a fan-out step's input holds its items in an object: claim-checked, or `itemsFrom`.
pub fn items_in_an_object(input: &Payload) -> bool {
    input.reference().is_some() || input.value().get("itemsFrom").is_some()
}

/// Sizes fan-out `unit` whose items are held in an object: `items` children (none: the step is done
/// at once), or the step fails when they cannot be read.
fn size_fan_out(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    unit: Uuid,
    items: &Result<u32, StepError>,
) -> Decision {
    let is_fan_out = def
        .step(record.step)
        .is_some_and(|s| s.kind == StepKind::FanOut);
    let Some(current) = record
        .await_unit
        .as_ref()
        .filter(|u| u.id == unit && is_fan_out)
    else {
        return Decision::Skip(Skip::Stale);
    };
    if current.resolved || record.status != Status::WaitingExternal {
        return Decision::Skip(Skip::Stale);
    }
    if current.fan_out.is_some() {
        return Decision::Skip(Skip::Duplicate);
    }
    let mut next = bump(record, ctx);
    let step = record.step;
    let items = match items {
        Ok(items) => *items,
        Err(error) => {
            if let Some(u) = next.await_unit.as_mut() {
                u.resolved = true;
            }
            let actions = fail_attempt(&mut next, def, ctx, error.clone());
            return commit(next, actions);
        }
    };
    if items == 0 {
        if let Some(u) = next.await_unit.as_mut() {
            u.resolved = true;
        }
        let receipt = Receipt {
            launch_id: unit,
            fingerprint: "no-items".into(),
        };
        let output = with_results(record, step, &Tally::default(), Value::Array(Vec::new()));
        let actions = apply_outcome(&mut next, def, ctx, receipt, Outcome::Succeeded(output));
        return commit(next, actions);
    }
    if let Some(u) = next.await_unit.as_mut() {
        u.fan_out = Some(FanOutUnit::of(def.step(step), items));
    }
    commit(next, Vec::new())
}

/// What a fan-out child's notice `(unit, step, item, token)` is to `record`, its parent: the fan-out
/// to count it in, or the decision that nothing is counted (a stale notice: the attempt it answers is
/// over; a refused one: the token is not the parent's for that child).
pub fn child_notice(
    record: &Execution,
    (unit, step, item): (Uuid, u32, u32),
    token: &str,
) -> Result<FanOutUnit, Decision> {
    if record.secret.is_empty() {
        return Err(Decision::Reject(Rejection::InvalidToken));
    }
    let expected = fan_out_token(&record.secret, record.id, step, &item_name(item));
    if !same(expected.as_bytes(), token.as_bytes()) {
        return Err(Decision::Reject(Rejection::InvalidToken));
    }
    let current = record
        .await_unit
        .as_ref()
        .filter(|u| u.id == unit && u.step == step);
    match current.and_then(|u| Some((u, u.fan_out?))) {
        Some((u, _)) if u.resolved || record.status != Status::WaitingExternal => {
            Err(Decision::Skip(Skip::Stale))
        }
        Some((_, fan_out)) if item < fan_out.items => Ok(fan_out),
        Some(_) => Err(Decision::Reject(Rejection::UnknownInteraction(item_name(
            item,
        )))),
        None => Err(Decision::Skip(Skip::Stale)),
    }
}

/// Settles fan-out `unit` on the ledger's `tally`: the step succeeds with every child's end in
/// `results`, or fails with `FAN_OUT_FAILED` when more children failed than it tolerates (the
/// children still running are then cancelled).
fn settle_fan_out(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    unit: Uuid,
    tally: &Tally,
    results: &Value,
) -> Decision {
    let Some((current, fan_out)) = record
        .await_unit
        .as_ref()
        .filter(|u| u.id == unit)
        .and_then(|u| Some((u, u.fan_out?)))
    else {
        return Decision::Skip(Skip::Stale);
    };
    if current.resolved {
        return Decision::Skip(Skip::Duplicate);
    }
    if record.status != Status::WaitingExternal {
        return Decision::Skip(Skip::Stale);
    }
    if !fan_out.settled_by(tally) {
        return Decision::Skip(Skip::NotDue);
    }
    let mut next = bump(record, ctx);
    if let Some(u) = next.await_unit.as_mut() {
        u.resolved = true;
    }
    let receipt = Receipt {
        launch_id: unit,
        fingerprint: format!("fan-out/{}/{}", tally.succeeded, tally.failed),
    };
    if tally.failed > fan_out.tolerated {
        let error = StepError::new(
            Code::FanOutFailed.as_str(),
            format!(
                "{} of {} children failed, {} tolerated",
                tally.failed, fan_out.items, fan_out.tolerated
            ),
            false,
        );
        let mut actions = apply_outcome(&mut next, def, ctx, receipt, Outcome::Failed(error));
        if tally.counted() < fan_out.items {
            actions.push(Action::CancelChildren { unit });
        }
        return commit(next, actions);
    }
    let step = record.step;
    let output = with_results(record, step, tally, results.clone());
    let actions = apply_outcome(&mut next, def, ctx, receipt, Outcome::Succeeded(output));
    commit(next, actions)
}

/// The output of a fan-out step: its input, with the children's ends beside it (`results`, in item
/// order) and their counts (`fanOut`).
fn with_results(record: &Execution, step: u32, tally: &Tally, results: Value) -> Value {
    let counts =
        json!({"items": tally.counted(), "succeeded": tally.succeeded, "failed": tally.failed});
    match record.step_input(step).map(|p| p.value().clone()) {
        Some(Value::Object(mut fields)) if !fields.contains_key(REF_FIELD) => {
            fields.insert("results".into(), results);
            fields.insert("fanOut".into(), counts);
            Value::Object(fields)
        }
        other => json!({"input": other, "results": results, "fanOut": counts}),
    }
}

/// The number of items a fan-out step's input holds (`items`: an array).
pub fn fan_out_items(record: &Execution, step: u32) -> usize {
    record
        .step_input(step)
        .and_then(|p| p.value().get("items"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

/// The output of an await or fan-out step: its input, with the answers beside it (an object input
/// gets an `interactions` field; any other input, a claim-checked one included, is wrapped).
fn with_answers(record: &Execution, step: u32, answers: serde_json::Map<String, Value>) -> Value {
    match record.step_input(step).map(|p| p.value().clone()) {
        Some(Value::Object(mut fields)) if !fields.contains_key(REF_FIELD) => {
            fields.insert("interactions".into(), Value::Object(answers));
            Value::Object(fields)
        }
        other => json!({"input": other, "interactions": answers}),
    }
}

/// Records a failed attempt and either schedules the retry or fails the execution.
fn fail_attempt(
    next: &mut Execution,
    def: &PipelineDef,
    ctx: &Context,
    mut error: StepError,
) -> Vec<Action> {
    let policy = def
        .step(next.step)
        .map(|s| s.retry.clone())
        .unwrap_or_default();
    error.retryable &= !policy.non_retryable.contains(&error.code);
    let step = next.step;
    if let Some(progress) = next.progress_mut(step) {
        progress.status = StepStatus::Failed;
        progress.error = Some(error.clone());
    }
    next.launch_id = None;
    next.lease = None;
    let used = next.attempts_in_budget();
    if error.retryable && used < policy.max_attempts {
        let delay_ms = policy.delay_ms(used, ctx.jitter);
        next.status = Status::WaitRetry;
        next.error = Some(error);
        next.wake_at = Some(ctx.now + delay_ms as i64);
        let delay_secs = delay_ms.div_ceil(1000);
        if delay_secs <= MAX_DELAY_SECONDS {
            vec![take_lease(next, ctx, delay_ms as i64)]
        } else {
            Vec::new()
        }
    } else {
        next.status = Status::Failed;
        next.error = Some(error);
        let id = dead_letter_id(next.id, next.version);
        next.dead_letter = Some(DeadLetterMark { id, sent: false });
        // Due again if the envelope is not marked sent by then (a crash between commit and send).
        next.wake_at = Some(ctx.now + ctx.lease_ms);
        vec![Action::SendDeadLetter { id }]
    }
}

/// Id of the dead-letter envelope of the failure committed at `version`.
fn dead_letter_id(execution: Uuid, version: u64) -> Uuid {
    Uuid::new_v5(&execution, format!("dead-letter/{version}").as_bytes())
}

/// Takes a fresh lease (new generation) covering `delay_ms` plus the lease time, and returns the launch
/// work that carries it.
fn take_lease(next: &mut Execution, ctx: &Context, delay_ms: i64) -> Action {
    next.generation += 1;
    next.lease = Some(Lease {
        owner: ctx.owner.clone(),
        token: ctx.token,
        expires_at: ctx.now + delay_ms + ctx.lease_ms,
    });
    Action::EnqueueLaunch {
        generation: next.generation,
        token: ctx.token,
        delay_secs: (delay_ms.max(0) as u64).div_ceil(1000) as u32,
    }
}

/// A committed record with the due time its index entry is keyed by (`Execution::index_due`). The
/// sweeper's own writes (`exact`: it found the entry due) key it by when the record is due next.
fn keyed(mut decision: Decision, exact: bool) -> Decision {
    if let Decision::Commit { record, .. } = &mut decision {
        if exact {
            record.indexed_due = None;
        }
        record.indexed_due = record.index_due();
    }
    decision
}

/// The sweeper found `record` before it is due: its entry was kept early. The entry moves to when
/// the record is due (a write with no action); None when the entry is not early.
fn rekeyed(record: &Execution, ctx: &Context) -> Option<Decision> {
    let due = record.due_at()?;
    let kept = record.index_due()?;
    if kept >= due || kept > ctx.now {
        return None;
    }
    let mut next = bump(record, ctx);
    next.indexed_due = Some(due);
    Some(commit(next, Vec::new()))
}

fn bump(record: &Execution, ctx: &Context) -> Execution {
    let mut next = record.clone();
    next.version += 1;
    next.updated_at = ctx.now;
    next.write_id = write_id(ctx);
    next
}

/// The id of the write a decision makes: 64 of the decision's random bits.
fn write_id(ctx: &Context) -> String {
    ctx.token.simple().to_string()[..16].to_string()
}

/// A worker's reply whose outcome makes the record too large for the store (`detail`: the store's
/// answer), as the final failure of its step with `ITEM_TOO_LARGE`: same launch, attempt and
/// fingerprint, so a redelivery of the reply is a duplicate. `None` for any other event.
pub fn oversized_reply(event: &Event, detail: &str) -> Option<Event> {
    match event {
        Event::FromWorker { sender, event } => Some(Event::FromWorker {
            sender: sender.clone(),
            event: Box::new(oversized_reply(event, detail)?),
        }),
        Event::Reply { outcome, .. } => {
            let what = match outcome {
                Outcome::Succeeded(output) => {
                    format!("its output ({} bytes)", output.to_string().len())
                }
                Outcome::Failed(error) => {
                    format!("its error {} ({} bytes)", error.code, error.message.len())
                }
            };
            let message = format!("{what} does not fit in the execution record: {detail}");
            let failed = StepError::new(Code::ItemTooLarge.as_str(), message, false);
            let mut event = event.clone();
            if let Event::Reply { outcome, .. } = &mut event {
                *outcome = Outcome::Failed(failed);
            }
            Some(event)
        }
        _ => None,
    }
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

/// What the write that applied a reply to step `step` sent, to send again when that reply comes back
/// (a duplicate of an applied reply is stale: its step is past) while nothing has happened since:
/// that write's response may have been lost, or its send may have failed, and nothing else would
/// send the next step's request before its deadline. "Nothing since": the execution runs the first
/// attempt of the step right after, launched, never answered nor re-sent. The worker deduplicates on
/// the launch id, so a request that did go out costs one duplicate delivery.
pub fn reply_actions(record: &Execution, def: &PipelineDef, step: u32) -> Vec<Action> {
    let Some(launch_id) = record.launch_id else {
        return Vec::new();
    };
    let unanswered = record.progress(record.step).is_some_and(|p| {
        p.status == StepStatus::Launching && p.receipt.is_none() && p.launch_id == launch_id
    });
    let next_first_attempt = record.step == step + 1 && record.attempt == 1 && record.resends == 0;
    let task = def
        .step(record.step)
        .is_some_and(|s| s.kind == StepKind::Task);
    if record.status != Status::Running || !unanswered || !next_first_attempt || !task {
        return Vec::new();
    }
    vec![Action::SendRequest {
        step: record.step,
        attempt: record.attempt,
        launch_id,
        deadline: record.wake_at.unwrap_or(record.updated_at),
    }]
}

fn step_timeout_ms(def: &PipelineDef, step: u32) -> i64 {
    def.step(step).map_or(300, |s| s.timeout_secs) as i64 * 1000
}

fn commit(record: Execution, actions: Vec<Action>) -> Decision {
    Decision::Commit {
        record: Box::new(record),
        actions,
    }
}

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
//! | FAILED/DLQ/CANCELLED      | Rejoin              | parent's token, another attempt               | QUEUED, new budget, lease · EnqueueLaunch             |
//! | SUCCEEDED                 | Rejoin              | parent's token, another attempt               | parent told again · NotifyParent                      |
//! | not terminal              | Rejoin              | parent's token, another attempt               | answers that attempt when it ends                     |
//! | FAILED/DLQ                | DeadLetterSent      | same dead-letter id, unsent                   | marked sent, leaves the due index                     |
//! | WAITING_EXTERNAL          | AwaitNoticeSent     | same unit, notice unsent                      | notice marked sent, due at the deadline               |
//! | WAITING_EXTERNAL          | CompleteInteraction | right token, approved, others pending         | completion noted, still waiting                       |
//! | WAITING_EXTERNAL          | CompleteInteraction | right token, approved, the last one           | succeeds, output = input + answers (as ok)            |
//! | WAITING_EXTERNAL          | CompleteInteraction | right token, rejected                         | step failed: REJECTED, FAILED                         |
//! | terminal                  | ParentNotified      | has a parent, not yet told                    | parent told, leaves the due index                     |
//! | WAITING_EXTERNAL          | FanOutSized         | current unit to size, n > 0 items             | unit sized: n children, its tolerance                 |
//! | WAITING_EXTERNAL          | FanOutSized         | current unit to size, no items                | step done: next step launched, or SUCCEEDED           |
//! | WAITING_EXTERNAL          | FanOutSized         | current unit to size, items unreadable        | step failed with the reading's error                  |
//! | WAITING_EXTERNAL          | FanOutSettled       | current unit, all counted, failures tolerated | succeeds, output = input + results (as ok)            |
//! | WAITING_EXTERNAL          | FanOutSettled       | current unit, failures beyond tolerance       | step failed: FAN_OUT_FAILED · CancelChildren          |
//! | any                       | Incident            |                                               | noted on the record (latest ones kept)                |
//! | any                       | EventsPublished     | outbox holds events up to `through`           | those events leave the outbox                         |
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

use std::time::Duration;

use crate::time::Timestamp;

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

mod transitions;

mod fan_out;
mod lease;
mod notices;
mod operator;
mod replies;
mod start;

pub use fan_out::{child_notice, fan_out_items, items_in_an_object};
use fan_out::{launch_fan_out, settle_fan_out, size_fan_out};
use lease::{
    claim, commit_leased, fail_attempt, launch_attempt, launch_work, step_timeout, take_lease,
};
use notices::{await_notice_sent, complete_interaction, dead_letter_sent, notice_check};
use operator::{cancel, redrive, rejoin};
use replies::{apply_outcome, authenticate, heartbeat, reply};
pub use replies::{oversized_reply, reply_actions};
pub use start::{creation_actions, start, start_launched};

pub use transitions::{EventKind, Transition, ANY_STATUS, APPENDED, LIVE, TERMINAL, TRANSITIONS};

/// A launched attempt with no reply by its deadline has its request re-sent this many times (same launch
/// id, recovering a crash between save and send) before the attempt is declared timed out.
pub const MAX_RESENDS: u32 = 1;
/// SQS `DelaySeconds` upper bound; longer retry waits are left to the due-time index.
pub const MAX_DELAY_SECONDS: u64 = 900;

/// Inputs from the world that the machine must not fetch itself.
#[derive(Debug, Clone)]
pub struct Context {
    pub now: Timestamp,
    /// Uniform in `[0, 1)`, for full-jitter backoff.
    pub jitter: f64,
    /// A fresh token for a lease this decision may take.
    pub token: Uuid,
    /// A fresh reply secret for an execution this decision may create: 128 random bits drawn on their
    /// own, sharing nothing with `token` (whose bits the record shows as its lease and write id).
    pub secret: [u8; 16],
    /// Who acts (handler name and instance), recorded as lease owner.
    pub owner: String,
    /// How long a lease taken now lasts.
    pub lease: Duration,
    /// Record lifecycle events in the outbox (published to the event bus after each commit).
    pub lifecycle: bool,
}

#[cfg(any(test, feature = "testing"))]
impl Context {
    /// A context fixed but for `now`, for tests: a decision that takes a lease, or creates an
    /// execution, takes token 9 and secret `[9; 16]`, for 30 s, as `test`.
    pub fn at(now: Timestamp) -> Self {
        Self {
            now,
            jitter: 0.5,
            token: Uuid::from_u128(9),
            secret: [9; 16],
            owner: "test".into(),
            lease: Duration::from_secs(30),
            lifecycle: false,
        }
    }
}

/// Outcome reported by a worker for one launch.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Succeeded(Value),
    Failed(StepError),
}

/// A release an execution is pinned to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub release_version: String,
    pub contract_version: String,
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
    /// Operator re-drive of a FAILED or DLQ execution; `onto`: moved onto another release of its
    /// pipeline, checked beforehand to continue it from its step (`release::continues_on`).
    Redrive {
        expected_version: u64,
        reason: String,
        onto: Option<Pin>,
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
pub const MAX_HEARTBEAT_TIMEOUTS: u32 = 12;

/// Effects to carry out after the commit.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send the request envelope of the record's current step and attempt to its worker.
    SendRequest {
        step: u32,
        attempt: u32,
        launch_id: Uuid,
        deadline: Timestamp,
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
            next.wake_at = next.wake_at.or(Some(ctx.now + ctx.lease));
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
        next.publish_by = Some(ctx.now + ctx.lease);
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
            onto,
        } => redrive(record, ctx, *expected_version, reason, onto.as_ref()),
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

fn commit(record: Execution, actions: Vec<Action>) -> Decision {
    Decision::Commit {
        record: Box::new(record),
        actions,
    }
}

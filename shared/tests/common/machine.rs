//! Fixtures of the pure state-machine tests: fixed clocks and ids, pipelines, the events a worker, the
//! sweeper or an approver sends, and `Machine`, which applies events to records of one pipeline and
//! builds records in each status (started, running, waiting for a retry, parked on an await unit,
//! failed, succeeded, cancelled). Every commit made through `Machine` is checked against the commit
//! invariants.

use serde_json::{json, Value};
use std::time::Duration;
use stepline::domain::{
    decide, launch_id, reply_token, start, Action, Context, Decision, Event, Execution, Lease,
    LifecycleEvent, LifecycleKind, NewExecution, Outcome, ParentLink, PipelineDef, Rejection,
    RetryPolicy, Sender, Skip, Status, StepDef, StepError, StepProgress, StepStatus, Timestamp,
    Verdict, MAX_EARLIER_RECEIPTS, MAX_INCIDENTS, MAX_REDRIVE_NOTES,
};
use uuid::Uuid;

/// Epoch milliseconds of the first decision of every scenario.
pub const T0: i64 = 1_700_000_000_000;
pub const LEASE_MS: i64 = 30_000;
pub const LEASE: Duration = Duration::from_millis(LEASE_MS as u64);

/// The moment `ms` milliseconds after the epoch: the scenarios' clock readings are milliseconds.
pub const fn ts(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}
pub const JITTER: f64 = 0.5;
pub const OWNER: &str = "test:coordinator-1";
pub const TENANT: &str = "acme";
/// The await unit of the parent of `running_child()` (the fan-out attempt that started it).
pub const PARENT_UNIT: Uuid = Uuid::from_u128(0x0e1e_c000_0000_4000_8000_0000_0000_0078);
pub const EXEC: Uuid = Uuid::from_u128(0x0e1e_c000_0000_4000_8000_0000_0000_0001);

/// Step timeouts of `three_steps()`, in milliseconds.
pub const TIMEOUT_MS: [i64; 3] = [60_000, 120_000, 30_000];

/// When `running()` launched attempt 1 of step 0, and that attempt's deadline.
pub const LAUNCHED_AT: i64 = T0 + 100;
pub const DEADLINE0: i64 = LAUNCHED_AT + TIMEOUT_MS[0];
/// When `resent()` re-sent attempt 1 of step 0, and the deadline of the re-sent request.
pub const RESENT_AT: i64 = DEADLINE0 + 250;
pub const DEADLINE1: i64 = RESENT_AT + TIMEOUT_MS[0];
/// When `timed_out()` declared attempt 1 of step 0 timed out.
pub const TIMED_OUT_AT: i64 = DEADLINE1 + 10;

/// When `cancelled()` cancelled the running attempt 1 of step 0.
pub const CANCELLED_AT: i64 = T0 + 2_000;

/// Timeout of every step of the await and fan-out pipelines (an await step's deadline).
pub const WAIT_SECS: u32 = 600;
/// When `waiting()` parked the execution on its await unit.
pub const PARKED_AT: i64 = LAUNCHED_AT + 10;

pub fn token(n: u128) -> Uuid {
    Uuid::from_u128(0x7000_0000_0000_4000_8000_0000_0000_0000 | n)
}

/// The context of one decision: taken at `now`, offering lease token `token(tok)`.
pub fn ctx(now: i64, tok: u128) -> Context {
    Context {
        now: ts(now),
        jitter: JITTER,
        token: token(tok),
        secret: (0x5ec0_0000_u128 | tok).to_le_bytes(),
        owner: OWNER.to_string(),
        lease: LEASE,
        lifecycle: false,
    }
}

/// `ctx(now, tok)` with lifecycle events recorded.
pub fn lifecycle_ctx(now: i64, tok: u128) -> Context {
    Context {
        lifecycle: true,
        ..ctx(now, tok)
    }
}

/// A task step on the `<id>-requests` queue.
pub fn step(id: &str, timeout_secs: u32, retry: RetryPolicy) -> StepDef {
    StepDef::task(id, format!("{id}-requests"))
        .timeout_secs(timeout_secs)
        .retry(retry)
}

/// validate (60 s) -> charge (120 s) -> ship (30 s); 3 attempts each, backoff 2.5 s doubling.
pub fn three_steps() -> PipelineDef {
    let retry = RetryPolicy::doubling(3, 2_500, 60_000);
    PipelineDef::new(
        "orders",
        "2024-06-01.1",
        [
            step("validate", 60, retry.clone()),
            step("charge", 120, retry.clone()),
            step("ship", 30, retry),
        ],
    )
}

/// `three_steps()` with another retry policy on its first step.
pub fn with_first_retry(retry: RetryPolicy) -> PipelineDef {
    let mut def = three_steps();
    def.steps[0].retry = retry;
    def
}

fn on_queue(id: &str) -> String {
    format!("{id}-queue")
}

fn waiting_task(id: &str) -> StepDef {
    StepDef::task(id, on_queue(id)).timeout_secs(WAIT_SECS)
}

fn approval_step(interactions: &[&str]) -> StepDef {
    StepDef::await_step("approve", on_queue("approve"))
        .timeout_secs(WAIT_SECS)
        .interactions(interactions.iter().copied())
}

fn fan_out_step() -> StepDef {
    StepDef::fan_out("payments", "payment")
        .queue(on_queue("payments"))
        .timeout_secs(WAIT_SECS)
}

/// validate (task) -> approve (await) -> notify (task)
pub fn approval_pipeline(interactions: &[&str]) -> PipelineDef {
    PipelineDef::new(
        "restaurant",
        "1",
        [
            waiting_task("validate"),
            approval_step(interactions),
            waiting_task("notify"),
        ],
    )
}

/// approve (await) -> notify (task): the await step is launched by launch work.
pub fn approval_first_pipeline() -> PipelineDef {
    PipelineDef::new("walk-in", "1", [approval_step(&[]), waiting_task("notify")])
}

/// parse (task) -> payments (fan-out over `items`) -> summary (task)
pub fn fan_out_pipeline() -> PipelineDef {
    PipelineDef::new(
        "batch",
        "1",
        [
            waiting_task("parse"),
            fan_out_step(),
            waiting_task("summary"),
        ],
    )
}

/// payments (fan-out over the input's `items`) -> summary (task)
pub fn fan_out_first_pipeline() -> PipelineDef {
    PipelineDef::new("batch", "1", [fan_out_step(), waiting_task("summary")])
}

/// pay (task): the pipeline of a fan-out's children.
pub fn child_pipeline() -> PipelineDef {
    PipelineDef::new("payment", "1", [waiting_task("pay")])
}

pub fn input() -> Value {
    json!({"orderId": "o-42", "amount": 1999, "currency": "EUR"})
}

pub fn output(step: u32) -> Value {
    json!({"step": step, "done": true, "note": format!("output of step {step}")})
}

pub fn retryable() -> StepError {
    StepError::new("UPSTREAM_BUSY", "payment gateway returned 503", true)
}

pub fn fatal() -> StepError {
    StepError::new("INVALID_CARD", "card number rejected", false)
}

/// The fingerprint a worker reply's bytes would have.
pub fn fingerprint(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Succeeded(value) => format!("ok:{value}"),
        Outcome::Failed(e) => format!("err:{}:{}:{}", e.code, e.message, e.retryable),
    }
}

/// The reply of attempt `attempt` of step `step`, correlated with its deterministic launch id.
pub fn reply(step: u32, attempt: u32, outcome: Outcome) -> Event {
    Event::Reply {
        launch_id: launch_id(EXEC, step, attempt),
        step,
        attempt,
        fingerprint: fingerprint(&outcome),
        outcome,
    }
}

pub fn ok_reply(step: u32, attempt: u32, value: Value) -> Event {
    reply(step, attempt, Outcome::Succeeded(value))
}

pub fn err_reply(step: u32, attempt: u32, error: &StepError) -> Event {
    reply(step, attempt, Outcome::Failed(error.clone()))
}

pub fn heartbeat(step: u32, attempt: u32) -> Event {
    Event::Heartbeat {
        launch_id: launch_id(EXEC, step, attempt),
        step,
        attempt,
    }
}

pub fn incident(code: &str) -> Event {
    Event::Incident {
        code: code.to_string(),
        detail: format!("message m-1 on reply: {code}"),
    }
}

pub fn cancel(reason: &str) -> Event {
    Event::Cancel {
        reason: reason.to_string(),
    }
}

pub fn redrive(expected_version: u64, reason: &str) -> Event {
    Event::Redrive {
        expected_version,
        reason: reason.to_string(),
        onto: None,
    }
}

/// The same reply (same launch id) carrying other bytes.
pub fn with_other_bytes(event: &Event) -> Event {
    let mut other = event.clone();
    match &mut other {
        Event::Reply { fingerprint, .. } => fingerprint.push_str("-other"),
        _ => panic!("not a reply: {event:?}"),
    }
    other
}

/// `event` as the completion handler passes it on: wrapped with what the reply says of its sender.
pub fn from_worker(record: &Execution, token: String, release: &str, event: Event) -> Event {
    Event::FromWorker {
        sender: Sender {
            token,
            pipeline_id: record.pipeline_id.clone(),
            contract_version: record.contract_version.clone(),
            release_version: release.to_string(),
        },
        event: Box::new(event),
    }
}

/// `event` as the worker of attempt `attempt` of step `step` sends it, with its launch's reply token.
pub fn genuine(record: &Execution, step: u32, attempt: u32, event: Event) -> Event {
    let token = reply_token(&record.secret, launch_id(record.id, step, attempt));
    from_worker(record, token, &record.release_version.clone(), event)
}

/// An approver's (or a child's) completion of `interaction`.
pub fn complete(interaction: &str, token: &str, verdict: Verdict, payload: Value) -> Event {
    answer_for(None, interaction, token, verdict, payload)
}

fn answer_for(
    unit: Option<Uuid>,
    interaction: &str,
    token: &str,
    verdict: Verdict,
    payload: Value,
) -> Event {
    Event::CompleteInteraction {
        interaction: interaction.into(),
        token: token.into(),
        fingerprint: stepline::envelope::InteractionMessage::answer_fingerprint(verdict, &payload),
        verdict,
        payload,
        unit,
    }
}

/// The resume token of `interaction` in the record's await unit.
/// The parent's resume token for the child of item `item` of its current fan-out.
pub fn child_token(record: &Execution, item: u32) -> String {
    let unit = record.await_unit.as_ref().expect("an await unit");
    stepline::domain::ids::fan_out_token(
        &record.secret,
        record.id,
        unit.step,
        &format!("item-{item}"),
    )
}

/// The ledger's word that fan-out `unit` counted `succeeded` and `failed` children.
pub fn settled(unit: Uuid, succeeded: u32, failed: u32, results: Value) -> Event {
    Event::FanOutSettled {
        unit,
        tally: stepline::domain::Tally { succeeded, failed },
        results,
    }
}

pub fn token_of(record: &Execution, interaction: &str) -> String {
    let unit = record.await_unit.as_ref().expect("an await unit");
    let found = unit.interactions.iter().find(|i| i.id == interaction);
    found.expect("the interaction").token.clone()
}

/// The launch work an action list enqueued (exactly one `EnqueueLaunch`).
#[track_caller]
pub fn launch_work_of(actions: &[Action]) -> Event {
    match actions {
        [Action::EnqueueLaunch {
            generation, token, ..
        }] => Event::LaunchWork {
            generation: *generation,
            token: *token,
        },
        other => panic!("expected exactly one EnqueueLaunch, got {other:?}"),
    }
}

/// The request an action list sends (exactly one `SendRequest`): (step, attempt, launch id, deadline).
#[track_caller]
pub fn request_of(actions: &[Action]) -> (u32, u32, Uuid, i64) {
    match actions {
        [Action::SendRequest {
            step,
            attempt,
            launch_id,
            deadline,
        }] => (*step, *attempt, *launch_id, deadline.millis()),
        other => panic!("expected exactly one SendRequest, got {other:?}"),
    }
}

/// The launch work an action list enqueues (exactly one `EnqueueLaunch`): (generation, token, delay).
#[track_caller]
pub fn enqueued(actions: &[Action]) -> (u64, Uuid, u32) {
    match actions {
        [Action::EnqueueLaunch {
            generation,
            token,
            delay_secs,
        }] => (*generation, *token, *delay_secs),
        other => panic!("expected exactly one EnqueueLaunch, got {other:?}"),
    }
}

/// Launch work carrying generation `generation` and token `token(tok)`.
pub fn launch_work(generation: u64, tok: u128) -> Event {
    Event::LaunchWork {
        generation,
        token: token(tok),
    }
}

/// The lease a decision under `ctx(_, tok)` takes, expiring at `expires_at`.
pub fn leased(tok: u128, expires_at: i64) -> Option<Lease> {
    Some(Lease {
        owner: OWNER.to_string(),
        token: token(tok),
        expires_at: ts(expires_at),
    })
}

/// The progress of a step whose attempt `launch` is saved as launching, nothing received yet.
pub fn launching(launch: Uuid) -> StepProgress {
    StepProgress {
        status: StepStatus::Launching,
        launch_id: launch,
        receipt: None,
        earlier_receipts: Vec::new(),
        error: None,
    }
}

/// The dead-letter envelope an action list sends (exactly one `SendDeadLetter`).
#[track_caller]
pub fn dead_letter_of(actions: &[Action]) -> Uuid {
    match actions {
        [Action::SendDeadLetter { id }] => *id,
        other => panic!("expected exactly one SendDeadLetter, got {other:?}"),
    }
}

/// What every commit must preserve, whatever the event.
#[track_caller]
pub fn assert_commit_invariants(
    before: &Execution,
    after: &Execution,
    actions: &[Action],
    ctx: &Context,
) {
    assert_eq!(
        after.version,
        before.version + 1,
        "a commit advances the version by exactly one"
    );
    // The release is pinned: only an operator's re-drive moves it, and says so in its note.
    let moved = after.redrives.last().filter(|note| {
        Some(*note) != before.redrives.last()
            && note.to_release.as_deref() == Some(after.release_version.as_str())
            && note.from_release.as_deref() == Some(before.release_version.as_str())
    });
    if moved.is_none() {
        assert_eq!(
            after.release_version, before.release_version,
            "release is pinned"
        );
    }
    assert_eq!(after.pipeline_id, before.pipeline_id, "pipeline is pinned");
    if after.input != before.input {
        assert!(
            !after.steps_succeeded_since(before).is_empty()
                && (after.step > before.step
                    || after.status == Status::Succeeded && after.input.is_null()),
            "the input is the current step's: it changes only as a step succeeds"
        );
    }
    // The record is bounded: the current step's progress only, capped receipts and notes.
    assert!(
        after.steps.len() <= 1 && after.first_step == after.step,
        "only the current step's progress is kept: {:?} from {}",
        after.steps,
        after.first_step
    );
    assert!(after
        .steps
        .iter()
        .all(|p| p.earlier_receipts.len() <= MAX_EARLIER_RECEIPTS));
    assert!(after.redrives.len() <= MAX_REDRIVE_NOTES);
    assert!(after.incidents.len() <= MAX_INCIDENTS);
    assert_eq!(after.id, before.id);
    assert_eq!(after.tenant, before.tenant);
    assert_eq!(after.idempotency_key, before.idempotency_key);
    assert_eq!(after.created_at, before.created_at);
    assert_eq!(after.updated_at, ctx.now);
    let enqueued: Vec<(u64, Uuid)> = actions
        .iter()
        .filter_map(|a| match a {
            Action::EnqueueLaunch {
                generation, token, ..
            } => Some((*generation, *token)),
            _ => None,
        })
        .collect();
    match enqueued.as_slice() {
        [] => {
            assert_eq!(
                after.generation, before.generation,
                "the generation moves only when a lease is taken"
            );
            assert!(
                after.lease.is_none() || after.lease == before.lease,
                "a lease is only ever taken together with launch work carrying it"
            );
        }
        [(generation, token)] => {
            assert_eq!(
                after.generation,
                before.generation + 1,
                "a new lease is a new generation"
            );
            assert_eq!(
                *generation, after.generation,
                "launch work carries the new generation"
            );
            let lease = after
                .lease
                .as_ref()
                .expect("launch work is enqueued under a lease");
            assert_eq!(lease.token, *token);
            assert_eq!(lease.token, ctx.token);
            assert_eq!(lease.owner, ctx.owner);
        }
        more => panic!("a decision enqueues at most one launch, got {more:?}"),
    }
    if after.status.is_terminal() {
        let unsent = after.dead_letter.as_ref().is_some_and(|d| !d.sent)
            || !after.events.is_empty()
            || (after.parent.is_some() && !after.parent_notified);
        assert_eq!(
            after.due_at().is_some(),
            unsent,
            "a terminal execution is due only while its dead-letter envelope, lifecycle events or \
             parent notice are unsent: {after:?}"
        );
    } else {
        assert!(
            after.due_at().is_some(),
            "a live execution always has a due time (the sweeper's safety net): {after:?}"
        );
    }
}

/// Applies an event that must commit, checks the commit invariants, returns the new record and actions.
#[track_caller]
pub fn commit(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    event: &Event,
) -> (Execution, Vec<Action>) {
    match decide(record, def, ctx, event) {
        Decision::Commit {
            record: next,
            actions,
        } => {
            assert_commit_invariants(record, &next, &actions, ctx);
            // The record as the coordinator writes it: entries beyond its share journaled first.
            let mut next = *next;
            stepline::domain::history::spill(record, &mut next);
            (next, actions)
        }
        other => panic!(
            "expected {event:?} on {} v{} to commit, got {other:?}",
            record.status, record.version
        ),
    }
}

/// Decisions on the records of one pipeline, each taken under `ctx(at, tok)` unless a context is given.
pub struct Machine {
    pub def: PipelineDef,
}

impl Machine {
    pub fn of(def: PipelineDef) -> Self {
        Self { def }
    }

    pub fn decide(&self, record: &Execution, at: i64, tok: u128, event: &Event) -> Decision {
        decide(record, &self.def, &ctx(at, tok), event)
    }

    /// Applies an event that must commit (checking the commit invariants).
    #[track_caller]
    pub fn commit(
        &self,
        record: &Execution,
        at: i64,
        tok: u128,
        event: &Event,
    ) -> (Execution, Vec<Action>) {
        commit(record, &self.def, &ctx(at, tok), event)
    }

    /// `commit` under a context of the caller's.
    #[track_caller]
    pub fn commit_in(
        &self,
        record: &Execution,
        ctx: &Context,
        event: &Event,
    ) -> (Execution, Vec<Action>) {
        commit(record, &self.def, ctx, event)
    }

    /// Applies an event that must be skipped.
    #[track_caller]
    pub fn skipped(&self, record: &Execution, at: i64, tok: u128, event: &Event) -> Skip {
        match self.decide(record, at, tok, event) {
            Decision::Skip(skip) => skip,
            other => panic!(
                "expected {event:?} on {} v{} to be skipped, got {other:?}",
                record.status, record.version
            ),
        }
    }

    /// A claim by a sweeper that found `record`'s due-index entry before the record is due (the entry
    /// was kept early while the execution moved on): the entry moves to when it is due, and nothing
    /// else changes. Returns the record so written.
    #[track_caller]
    pub fn found_early(&self, record: &Execution, at: i64, tok: u128) -> Execution {
        assert!(record.index_due().is_some_and(|kept| kept <= ts(at)));
        let (moved, actions) = self.commit(record, at, tok, &Event::Claim);
        assert!(actions.is_empty(), "{actions:?}");
        assert_eq!(
            moved.index_due(),
            record.due_at(),
            "keyed by when it is due"
        );
        let unchanged = |r: &Execution| Execution {
            version: 0,
            write_id: String::new(),
            updated_at: Timestamp::EPOCH,
            indexed_due: None,
            ..r.clone()
        };
        assert_eq!(unchanged(&moved), unchanged(record), "nothing else changes");
        moved
    }

    /// Applies an event that must be rejected.
    #[track_caller]
    pub fn rejected(&self, record: &Execution, at: i64, tok: u128, event: &Event) -> Rejection {
        match self.decide(record, at, tok, event) {
            Decision::Reject(rejection) => rejection,
            other => panic!(
                "expected {event:?} on {} v{} to be rejected, got {other:?}",
                record.status, record.version
            ),
        }
    }

    /// Applies the launch work `actions` enqueued.
    #[track_caller]
    pub fn launch(
        &self,
        record: &Execution,
        at: i64,
        tok: u128,
        actions: &[Action],
    ) -> (Execution, Vec<Action>) {
        self.commit(record, at, tok, &launch_work_of(actions))
    }

    /// The sweeper's claim at `at` and the launch work it enqueued, applied at `then`.
    #[track_caller]
    pub fn claim_and_launch(
        &self,
        record: &Execution,
        (at, tok): (i64, u128),
        then: i64,
    ) -> (Execution, Vec<Action>) {
        let (claimed, actions) = self.commit(record, at, tok, &Event::Claim);
        self.launch(&claimed, then, tok + 1, &actions)
    }

    /// A new execution of `input` created at T0 with lease token 1.
    pub fn start_with(&self, input: Value) -> (Execution, Vec<Action>) {
        let key = Some("idem-1".to_string());
        start(
            NewExecution {
                idempotency_key: key,
                ..NewExecution::of(EXEC, TENANT, &self.def, input)
            },
            &ctx(T0, 1),
        )
    }

    /// A new execution created at T0 with lease token 1.
    pub fn started(&self) -> (Execution, Vec<Action>) {
        self.start_with(input())
    }

    /// Attempt 1 of step 0 of an execution of `input` launched at `LAUNCHED_AT`.
    pub fn running_with(&self, input: Value) -> Execution {
        let (record, actions) = self.start_with(input);
        self.launch(&record, LAUNCHED_AT, 2, &actions).0
    }

    /// Attempt 1 of step 0 launched at `LAUNCHED_AT` (version 2, generation 1, no lease).
    pub fn running(&self) -> Execution {
        self.running_with(input())
    }

    /// Attempt 1 of step `k` running, every earlier step having succeeded at its first attempt.
    pub fn running_at_step(&self, k: u32) -> Execution {
        let mut record = self.running();
        for s in 0..k {
            let at = T0 + 1_000 * (i64::from(s) + 1);
            let tok = 10 + u128::from(s);
            record = self.commit(&record, at, tok, &ok_reply(s, 1, output(s))).0;
        }
        assert_eq!(
            (record.status, record.step, record.attempt),
            (Status::Running, k, 1)
        );
        record
    }

    /// Attempt 1 of step 0 failed retryably at `at` (token 3): WAIT_RETRY with the retry's work.
    pub fn failed_once(&self, at: i64) -> (Execution, Vec<Action>) {
        self.commit(&self.running(), at, 3, &err_reply(0, 1, &retryable()))
    }

    /// Attempt 1 of step 0 failed for good at `at` (token 3): FAILED, its dead letter unsent.
    pub fn failed_at(&self, at: i64) -> (Execution, Vec<Action>) {
        self.commit(&self.running(), at, 3, &err_reply(0, 1, &fatal()))
    }

    /// `failed_at(at)` and the id of the dead-letter envelope its commit sends.
    #[track_caller]
    pub fn dead_lettered(&self, at: i64) -> (Execution, Uuid) {
        let (failed, actions) = self.failed_at(at);
        (failed, dead_letter_of(&actions))
    }

    /// Attempt 1 of step 0 found past its deadline by the sweeper and re-sent at `RESENT_AT`.
    pub fn resent(&self) -> Execution {
        self.claim_and_launch(&self.running(), (DEADLINE0, 3), RESENT_AT)
            .0
    }

    /// The re-sent attempt 1 of step 0 found past its new deadline and timed out at `TIMED_OUT_AT`.
    pub fn timed_out(&self) -> (Execution, Vec<Action>) {
        self.claim_and_launch(&self.resent(), (DEADLINE1, 5), TIMED_OUT_AT)
    }

    /// `timed_out()`, its retry (attempt 2) launched at `TIMED_OUT_AT + 2_000`.
    pub fn second_attempt(&self) -> Execution {
        let (waiting, actions) = self.timed_out();
        let (second, _) = self.launch(&waiting, TIMED_OUT_AT + 2_000, 7, &actions);
        assert_eq!((second.status, second.attempt), (Status::Running, 2));
        second
    }

    /// All three attempts of step 0 failed retryably: FAILED at version 7, generation 3.
    pub fn exhausted(&self) -> Execution {
        let mut record = self.running();
        for k in 1..=3u32 {
            let at = T0 + 10_000 * i64::from(k);
            let tok = 20 + 2 * u128::from(k);
            let (failed, actions) = self.commit(&record, at, tok, &err_reply(0, k, &retryable()));
            record = failed;
            if k < 3 {
                record = self.launch(&record, at + 5_000, tok + 1, &actions).0;
            }
        }
        assert_eq!(record.status, Status::Failed);
        record
    }

    /// `exhausted()` and its redrive at `at` (token 50): the FAILED record, the QUEUED one and the
    /// launch work the redrive enqueued.
    pub fn requeued(&self, at: i64) -> (Execution, Execution, Vec<Action>) {
        let failed = self.exhausted();
        let event = redrive(failed.version, "gateway fixed");
        let (requeued, actions) = self.commit(&failed, at, 50, &event);
        (failed, requeued, actions)
    }

    /// `exhausted()` re-driven at `at` (token 50), its new attempt 4 launched 100 ms later.
    pub fn redriven(&self, at: i64) -> (Execution, Vec<Action>) {
        let (_, requeued, actions) = self.requeued(at);
        self.launch(&requeued, at + 100, 51, &actions)
    }

    /// The last step's success applied under `ctx` after the first two steps succeeded.
    pub fn succeed_in(&self, ctx: &Context) -> (Execution, Vec<Action>) {
        let record = self.running_at_step(2);
        self.commit_in(&record, ctx, &ok_reply(2, 1, output(2)))
    }

    /// All three steps succeeded, the last at `T0 + 10_000` (token 30).
    pub fn succeeded(&self) -> Execution {
        self.succeed_in(&ctx(T0 + 10_000, 30)).0
    }

    /// The running attempt 1 of step 0 cancelled for `reason` at `CANCELLED_AT` (token 9).
    pub fn cancel_running(&self, reason: &str) -> (Execution, Vec<Action>) {
        self.commit(&self.running(), CANCELLED_AT, 9, &cancel(reason))
    }

    /// Cancelled while attempt 1 of step 0 was running.
    pub fn cancelled(&self) -> Execution {
        self.cancel_running("customer withdrew the order").0
    }

    /// A finished execution whose lifecycle events were never confirmed published.
    pub fn unpublished(&self) -> Execution {
        let mut record = self.succeeded();
        record.events = vec![LifecycleEvent {
            seq: 0,
            kind: LifecycleKind::ExecutionSucceeded,
            at: record.updated_at,
            step: Some(2),
            code: None,
        }];
        record.event_seq = 1;
        record.publish_by = Some(record.updated_at + LEASE);
        record
    }

    /// Step 0 (a task) replied `value` at `PARKED_AT`: the record and what the reply launched.
    pub fn past_first_step(&self, value: Value) -> (Execution, Vec<Action>) {
        let record = self.running_with(json!({"order": 7}));
        self.commit(&record, PARKED_AT, 3, &ok_reply(0, 1, value))
    }

    /// An execution of `approval_pipeline` parked at the await step, its notice confirmed sent.
    pub fn waiting(&self) -> Execution {
        let (record, actions) = self.past_first_step(json!({"order": 7, "valid": true}));
        assert_eq!(record.status, Status::WaitingExternal);
        let unit = record.await_unit.clone().expect("an await unit");
        assert_eq!(actions, vec![Action::SendAwaitNotice { unit: unit.id }]);
        assert_eq!(unit.id, launch_id(EXEC, 1, 1));
        assert_eq!(unit.deadline, ts(PARKED_AT + i64::from(WAIT_SECS) * 1000));
        assert!(!unit.notice_sent);
        assert_eq!(
            record.wake_at,
            Some(ts(PARKED_AT + LEASE_MS)),
            "due soon, until the notice is confirmed"
        );
        let sent = Event::AwaitNoticeSent { unit: unit.id };
        let (record, actions) = self.commit(&record, PARKED_AT + 5, 4, &sent);
        assert!(actions.is_empty());
        assert!(record.await_unit.as_ref().unwrap().notice_sent);
        assert_eq!(
            record.wake_at,
            Some(unit.deadline),
            "then due at the deadline"
        );
        record
    }

    /// A fan-out child (of `child_pipeline`) running its step, its parent the batch `EXEC`'s item 0.
    pub fn running_child(&self) -> Execution {
        let (mut record, actions) = self.started();
        record.parent = Some(ParentLink {
            execution_id: Uuid::from_u128(77),
            interaction: "item-0".into(),
            token: "t0".into(),
            complete_to: "replies".into(),
            unit: Some(PARENT_UNIT),
            step: 1,
            signature: None,
        });
        self.launch(&record, LAUNCHED_AT, 2, &actions).0
    }
}

//! The machine's transition table as data: one row per way an event commits, naming the statuses it
//! applies from, the event kinds, the guard and effect (as the doc tables of the machine show them)
//! and the tests that cover it; then the effects `decide` adds to any such commit. The state-machine
//! tests check that every (status, event kind) pair `decide` commits has a row in `TRANSITIONS`, that
//! every row's tests exist, and that the doc tables are these tables.

use super::Event;
use crate::execution::Status;

/// What an event is, without its data. A worker's message (`Event::FromWorker`) is of the kind of the
/// event it wraps: once its sender is proven, it is applied as that event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    Claim,
    LaunchWork,
    Reply,
    Redrive,
    Cancel,
    Heartbeat,
    DeadLetterSent,
    Incident,
    AwaitNoticeSent,
    EventsPublished,
    ParentNotified,
    CompleteInteraction,
    Rejoin,
    CancelFromParent,
    FanOutSized,
    FanOutSettled,
}

impl EventKind {
    pub const ALL: &'static [EventKind] = &[
        EventKind::Claim,
        EventKind::LaunchWork,
        EventKind::Reply,
        EventKind::Redrive,
        EventKind::Cancel,
        EventKind::Heartbeat,
        EventKind::DeadLetterSent,
        EventKind::Incident,
        EventKind::AwaitNoticeSent,
        EventKind::EventsPublished,
        EventKind::ParentNotified,
        EventKind::CompleteInteraction,
        EventKind::Rejoin,
        EventKind::CancelFromParent,
        EventKind::FanOutSized,
        EventKind::FanOutSettled,
    ];
}

impl Event {
    /// The event's kind; a worker's message counts as the event it wraps.
    pub fn kind(&self) -> EventKind {
        match self {
            Event::Claim => EventKind::Claim,
            Event::LaunchWork { .. } => EventKind::LaunchWork,
            Event::Reply { .. } => EventKind::Reply,
            Event::Redrive { .. } => EventKind::Redrive,
            Event::Cancel { .. } => EventKind::Cancel,
            Event::Heartbeat { .. } => EventKind::Heartbeat,
            Event::DeadLetterSent { .. } => EventKind::DeadLetterSent,
            Event::Incident { .. } => EventKind::Incident,
            Event::AwaitNoticeSent { .. } => EventKind::AwaitNoticeSent,
            Event::EventsPublished { .. } => EventKind::EventsPublished,
            Event::ParentNotified => EventKind::ParentNotified,
            Event::Rejoin { .. } => EventKind::Rejoin,
            Event::CancelFromParent { .. } => EventKind::CancelFromParent,
            Event::FromWorker { event, .. } => event.kind(),
            Event::CompleteInteraction { .. } => EventKind::CompleteInteraction,
            Event::FanOutSized { .. } => EventKind::FanOutSized,
            Event::FanOutSettled { .. } => EventKind::FanOutSettled,
        }
    }
}

/// One row of the transition table: an event of one of `events`, on a record in one of `from`,
/// passing `guard`, commits `effect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: &'static [Status],
    pub events: &'static [EventKind],
    pub guard: &'static str,
    pub effect: &'static str,
    /// Names of the test functions (under `shared/tests`) that exercise the row.
    pub tests: &'static [&'static str],
}

/// Every status.
pub const ANY_STATUS: &[Status] = &[
    Status::Queued,
    Status::Running,
    Status::WaitRetry,
    Status::WaitingExternal,
    Status::Succeeded,
    Status::Failed,
    Status::Dlq,
    Status::Cancelled,
];
/// The statuses of an execution that has not ended.
pub const LIVE: &[Status] = &[
    Status::Queued,
    Status::Running,
    Status::WaitRetry,
    Status::WaitingExternal,
];
/// The statuses of an execution that has ended.
pub const TERMINAL: &[Status] = &[
    Status::Succeeded,
    Status::Failed,
    Status::Dlq,
    Status::Cancelled,
];

const QUEUED_OR_RETRY: &[Status] = &[Status::Queued, Status::WaitRetry];
const RUNNING: &[Status] = &[Status::Running];
const WAITING: &[Status] = &[Status::WaitingExternal];
const FAILED: &[Status] = &[Status::Failed, Status::Dlq];
const NOT_SUCCEEDED: &[Status] = &[Status::Failed, Status::Dlq, Status::Cancelled];
const SUCCEEDED: &[Status] = &[Status::Succeeded];

const fn row(
    from: &'static [Status],
    events: &'static [EventKind],
    guard: &'static str,
    effect: &'static str,
    tests: &'static [&'static str],
) -> Transition {
    Transition {
        from,
        events,
        guard,
        effect,
        tests,
    }
}

use EventKind as E;

/// The transition table (rendered as the doc table at the top of the machine).
pub const TRANSITIONS: &[Transition] = &[
    row(
        LIVE,
        &[E::Claim],
        "due, lease absent or expired",
        "lease (gen+1) · EnqueueLaunch",
        &[
            "claim_of_due_unleased_execution_takes_lease_with_next_generation_and_enqueues_launch",
            "claim_after_lease_expiry_takes_over_with_next_generation_and_fences_old_launch_work",
        ],
    ),
    row(
        TERMINAL,
        &[E::Claim],
        "due: dead letter/parent notice unsent",
        "SendDeadLetter/NotifyParent again",
        &[
            "claim_of_failed_execution_whose_dead_letter_is_unsent_sends_it_again",
            "a_child_that_ends_tells_its_parent_until_confirmed",
        ],
    ),
    row(
        ANY_STATUS,
        &[E::Claim],
        "only the outbox due, tries left",
        "PublishEvents again, next check backed off",
        &["an_outbox_that_is_never_confirmed_is_retried_less_often_then_dropped_and_noted"],
    ),
    row(
        ANY_STATUS,
        &[E::Claim],
        "only the outbox due, none left/events off",
        "outbox dropped, EVENTS_DROPPED incident",
        &[
            "an_outbox_that_is_never_confirmed_is_retried_less_often_then_dropped_and_noted",
            "an_outbox_is_dropped_at_once_when_lifecycle_events_are_switched_off",
        ],
    ),
    row(
        QUEUED_OR_RETRY,
        &[E::LaunchWork],
        "lease generation+token match, task",
        "RUNNING, step `launching` · SendRequest",
        &[
            "launch_work_starts_first_attempt_of_queued_execution_with_deterministic_launch_id",
            "launch_work_on_wait_retry_starts_next_attempt_with_new_launch_id",
        ],
    ),
    row(
        QUEUED_OR_RETRY,
        &[E::LaunchWork],
        "lease match, await step",
        "WAITING_EXTERNAL, await unit · SendAwaitNotice",
        &["launch_work_of_an_await_step_parks_the_execution_on_an_await_unit"],
    ),
    row(
        QUEUED_OR_RETRY,
        &[E::LaunchWork],
        "lease match, fan-out over n > 0 items",
        "WAITING_EXTERNAL, fan-out unit of n · SendAwaitNotice",
        &["launch_work_of_a_fan_out_step_waits_on_one_child_per_item"],
    ),
    row(
        QUEUED_OR_RETRY,
        &[E::LaunchWork],
        "lease match, fan-out over no items",
        "step done: next step launched, or SUCCEEDED",
        &["launch_work_of_a_fan_out_over_no_items_goes_straight_on"],
    ),
    row(
        QUEUED_OR_RETRY,
        &[E::LaunchWork],
        "lease match, fan-out, items in an object",
        "WAITING_EXTERNAL, unit to size · SendAwaitNotice",
        &["a_fan_out_over_items_in_an_object_is_sized_before_its_children_start"],
    ),
    row(
        RUNNING,
        &[E::LaunchWork],
        "lease match, deadline passed, no resend",
        "same launch re-sent · SendRequest",
        &["launch_work_on_running_execution_past_deadline_resends_same_launch_id_once"],
    ),
    row(
        RUNNING,
        &[E::LaunchWork],
        "lease match, deadline passed, resent",
        "attempt failed: STEP_TIMEOUT, retryable",
        &[
            "launch_work_on_resent_attempt_past_deadline_times_it_out_and_schedules_retry",
            "step_timeout_on_last_attempt_of_budget_fails_execution",
        ],
    ),
    row(
        &[Status::Running, Status::WaitingExternal],
        &[E::LaunchWork],
        "lease match, nothing due under it",
        "lease released",
        &["launch_work_on_running_execution_before_deadline_only_releases_lease"],
    ),
    row(
        WAITING,
        &[E::LaunchWork],
        "lease match, due, before the deadline",
        "SendAwaitNotice again, checked a lease later",
        &["an_unconfirmed_notice_is_sent_again_by_the_sweeper"],
    ),
    row(
        WAITING,
        &[E::LaunchWork],
        "lease match, await deadline passed",
        "step failed: AWAIT_TIMEOUT, FAILED",
        &["the_deadline_fails_the_step_with_await_timeout_through_the_sweeper"],
    ),
    row(
        RUNNING,
        &[E::Reply],
        "current launch, ok, steps left",
        "output kept, next step launched (as above)",
        &[
            "successful_reply_on_middle_step_records_output_and_launches_next_step",
            "an_await_step_parks_the_execution_with_unguessable_distinct_tokens",
            "a_fan_out_resumes_once_when_its_last_child_is_counted",
            "a_fan_out_over_no_items_is_done_at_once",
        ],
    ),
    row(
        RUNNING,
        &[E::Reply],
        "current launch, ok, last step",
        "SUCCEEDED with result, off the due index",
        &["successful_reply_on_last_step_succeeds_execution_with_result_and_no_due_time"],
    ),
    row(
        RUNNING,
        &[E::Reply],
        "current launch, error, retry in ≤ 900 s",
        "WAIT_RETRY, lease · EnqueueLaunch(delay)",
        &[
            "retryable_failure_with_budget_left_waits_for_retry_under_new_lease_and_jittered_delay",
            "retry_delay_follows_the_context_jitter",
        ],
    ),
    row(
        RUNNING,
        &[E::Reply],
        "current launch, error, retry in > 900 s",
        "WAIT_RETRY, no lease, due at the retry time",
        &[
            "retry_delay_beyond_sqs_limit_is_left_to_the_due_index_without_lease",
            "retry_delay_of_exactly_900_seconds_is_still_enqueued_and_one_ms_more_is_not",
        ],
    ),
    row(
        RUNNING,
        &[E::Reply],
        "current launch, error, no retry",
        "FAILED, dead letter marked · SendDeadLetter",
        &[
            "retryable_failure_of_last_attempt_in_budget_fails_execution_with_the_error",
            "non_retryable_failure_fails_execution_at_once",
            "error_code_listed_non_retryable_in_policy_fails_at_once_although_worker_says_retryable",
            "terminal_failure_marks_a_dead_letter_in_the_same_commit_and_sends_it",
        ],
    ),
    row(
        &[Status::Running, Status::WaitRetry, Status::Queued],
        &[E::Reply],
        "ok of an unanswered attempt of the step",
        "adopted: applied like the current one",
        &[
            "late_success_of_superseded_attempt_of_current_step_is_adopted",
            "late_success_of_timed_out_attempt_is_adopted_while_its_retry_waits",
            "late_success_of_timed_out_attempt_is_adopted_after_a_redrive",
        ],
    ),
    row(
        RUNNING,
        &[E::Heartbeat],
        "current launch, extends the deadline",
        "deadline extended (≤ 12 step timeouts)",
        &[
            "heartbeat_of_current_attempt_extends_its_deadline_and_changes_nothing_else",
            "heartbeats_extend_an_attempt_only_up_to_its_bound",
        ],
    ),
    row(
        FAILED,
        &[E::Redrive],
        "expected version",
        "QUEUED, new budget, lease · EnqueueLaunch",
        &["redrive_of_failed_execution_requeues_it_with_new_budget_audit_note_and_lease"],
    ),
    row(
        LIVE,
        &[E::Cancel],
        "",
        "CANCELLED · NotifyCancel / CancelChildren",
        &[
            "cancel_of_running_execution_cancels_it_and_clears_due_time",
            "cancel_of_waiting_retry_drops_its_lease_and_its_pending_launch_work_is_skipped",
            "cancel_of_queued_execution_notifies_no_worker",
            "a_cancelled_execution_takes_no_completion",
            "a_cancelled_fan_out_cancels_the_children_still_running",
        ],
    ),
    row(
        LIVE,
        &[E::CancelFromParent],
        "the parent's token",
        "CANCELLED · NotifyCancel if RUNNING",
        &["a_cancelled_fan_out_cancels_the_children_still_running"],
    ),
    row(
        FAILED,
        &[E::DeadLetterSent],
        "same dead-letter id, unsent",
        "marked sent, leaves the due index",
        &["dead_letter_sent_marks_it_sent_and_takes_the_execution_off_the_due_index"],
    ),
    row(
        WAITING,
        &[E::AwaitNoticeSent],
        "same unit, notice unsent",
        "notice marked sent, due at the deadline",
        &[
            "an_await_step_parks_the_execution_with_unguessable_distinct_tokens",
            "an_unconfirmed_notice_is_sent_again_by_the_sweeper",
        ],
    ),
    row(
        WAITING,
        &[E::CompleteInteraction],
        "right token, approved, others pending",
        "completion noted, still waiting",
        &["every_interaction_must_be_approved_before_resuming"],
    ),
    row(
        WAITING,
        &[E::CompleteInteraction],
        "right token, approved, the last one",
        "succeeds, output = input + answers (as ok)",
        &["approving_resumes_at_the_next_step_with_the_completion_payload"],
    ),
    row(
        WAITING,
        &[E::CompleteInteraction],
        "right token, rejected",
        "step failed: REJECTED, FAILED",
        &["rejecting_fails_the_execution_with_the_reason"],
    ),
    row(
        WAITING,
        &[E::FanOutSized],
        "current unit to size, n > 0 items",
        "unit sized: n children, its tolerance",
        &["a_fan_out_over_items_in_an_object_is_sized_before_its_children_start"],
    ),
    row(
        WAITING,
        &[E::FanOutSized],
        "current unit to size, no items",
        "step done: next step launched, or SUCCEEDED",
        &["a_fan_out_over_items_in_an_object_is_sized_before_its_children_start"],
    ),
    row(
        WAITING,
        &[E::FanOutSized],
        "current unit to size, items unreadable",
        "step failed with the reading's error",
        &["a_fan_out_over_items_in_an_object_is_sized_before_its_children_start"],
    ),
    row(
        WAITING,
        &[E::FanOutSettled],
        "current unit, all counted, failures tolerated",
        "succeeds, output = input + results (as ok)",
        &["a_fan_out_resumes_once_when_its_last_child_is_counted"],
    ),
    row(
        WAITING,
        &[E::FanOutSettled],
        "current unit, failures beyond tolerance",
        "step failed: FAN_OUT_FAILED · CancelChildren",
        &["a_fan_out_fails_when_more_children_fail_than_it_tolerates"],
    ),
    row(
        ANY_STATUS,
        &[E::Incident],
        "",
        "noted on the record (latest ones kept)",
        &[
            "incident_is_noted_on_the_record_whatever_its_status_and_changes_nothing_else",
            "incidents_keep_only_the_latest_ones",
        ],
    ),
    row(
        ANY_STATUS,
        &[E::EventsPublished],
        "outbox holds events up to `through`",
        "those events leave the outbox",
        &["events_published_leave_the_outbox_and_a_redelivery_is_a_duplicate"],
    ),
    row(
        TERMINAL,
        &[E::ParentNotified],
        "has a parent, not yet told",
        "parent told, leaves the due index",
        &["a_child_that_ends_tells_its_parent_until_confirmed"],
    ),
    row(
        NOT_SUCCEEDED,
        &[E::Rejoin],
        "parent's token, another attempt",
        "QUEUED, new budget, lease · EnqueueLaunch",
        &[
            "a_failed_child_started_again_by_its_parent_runs_again",
            "a_cancelled_child_started_again_by_its_parent_runs_again",
        ],
    ),
    row(
        SUCCEEDED,
        &[E::Rejoin],
        "parent's token, another attempt",
        "parent told again · NotifyParent",
        &["an_ended_child_started_again_by_its_parent_tells_it_again_without_running"],
    ),
    row(
        LIVE,
        &[E::Rejoin],
        "parent's token, another attempt",
        "answers that attempt when it ends",
        &["a_running_child_started_again_answers_the_new_attempt"],
    ),
];

/// What `decide` adds to the commit of a row above (rendered as the second doc table).
pub const APPENDED: &[Transition] = &[
    row(
        LIVE,
        &[
            E::Reply,
            E::LaunchWork,
            E::CompleteInteraction,
            E::Cancel,
            E::CancelFromParent,
        ],
        "ends a fan-out child (parent set)",
        "+ NotifyParent, due until ParentNotified",
        &[
            "a_child_that_ends_tells_its_parent_until_confirmed",
            "a_cancelled_child_tells_its_parent",
        ],
    ),
    row(
        ANY_STATUS,
        EventKind::ALL,
        "lifecycle events on, the change makes some",
        "+ events in the outbox · PublishEvents",
        &["a_commit_with_lifecycle_events_on_fills_the_outbox_and_publishes_it"],
    ),
];

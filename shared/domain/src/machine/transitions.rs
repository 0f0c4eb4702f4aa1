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

pub(super) const QUEUED_OR_RETRY: &[Status] = &[Status::Queued, Status::WaitRetry];
pub(super) const RUNNING: &[Status] = &[Status::Running];
pub(super) const WAITING: &[Status] = &[Status::WaitingExternal];
pub(super) const FAILED: &[Status] = &[Status::Failed, Status::Dlq];
pub(super) const NOT_SUCCEEDED: &[Status] = &[Status::Failed, Status::Dlq, Status::Cancelled];
pub(super) const SUCCEEDED: &[Status] = &[Status::Succeeded];

pub(super) const fn row(
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

pub(super) use EventKind as E;

/// The transition table (rendered as the doc table at the top of the machine): the rows of each
/// event group, kept in the file that decides its events, then those `decide` handles itself.
pub const TRANSITIONS: &[Transition] = &ALL_ROWS;

const GROUPS: [&[Transition]; 6] = [
    super::lease::ROWS,
    super::replies::ROWS,
    super::operator::ROWS,
    super::notices::ROWS,
    super::fan_out::ROWS,
    RECORD,
];
const ALL_ROWS: [Transition; count(&GROUPS)] = concat(&GROUPS);

/// How many rows `groups` hold.
const fn count(groups: &[&[Transition]]) -> usize {
    let (mut g, mut n) = (0, 0);
    while g < groups.len() {
        n += groups[g].len();
        g += 1;
    }
    n
}

/// The rows of `groups`, in order, as one table.
const fn concat<const N: usize>(groups: &[&[Transition]]) -> [Transition; N] {
    let mut out = [row(&[], &[], "", "", &[]); N];
    let (mut g, mut k) = (0, 0);
    while g < groups.len() {
        let mut i = 0;
        while i < groups[g].len() {
            out[k] = groups[g][i];
            i += 1;
            k += 1;
        }
        g += 1;
    }
    out
}

/// The events `decide` handles itself, on any record.
#[rustfmt::skip]
const RECORD: &[Transition] = &[
    row(ANY_STATUS, &[E::Incident], "", "noted on the record (latest ones kept)", &["incident_is_noted_on_the_record_whatever_its_status_and_changes_nothing_else", "incidents_keep_only_the_latest_ones"]),
    row(ANY_STATUS, &[E::EventsPublished], "outbox holds events up to `through`", "those events leave the outbox", &["events_published_leave_the_outbox_and_a_redelivery_is_a_duplicate"]),
];

/// What `decide` adds to the commit of a row above (rendered as the second doc table).
#[rustfmt::skip]
pub const APPENDED: &[Transition] = &[
    row(LIVE, &[E::Reply, E::LaunchWork, E::CompleteInteraction, E::Cancel, E::CancelFromParent], "ends a fan-out child (parent set)", "+ NotifyParent, due until ParentNotified", &["a_child_that_ends_tells_its_parent_until_confirmed", "a_cancelled_child_tells_its_parent"]),
    row(ANY_STATUS, EventKind::ALL, "lifecycle events on, the change makes some", "+ events in the outbox · PublishEvents", &["a_commit_with_lifecycle_events_on_fills_the_outbox_and_publishes_it"]),
];

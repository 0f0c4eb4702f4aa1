//! Creating an execution: `start` (lease and launch work) and `start_launched` (first step launched in
//! the creating write).

use stepline::domain::{
    launch_id, start, start_launched, Action, Context, Decision, Event, NewExecution, Payload,
    Status, StepStatus,
};

use crate::fixtures::*;
use crate::invariants::assert_record_consistent;

#[test]
fn start_creates_queued_record_with_first_lease_and_launch_work() {
    let m = Machine::of(three_steps());
    let (record, actions) = m.started();

    assert_eq!(record.id, EXEC);
    assert_eq!(record.tenant, TENANT);
    assert_eq!(record.pipeline_id, "orders");
    assert_eq!(record.release_version, "2024-06-01.1");
    assert_eq!(record.idempotency_key.as_deref(), Some("idem-1"));
    assert_eq!(record.status, Status::Queued);
    assert_eq!((record.step, record.attempt, record.budget_base), (0, 0, 0));
    assert_eq!(record.version, 1);
    assert_eq!(record.generation, 1, "start takes the first lease");
    assert_eq!(record.lease, leased(1, T0 + LEASE_MS));
    assert_eq!(record.wake_at, Some(ts(T0)));
    assert_eq!(
        record.due_at(),
        Some(ts(T0 + LEASE_MS)),
        "due at lease expiry while leased"
    );
    assert_eq!(record.launch_id, None);
    assert_eq!(record.resends, 0);
    assert_eq!(record.input, Payload::new(input()));
    assert!(record.steps.is_empty());
    assert_eq!(record.result, None);
    assert_eq!(record.error, None);
    assert!(record.redrives.is_empty());
    assert_eq!((record.created_at, record.updated_at), (ts(T0), ts(T0)));
    assert_eq!(enqueued(&actions), (1, token(1), 0));
}

#[test]
fn submitting_launches_the_first_step_in_the_creating_write() {
    let m = Machine::of(three_steps());
    let (record, actions) =
        start_launched(NewExecution::of(EXEC, TENANT, &m.def, input()), &ctx(T0, 1));
    assert_eq!(record.version, 1, "one write: the create");
    assert_eq!(record.status, Status::Running);
    assert_eq!((record.step, record.attempt), (0, 1));
    assert_eq!(record.generation, 0, "no lease taken");
    assert_eq!(record.lease, None);
    let id = launch_id(EXEC, 0, 1);
    assert_eq!(record.launch_id, Some(id));
    assert_eq!(record.steps.len(), 1);
    assert_eq!(record.steps[0].status, StepStatus::Launching);
    // Saved as launching before the send: a crash in between is recovered at the deadline.
    assert_eq!(record.due_at(), Some(ts(T0 + 60_000)));
    assert_eq!(request_of(&actions), (0, 1, id, T0 + 60_000));
    assert_record_consistent(&record, &m.def);
    // The same record the lease-and-launch-work path reaches, but for the lease.
    let (queued, actions) = start(NewExecution::of(EXEC, TENANT, &m.def, input()), &ctx(T0, 1));
    let Action::EnqueueLaunch {
        generation, token, ..
    } = actions[0]
    else {
        panic!("{actions:?}")
    };
    let Decision::Commit {
        record: launched, ..
    } = m.decide(&queued, T0, 2, &Event::LaunchWork { generation, token })
    else {
        panic!()
    };
    assert_eq!(launched.steps, record.steps);
    assert_eq!(launched.launch_id, record.launch_id);
    assert_eq!(launched.wake_at, record.wake_at);

    // With lifecycle events, the start is announced in the same write.
    let (record, actions) = start_launched(
        NewExecution::of(EXEC, TENANT, &m.def, input()),
        &Context {
            lifecycle: true,
            ..ctx(T0, 1)
        },
    );
    assert_eq!(record.events.len(), 1);
    assert_eq!(actions.last(), Some(&Action::PublishEvents));
}

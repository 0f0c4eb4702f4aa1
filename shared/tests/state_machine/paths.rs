//! Whole executions: the happy path, and the happy path with a lost launch and a lost request.

use stepline::domain::{launch_id, Event, Payload, Status, StepStatus};

use crate::fixtures::*;

#[test]
fn three_step_happy_path_advances_version_by_one_per_commit_and_keeps_the_generation() {
    let m = Machine::of(three_steps());
    let (mut record, mut actions) = m.started();
    let mut versions = vec![record.version];
    let mut generations = vec![record.generation];

    let mut now = LAUNCHED_AT;
    (record, actions) = m.commit(&record, now, 2, &launch_work_of(&actions));
    versions.push(record.version);
    generations.push(record.generation);

    let mut expected_input = Payload::new(input());
    for s in 0..3u32 {
        let (step, attempt, id, deadline) = request_of(&actions);
        assert_eq!((step, attempt, id), (s, 1, launch_id(EXEC, s, 1)));
        assert_eq!(deadline, now + TIMEOUT_MS[s as usize]);
        assert_eq!(
            record.step_input(s),
            Some(&expected_input),
            "input of step {s}"
        );

        now += 3_000;
        (record, actions) = m.commit(&record, now, 10 + u128::from(s), &ok_reply(s, 1, output(s)));
        versions.push(record.version);
        generations.push(record.generation);
        expected_input = Payload::new(output(s));
    }

    assert_eq!(record.status, Status::Succeeded);
    assert!(actions.is_empty());
    assert_eq!(record.result, Some(Payload::new(output(2))));
    assert_eq!(record.due_at(), None);
    assert_eq!(record.version, 5);
    assert_eq!(versions, vec![1, 2, 3, 4, 5]);
    assert_eq!(generations, vec![1, 1, 1, 1, 1], "only start took a lease");
    assert_eq!(
        record.input,
        Payload::default(),
        "the input travelled on with step 0"
    );
    // Only the last step's progress is kept (the item does not grow with the pipeline).
    assert_eq!(record.first_step, 2);
    let [progress] = &record.steps[..] else {
        panic!("one step's progress: {:?}", record.steps)
    };
    let id = launch_id(EXEC, 2, 1);
    assert_eq!(progress.status, StepStatus::Succeeded);
    assert_eq!(progress.launch_id, id);
    assert_eq!(progress.receipt.as_ref().map(|r| r.launch_id), Some(id));
}

#[test]
fn happy_path_with_lost_launch_and_resend_moves_generation_only_when_a_lease_is_taken() {
    let m = Machine::of(three_steps());
    let (mut record, actions) = m.started();
    let mut history = vec![(record.version, record.generation)];

    // The first launch work is lost: the sweeper takes the lease over at its expiry.
    let _lost = launch_work_of(&actions);
    let (next, actions) = m.commit(&record, T0 + LEASE_MS, 2, &Event::Claim);
    record = next;
    history.push((record.version, record.generation));
    let launched_at = T0 + LEASE_MS + 10;
    let (next, _) = m.commit(&record, launched_at, 3, &launch_work_of(&actions));
    record = next;
    history.push((record.version, record.generation));

    // The request is lost too: past its deadline the sweeper claims and the request is re-sent.
    let deadline = launched_at + TIMEOUT_MS[0];
    let (next, actions) = m.commit(&record, deadline, 4, &Event::Claim);
    record = next;
    history.push((record.version, record.generation));
    let (next, actions) = m.commit(&record, deadline + 10, 5, &launch_work_of(&actions));
    record = next;
    history.push((record.version, record.generation));
    assert_eq!(
        request_of(&actions).2,
        launch_id(EXEC, 0, 1),
        "the re-sent request keeps its id"
    );

    for s in 0..3u32 {
        let at = deadline + 1_000 * (i64::from(s) + 1);
        let (next, _) = m.commit(&record, at, 6 + u128::from(s), &ok_reply(s, 1, output(s)));
        record = next;
        history.push((record.version, record.generation));
    }

    assert_eq!(record.status, Status::Succeeded);
    assert_eq!(
        history,
        vec![
            (1, 1), // start: lease
            (2, 2), // claim: lease taken over
            (3, 2), // launch
            (4, 3), // claim past deadline: lease
            (5, 3), // resend
            (6, 3), // step 0 succeeded
            (7, 3), // step 1 succeeded
            (8, 3), // step 2 succeeded
        ]
    );
}

//! What operators see, over in-memory ports: an execution's history (every attempt with its launch id,
//! times, outcome and error code, heartbeats, re-drives, its end), the journal that takes what no
//! longer fits in the record, and listing by pipeline, status, tenant and creation time.

mod common;

use std::sync::Arc;

use common::{coordinator_of, last_request, reply, sqs, submitted, task_pipeline};
use serde_json::json;
use stepline::adapters::{InMemoryExecutionStore, RecordingSender};
use stepline::coordinator::MAX_INDEX_READS;
use stepline::domain::history::{What, JOURNAL_CHUNK};
use stepline::domain::{launch_id, Status, StepError, Timestamp};
use stepline::envelope::ReplyOutcome;
use stepline::handlers::{self, RedriveRequest};
use stepline::{Coordinator, ListRequest, SubmitRequest};

/// Answers the last request with `outcome`.
async fn answer(coordinator: &Coordinator, sender: &RecordingSender, outcome: ReplyOutcome) {
    let header = last_request(sender);
    let response = handlers::completion(coordinator, sqs(reply(&header, outcome))).await;
    assert!(response.batch_item_failures.is_empty());
}

fn succeeded(output: serde_json::Value) -> ReplyOutcome {
    ReplyOutcome::Succeeded { output }
}

/// A request for up to `limit` executions of the pipeline `shop`.
fn shop(limit: usize) -> ListRequest {
    ListRequest {
        pipeline_id: "shop".into(),
        limit,
        ..Default::default()
    }
}

/// A coordinator over an in-memory store with one execution of `shop` submitted per tenant given, a
/// few milliseconds apart (the listing's order), and their ids.
async fn shop_of(tenants: &[&str]) -> (Arc<InMemoryExecutionStore>, Coordinator, Vec<uuid::Uuid>) {
    let store = Arc::new(InMemoryExecutionStore::default());
    let sender = Arc::new(RecordingSender::default());
    let coordinator = coordinator_of(task_pipeline("shop", &["a"]), store.clone(), sender).await;
    let mut ids = Vec::new();
    for (k, tenant) in tenants.iter().enumerate() {
        let request = SubmitRequest {
            pipeline_id: "shop".into(),
            tenant: tenant.to_string(),
            input: json!({"k": k}),
            ..Default::default()
        };
        ids.push(coordinator.submit(request).await.unwrap().execution);
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    (store, coordinator, ids)
}

/// The executions `request` lists, in the order listed.
async fn listed(coordinator: &Coordinator, request: ListRequest) -> Vec<uuid::Uuid> {
    let page = coordinator.list(request).await.unwrap();
    page.executions.iter().map(|e| e.execution_id).collect()
}

#[tokio::test]
async fn the_history_tells_every_attempt_heartbeat_failure_and_re_drive_in_order() {
    let store = Arc::new(InMemoryExecutionStore::default());
    let def = task_pipeline("story", &["a", "b", "c"]);
    let (sender, coordinator, id) = submitted(def, store.clone()).await;
    answer(&coordinator, &sender, succeeded(json!({"a": 1}))).await;
    // Step b: two heartbeats, then a final failure. (A heartbeat is written, and so recorded, when it
    // moves the attempt's deadline: a millisecond after the last one does.)
    let header = last_request(&sender);
    for _ in 0..2 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let beat = reply(&header, ReplyOutcome::Running);
        assert!(handlers::completion(&coordinator, sqs(beat))
            .await
            .batch_item_failures
            .is_empty());
    }
    let error = StepError::new("OUT_OF_STOCK", "none left", false);
    let failed = reply(&header, ReplyOutcome::Failed { error });
    assert!(handlers::completion(&coordinator, sqs(failed))
        .await
        .batch_item_failures
        .is_empty());
    assert_eq!(coordinator.get(id).await.unwrap().status, Status::Failed);
    // Re-driven: b runs again (its launch work goes through the launch queue) and the rest succeed.
    let version = coordinator.get(id).await.unwrap().version;
    let redrive = RedriveRequest {
        execution_id: id,
        expected_version: version,
        reason: "restocked".into(),
        release_version: None,
    };
    handlers::redrive(&coordinator, redrive).await.unwrap();
    let launches: Vec<_> = sender
        .drain()
        .into_iter()
        .filter(|(q, _)| q == "launch")
        .collect();
    for (_, work) in launches {
        handlers::launch(&coordinator, sqs(work.body)).await;
    }
    answer(&coordinator, &sender, succeeded(json!({"b": 2}))).await;
    answer(&coordinator, &sender, succeeded(json!({"c": 3}))).await;

    let history = coordinator.history(id).await.unwrap();
    assert_eq!(history.execution.status, Status::Succeeded);
    let kinds: Vec<String> = history
        .entries
        .iter()
        .map(|e| {
            serde_json::to_value(&e.what).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "STARTED",
            "LAUNCHED",
            "STEP_SUCCEEDED",
            "LAUNCHED",
            "HEARTBEAT",
            "STEP_FAILED",
            "DEAD_LETTERED",
            "ENDED",
            "REDRIVEN",
            "LAUNCHED",
            "STEP_SUCCEEDED",
            "LAUNCHED",
            "STEP_SUCCEEDED",
            "ENDED"
        ],
        "{:#?}",
        history.entries
    );
    assert!(history.entries.windows(2).all(|w| w[0].at <= w[1].at));
    // Attempts: launch ids, outcomes, codes, heartbeats, durations, outputs.
    let attempts: Vec<(u32, u32, &str)> = history
        .attempts
        .iter()
        .map(|a| (a.step, a.attempt, a.outcome.as_str()))
        .collect();
    assert_eq!(
        attempts,
        [
            (0, 1, "SUCCEEDED"),
            (1, 1, "FAILED"),
            (1, 2, "SUCCEEDED"),
            (2, 1, "SUCCEEDED")
        ]
    );
    for a in &history.attempts {
        assert_eq!(a.launch_id, launch_id(id, a.step, a.attempt));
        assert!(a.duration_ms.is_some_and(|d| d >= 0));
    }
    let failed = &history.attempts[1];
    assert_eq!(failed.code.as_deref(), Some("OUT_OF_STOCK"));
    assert_eq!(failed.retryable, Some(false));
    assert_eq!(failed.heartbeats, 2);
    assert_eq!(history.attempts[2].output, Some(json!({"b": 2})));
    assert!(matches!(
        &history.entries[8].what,
        What::Redriven { reason, from: Status::Failed, release: None } if reason == "restocked"
    ));
    let states: Vec<&str> = history.steps.iter().map(|s| s.state).collect();
    assert_eq!(states, ["SUCCEEDED", "SUCCEEDED", "SUCCEEDED"]);
}

#[tokio::test]
async fn what_no_longer_fits_in_the_record_goes_to_the_journal_a_chunk_at_a_time() {
    let steps: Vec<String> = (0..40).map(|k| format!("s{k}")).collect();
    let names: Vec<&str> = steps.iter().map(String::as_str).collect();
    let store = Arc::new(InMemoryExecutionStore::default());
    let (sender, coordinator, id) = submitted(task_pipeline("long", &names), store.clone()).await;
    let mut writes = Vec::new();
    for k in 0..40 {
        let before = store.writes();
        answer(&coordinator, &sender, succeeded(json!({"k": k}))).await;
        writes.push(store.writes() - before);
        let record = store.snapshot(id).unwrap();
        assert!(
            record.history.len() <= 2 * JOURNAL_CHUNK + 2,
            "the record holds a bounded history ({} entries at step {k})",
            record.history.len()
        );
    }
    let record = store.snapshot(id).unwrap();
    assert_eq!(record.status, Status::Succeeded);
    // 1 start + 40 launches + 40 successes + 1 end: 82 entries, whole chunks of them in the journal.
    let chunk = JOURNAL_CHUNK as u64;
    assert_eq!(record.history_base % chunk, 0);
    assert_eq!(record.history_base + record.history.len() as u64, 82);
    assert!(record.history.len() <= 2 * JOURNAL_CHUNK + 2);
    let journal_writes = writes.iter().sum::<usize>() - 40;
    assert_eq!(
        journal_writes as u64,
        record.history_base / chunk,
        "one journal write per {JOURNAL_CHUNK} entries"
    );
    let history = coordinator.history(id).await.unwrap();
    assert!(history.missing_chunks.is_empty());
    assert_eq!(history.entries.len(), 82);
    assert_eq!(history.attempts.len(), 40);
    assert!(history
        .attempts
        .iter()
        .enumerate()
        .all(|(k, a)| a.step == k as u32
            && a.outcome == "SUCCEEDED"
            && a.output == Some(json!({"k": k}))));
}

#[tokio::test]
async fn executions_are_listed_newest_first_by_pipeline_status_and_tenant_a_page_at_a_time() {
    let (store, coordinator, ids) =
        shop_of(&["even", "odd", "even", "odd", "even", "odd", "even"]).await;
    // Two of them are cancelled.
    for id in [ids[1], ids[4]] {
        let version = coordinator.get(id).await.unwrap().version;
        handlers::cancel(
            &coordinator,
            stepline::handlers::CancelRequest {
                execution_id: id,
                reason: "test".into(),
            },
        )
        .await
        .unwrap();
        assert!(coordinator.get(id).await.unwrap().version > version);
    }

    let all = coordinator.list(shop(50)).await.unwrap();
    let every: Vec<_> = all.executions.iter().map(|e| e.execution_id).collect();
    let newest_first: Vec<_> = ids.iter().rev().copied().collect();
    assert_eq!(every, newest_first);
    assert!(all.next.is_none());

    let cancelled = ListRequest {
        statuses: vec![Status::Cancelled],
        ..shop(50)
    };
    assert_eq!(listed(&coordinator, cancelled).await, [ids[4], ids[1]]);

    let odd = ListRequest {
        tenant: Some("odd".into()),
        ..shop(50)
    };
    assert_eq!(listed(&coordinator, odd).await, [ids[5], ids[3], ids[1]]);

    // Pages of 3, each going on from the last.
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = coordinator
            .list(ListRequest {
                after: after.clone(),
                ..shop(3)
            })
            .await
            .unwrap();
        assert!(page.executions.len() <= 3);
        paged.extend(page.executions.iter().map(|e| e.execution_id));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(paged, newest_first);

    // A window: created before the fourth execution.
    let fourth = coordinator.get(ids[3]).await.unwrap().created_at;
    let early = ListRequest {
        to: Some(fourth),
        ..shop(50)
    };
    assert_eq!(listed(&coordinator, early).await, [ids[2], ids[1], ids[0]]);
    // Another pipeline's executions are not listed; a bad position is a typed error.
    let other = ListRequest {
        pipeline_id: "other".into(),
        ..shop(50)
    };
    assert!(listed(&coordinator, other).await.is_empty());
    // An empty window lists nothing, without a read.
    let empty = ListRequest {
        from: Some(fourth),
        to: Some(fourth),
        ..shop(50)
    };
    let reads = store.lists();
    assert!(listed(&coordinator, empty).await.is_empty());
    assert_eq!(store.lists(), reads);
    let bad = ListRequest {
        after: Some("nonsense".into()),
        ..shop(5)
    };
    let bad = coordinator.list(bad).await.unwrap_err();
    assert_eq!(bad.code().as_str(), "INVALID_REQUEST");
}

#[tokio::test]
async fn a_listing_reads_a_bounded_number_of_index_pages_however_wide_its_window() {
    let (store, coordinator, ids) = shop_of(&["acme"; 3]).await;
    let newest_first: Vec<_> = ids.iter().rev().copied().collect();
    let reads = |request: ListRequest| {
        let (coordinator, store) = (&coordinator, &store);
        async move {
            let before = store.lists();
            let page = coordinator.list(request).await.unwrap();
            (page, store.lists() - before)
        }
    };

    // Every day back to the epoch: one bounded call finds today's executions, and says where to go on.
    let since_1970 = ListRequest {
        from: Some(Timestamp::from_millis(1)),
        ..shop(50)
    };
    let (page, index_reads) = reads(since_1970.clone()).await;
    assert!(
        index_reads <= MAX_INDEX_READS,
        "{index_reads} index pages read"
    );
    let listed: Vec<_> = page.executions.iter().map(|e| e.execution_id).collect();
    assert_eq!(listed, newest_first);
    let next = page.next.expect("a window not walked to its end goes on");
    // The next call goes on from where the first stopped, just as bounded, and lists nothing twice.
    let (later, index_reads) = reads(ListRequest {
        after: Some(next),
        ..since_1970
    })
    .await;
    assert!(
        index_reads <= MAX_INDEX_READS,
        "{index_reads} index pages read"
    );
    assert!(later.executions.is_empty(), "{later:?}");

    // A window ending thousands of years ahead lists from a day ahead of the clock, bounded too.
    let far_ahead = ListRequest {
        to: Some(Timestamp::from_millis(1_000_000_000_000_000)),
        ..shop(50)
    };
    let (page, index_reads) = reads(far_ahead).await;
    // The default window, a week back from there: nine days at most, walked to its end.
    assert!(index_reads <= 9, "{index_reads} index pages read");
    assert!(page.next.is_none());
    let listed: Vec<_> = page.executions.iter().map(|e| e.execution_id).collect();
    assert_eq!(listed, newest_first);
}

//! The store's conditional write is the coordinator's only lock: of writers racing on one version,
//! exactly one may win, and nothing a loser wrote may survive. These tests race real writers on the
//! emulator through the same store the handlers use; an emulator that let two conditional writes both
//! pass (stock moto under a threaded server does, about one round in thirty) would lose updates here,
//! as it lost fan-out notices in the csv demo.

use std::sync::Arc;

use futures_util::future::join_all;
use serde_json::json;
use stepline::adapters::DynamoDbExecutionStore;
use stepline::domain::{Incident, PipelineDef, Status, Timestamp, Verdict};
use stepline::envelope::{InteractionMessage, INTERACTION_KIND};
use stepline::handlers;
use stepline::ports::{FanOutLedger, ItemOutcome};
use stepline_suite::{await_step, on_emulator, TestStack};

/// A value of many small nested fields, as a parent with many interactions holds: the emulator spends
/// real time on each such write, which is what opens the window between its condition check and its
/// write.
fn bulky(tag: &str) -> serde_json::Value {
    json!((0..40)
        .map(|i| json!({"tag": tag, "i": i, "fields": [{"a": 1}, {"b": "two"}, {"c": [3, 4]}]}))
        .collect::<Vec<_>>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_conditional_writes_on_one_execution_let_exactly_one_win() -> anyhow::Result<()> {
    let stack = on_emulator!(TestStack::new("atomic-put", |_| {}).await?);
    let id = stack.submit(json!({"orderId": "o-1", "items": []})).await?;
    let store = stack.api.store().clone();
    const ROUNDS: usize = 80;
    const WRITERS: usize = 6;
    for round in 0..ROUNDS {
        let current = store.get(id).await?.expect("record exists");
        let writes = (0..WRITERS).map(|writer| {
            let store = store.clone();
            let mut next = current.clone();
            next.version += 1;
            next.incidents = (0..60)
                .map(|i| Incident {
                    at: Timestamp::from_millis(i),
                    code: format!("W{writer}"),
                    detail: format!("round {round} writer {writer} incident {i}"),
                })
                .collect();
            let expected = current.version;
            async move { (writer, store.replace(&next, expected).await) }
        });
        let results = join_all(writes).await;
        let winners: Vec<usize> = results
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(w, _)| *w)
            .collect();
        assert_eq!(
            winners.len(),
            1,
            "round {round}: writers {winners:?} all passed the condition on version {}",
            current.version
        );
        let stored = store.get(id).await?.expect("record exists");
        assert_eq!(stored.version, current.version + 1);
        assert_eq!(
            stored.incidents[0].code,
            format!("W{}", winners[0]),
            "round {round}: the stored record is the winner's"
        );
    }
    Ok(())
}

/// What the csv demo does to a parent when its children end together: every interaction of one await
/// unit completed at the same moment. Each completion must be recorded, and the step must resolve.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interactions_completed_at_once_are_all_recorded() -> anyhow::Result<()> {
    stepline_local::needs_emulator!();
    const INTERACTIONS: usize = 8;
    let notices = format!("stepline-{}-gather", uuid::Uuid::new_v4().simple());
    let stack = TestStack::new("atomic-gather", |def: &mut PipelineDef| {
        let items = (0..INTERACTIONS).map(|i| format!("item-{i}")).collect();
        def.steps = vec![await_step(def, "gather", &notices, items)];
    })
    .await?;
    stack.create_queue(&notices).await?;
    let api = Arc::new(stack.api);
    for round in 0..10 {
        let id = {
            let submitted = api
                .submit(stepline::SubmitRequest {
                    pipeline_id: order_worker::PIPELINE_ID.into(),
                    tenant: "acme".into(),
                    input: json!({"round": round}),
                    ..Default::default()
                })
                .await?;
            submitted.execution
        };
        let record = api.get(id).await?;
        assert_eq!(record.status, Status::WaitingExternal);
        let unit = record.await_unit.expect("an await unit");
        let answers = unit.interactions.iter().map(|interaction| {
            let api = api.clone();
            let message = InteractionMessage {
                kind: INTERACTION_KIND.into(),
                execution_id: id,
                interaction: interaction.id.clone(),
                token: interaction.token.clone(),
                verdict: Verdict::Approved,
                payload: json!({"who": interaction.id, "note": bulky(&interaction.id)}),
                unit: None,
            };
            async move { handlers::complete_interaction(&api, message).await }
        });
        for result in join_all(answers).await {
            result?;
        }
        let done = api.get(id).await?;
        let recorded = done
            .await_unit
            .as_ref()
            .map(|u| {
                u.interactions
                    .iter()
                    .filter(|i| i.completion.is_some())
                    .count()
            })
            .unwrap_or_default();
        assert_eq!(
            (done.status, recorded),
            (Status::Succeeded, INTERACTIONS),
            "round {round}: every completion recorded and the step resolved"
        );
        let answered = done.result.expect("a result").value()["interactions"]
            .as_object()
            .map_or(0, |m| m.len());
        assert_eq!(answered, INTERACTIONS);
    }
    Ok(())
}

/// Children of one ledger block ending at the same moment: each count must see the block as it was
/// just before its own write, so exactly one of them finds the block complete. An emulator whose
/// update returned an older item than the one it changed let two counts both miss the last child, and
/// the csv demo's parent waited for ever with every payment counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn children_of_one_block_counted_at_once_let_exactly_one_complete_it() -> anyhow::Result<()> {
    let stack = on_emulator!(TestStack::new("atomic-count", |_| {}).await?);
    let ledger = DynamoDbExecutionStore::new(
        stack.local.clients.dynamodb.clone(),
        stack.local.stack.table("ExecutionTable")?,
        4,
    );
    const ROUNDS: usize = 20;
    const CHILDREN: u32 = 40;
    for round in 0..ROUNDS {
        let unit = uuid::Uuid::new_v4();
        let counts = (0..CHILDREN).map(|item| {
            let ledger = &ledger;
            let outcome = ItemOutcome {
                item,
                succeeded: item % 3 != 0,
                version: 1,
            };
            async move { ledger.set_outcome(unit, outcome).await }
        });
        let mut seen = Vec::new();
        for count in join_all(counts).await {
            seen.push(count?.expect("a first outcome is always set").counted);
        }
        seen.sort_unstable();
        assert_eq!(
            seen,
            (1..=CHILDREN).collect::<Vec<_>>(),
            "round {round}: each count must see the children counted before it, once"
        );
    }
    Ok(())
}

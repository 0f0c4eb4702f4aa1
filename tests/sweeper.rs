//! The sweeper under a backlog, on the emulator: it pages through the due index, stops in time before
//! its invocation's deadline with everything it claimed sent, pushes back items whose claim cannot
//! succeed instead of starving their shard, and finds entries in shards beyond a lowered count.
//!
//! Time here is a clock that advances a fixed step on every reading: how far a sweep gets before its
//! deadline depends on how much it does, never on how fast the machine is.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use stepline::adapters::dynamodb::due_shard;
use stepline::config::CoordinatorConfig;
use stepline::domain::Timestamp;
use stepline::handlers;
use stepline::ports::{Clock, SystemClock};
use stepline::{ClaimReport, Coordinator, SubmitRequest};
use stepline_local::functions;
use stepline_local::runner::scheduled_event;
use stepline_suite::{on_emulator, TestStack};
use uuid::Uuid;

/// Ten minutes ahead of the wall clock (every step deadline has passed), moving `step_ms` per reading.
struct TickingClock {
    now: AtomicI64,
    step_ms: i64,
}

impl TickingClock {
    fn new(step_ms: i64) -> Arc<Self> {
        Arc::new(Self {
            now: AtomicI64::new(SystemClock.now().millis() + 600_000),
            step_ms,
        })
    }

    fn peek(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }
}

impl Clock for TickingClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.now.fetch_add(self.step_ms, Ordering::SeqCst) + self.step_ms)
    }
    fn token(&self) -> Uuid {
        SystemClock.token()
    }
    fn jitter(&self) -> f64 {
        SystemClock.jitter()
    }
}

/// The claim function's coordinator with its configuration reshaped by `tune`.
fn claim_coordinator(
    stack: &TestStack,
    clock: Arc<TickingClock>,
    tune: impl FnOnce(&mut CoordinatorConfig),
) -> anyhow::Result<Coordinator> {
    let mut config = CoordinatorConfig::from_lookup(stack.local.stack.env_of(functions::CLAIM)?)?;
    tune(&mut config);
    Ok(stepline::aws::coordinator_on(
        &stack.local.clients,
        &config,
        clock,
    ))
}

async fn leased(stack: &TestStack, ids: &[Uuid]) -> anyhow::Result<usize> {
    let mut count = 0;
    for id in ids {
        if stack.api.get(*id).await?.generation > 0 {
            count += 1;
        }
    }
    Ok(count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_recovered_page_by_page_each_sweep_stopping_before_its_deadline(
) -> anyhow::Result<()> {
    const BACKLOG: usize = 240;
    // The workers are down: every first step timed out.
    let stack = on_emulator!(TestStack::new("sweep-backlog", |_| {}).await?);
    let ids = stack.submit_orders(BACKLOG).await?;
    assert_eq!(stack.take_all("OrderRequestQueue").await?.len(), BACKLOG);

    let clock = TickingClock::new(20);
    let claim = claim_coordinator(&stack, clock.clone(), |c| c.claim_limit = 20)?;
    let mut sweeps: Vec<ClaimReport> = Vec::new();
    let mut launched = 0;
    while launched < BACKLOG {
        anyhow::ensure!(sweeps.len() < 30, "not recovered: {sweeps:?}");
        // A budget far smaller than the backlog needs: several sweeps must share the work.
        let deadline = clock.peek() + 4_000;
        let report = handlers::claim_within(
            &claim,
            scheduled_event(),
            Some(Timestamp::from_millis(deadline)),
        )
        .await?;
        assert!(
            clock.peek() < deadline,
            "sweep {} ran past its deadline: {report:?}",
            sweeps.len()
        );
        // Everything claimed was sent before the sweep returned.
        launched += stack.take_all("LaunchQueue").await?.len();
        assert_eq!(launched, leased(&stack, &ids).await?, "{report:?}");
        sweeps.push(report);
    }
    assert!(
        sweeps[0].stopped_early && sweeps[0].claimed < BACKLOG,
        "the budget cut the first sweep short: {:?}",
        sweeps[0]
    );
    assert!(sweeps.iter().any(|r| r.pages > 1), "paginated: {sweeps:?}");
    let claimed: usize = sweeps.iter().map(|r| r.claimed).sum();
    assert_eq!(claimed, BACKLOG, "each execution claimed once: {sweeps:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_items_are_pushed_back_and_the_rest_of_their_shard_is_still_claimed(
) -> anyhow::Result<()> {
    const POISON: usize = 100;
    let stack = on_emulator!(TestStack::new("sweep-poison", |_| {}).await?);
    let clock = TickingClock::new(1);
    let claim = claim_coordinator(&stack, clock.clone(), |c| c.claim_limit = 25)?;
    let shards = claim.store().shards();
    // Good executions that share shard 0 with the poison.
    let good: Vec<Uuid> = stack
        .submit_orders(40)
        .await?
        .into_iter()
        .filter(|id| due_shard(*id, shards) == 0)
        .collect();
    assert!(!good.is_empty());
    // Items no claim can decode, due long before anything else in shard 0.
    let mut poison = Vec::new();
    for _ in 0..POISON {
        poison.push(stack.local.put_undecodable_due_item(0, shards).await?);
    }

    let first = handlers::claim(&claim, scheduled_event()).await?;
    assert_eq!(first.deferred, POISON, "{first:?}");
    assert_eq!(
        leased(&stack, &good).await?,
        good.len(),
        "the good executions behind the poison were claimed: {first:?}"
    );
    for id in &poison {
        let item = stack
            .local
            .execution_item(*id)
            .await?
            .expect("the item stays");
        let due: i64 = item["dueAt"].as_n().unwrap().parse()?;
        assert!(due > clock.peek(), "pushed back");
        assert_eq!(item["claimFailures"].as_n().unwrap(), "1");
    }
    // The next sweep does not meet them again until their delay is over.
    let second = handlers::claim(&claim, scheduled_event()).await?;
    assert_eq!((second.failed, second.deferred), (0, 0), "{second:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_in_shards_beyond_a_lowered_count_are_still_claimed() -> anyhow::Result<()> {
    let stack = on_emulator!(TestStack::new("sweep-shards", |_| {}).await?);
    // Submitted while the index had 16 shards.
    let mut wide = CoordinatorConfig::from_lookup(stack.local.stack.env_of(functions::REDRIVE)?)?;
    wide.due_shards = 16;
    let before = stepline::aws::coordinator_on(&stack.local.clients, &wide, Arc::new(SystemClock));
    let mut ids = Vec::new();
    for n in 0..24 {
        ids.push(
            before
                .submit(SubmitRequest {
                    pipeline_id: order_worker::PIPELINE_ID.into(),
                    tenant: "acme".into(),
                    input: order_worker::sample_order(n),
                    ..Default::default()
                })
                .await?
                .execution,
        );
    }
    let stranded = ids.iter().filter(|id| due_shard(**id, 16) >= 2).count();
    assert!(stranded > 0);

    // Then the count was lowered to 2.
    let claim = claim_coordinator(&stack, TickingClock::new(1), |c| c.due_shards = 2)?;
    let report = handlers::claim(&claim, scheduled_event()).await?;

    assert_eq!(report.stray, stranded, "{report:?}");
    assert_eq!(leased(&stack, &ids).await?, ids.len(), "{report:?}");
    Ok(())
}

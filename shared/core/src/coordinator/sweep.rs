//! The sweeper: one pass over the due-time index claims what is due, page by page, shard by shard.

use std::time::Duration;

use serde::Serialize;
use uuid::Uuid;

use super::{Coordinator, CoordinatorError, Decided, Outbox, Read, Role};
use crate::domain::{Event, Timestamp};
use crate::metrics::{emit, Metric};
use crate::ports::{Backoff, DueQuery};

impl Coordinator {
    /// One sweep of the due index. Shards are swept from a random one on, page by page (following
    /// `LastEvaluatedKey`), claiming each page's executions a few at a time and sending their launch
    /// work before the next page: a sweep cut short (a failing Query, the invocation's `deadline`,
    /// epoch milliseconds) leaves everything it claimed sent, and the next sweep starts elsewhere, so
    /// every shard gets its turn under any backlog. An execution whose claim cannot succeed is pushed
    /// back in the index with a growing delay instead of holding the head of its shard. A window of
    /// the shards beyond the configured count is swept too, so entries written before the count was
    /// lowered are found and moved (any write puts an entry in its current shard).
    pub async fn claim_due(
        &self,
        deadline: Option<Timestamp>,
    ) -> Result<ClaimReport, CoordinatorError> {
        // No sealing keys: what a claim decides (launch work, dead letters, a child's end, lifecycle
        // events) is neither sealed nor signed.
        let now = self.clock.now();
        let shards = self.store.shards().max(1);
        let first = ((self.clock.jitter() * f64::from(shards)) as u32).min(shards - 1);
        let order = (0..shards)
            .map(|k| (first + k) % shards)
            .chain(stray_shards(shards, now));
        let mut report = ClaimReport::default();
        // The longest page so far: a page is not started unless twice that much time is left.
        let mut longest_page = Duration::ZERO;
        'shards: for shard in order {
            let mut after = None;
            loop {
                let started = self.clock.now();
                let needed = SWEEP_MARGIN.max(2 * longest_page);
                if deadline.is_some_and(|d| started + needed >= d) {
                    report.stopped_early = true;
                    break 'shards;
                }
                let query = DueQuery {
                    shard,
                    now,
                    limit: self.settings.claim_limit,
                    after,
                };
                let page = match self.store.due(query).await {
                    Ok(page) => page,
                    Err(e) => {
                        report.failed_queries += 1;
                        tracing::warn!(shard, error = %e, "due-index query failed; the next sweep retries");
                        continue 'shards;
                    }
                };
                report.pages += 1;
                report.due += page.ids.len();
                if shard >= shards {
                    report.stray += page.ids.len();
                }
                self.claim_page(&page.ids, now, &mut report).await;
                longest_page = longest_page.max(self.clock.now().since(started));
                match page.next {
                    Some(cursor) => after = Some(cursor),
                    None => break,
                }
            }
        }
        if report.deferred > 0 {
            emit(Metric::ClaimsDeferred, report.deferred as f64, "", now);
        }
        Ok(report)
    }

    /// Claims one page of due executions (bounded concurrency) and sends what the claims staged.
    async fn claim_page(&self, ids: &[Uuid], now: Timestamp, report: &mut ClaimReport) {
        use futures_util::stream::{self, StreamExt};
        let results: Vec<(Uuid, Result<Decided, CoordinatorError>)> =
            stream::iter(ids.iter().copied())
                .map(|id| async move {
                    (
                        id,
                        self.commit_event(id, &Event::Claim, Role::Claim, Read::Fresh)
                            .await,
                    )
                })
                .buffer_unordered(CLAIM_CONCURRENCY)
                .collect()
                .await;
        // No keys: a claim seals and signs nothing (see `claim_due`).
        let mut outbox = Outbox::default();
        for (id, result) in results {
            match result {
                // Committed with nothing to send: no lease taken. An execution found before it was due
                // (its entry kept early) whose entry moved, or an outbox given up.
                Ok(Decided::Committed {
                    record, actions, ..
                }) if actions.is_empty() => {
                    report.moved += 1;
                    tracing::info!(execution_id = %id, due_at = ?record.index_due(), "no lease taken: the due-index entry moved");
                }
                Ok(Decided::Committed {
                    record,
                    actions,
                    definition,
                }) => {
                    report.claimed += 1;
                    tracing::info!(execution_id = %id, generation = record.generation, "lease taken");
                    self.stage(&mut outbox, &record, &definition, &actions, 0);
                }
                Ok(Decided::Unchanged { .. }) => report.skipped += 1,
                Err(e) => {
                    report.failed += 1;
                    tracing::warn!(execution_id = %id, code = %e.code(), error = %e, "claim failed");
                    // A transient failure is retried by the next sweep where it stands; one that
                    // will fail again (corrupt item, unknown release, ...) makes way for the rest.
                    if !e.is_retryable() {
                        match self.store.defer(id, now, CLAIM_BACKOFF).await {
                            Ok(Some(until)) => {
                                report.deferred += 1;
                                tracing::error!(execution_id = %id, code = %e.code(), until = until.millis(), "claim keeps failing: pushed back in the due index");
                            }
                            Ok(None) => {}
                            Err(e) => {
                                tracing::warn!(execution_id = %id, error = %e, "claim failure not deferred")
                            }
                        }
                    }
                }
            }
        }
        self.flush(outbox).await;
    }
}

/// Claims of one page made at once: enough to hide the store's latency, few enough to stay far from
/// a partition's write limit and the function's memory.
const CLAIM_CONCURRENCY: usize = 16;
/// A sweep starts no page with less than this (or twice its longest page so far) left before its
/// invocation's deadline: every page it starts is claimed and sent in time.
const SWEEP_MARGIN: Duration = Duration::from_millis(1_500);
/// Failing claims are pushed back 30 s, doubling per failure, up to an hour.
const CLAIM_BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(30),
    max: Duration::from_secs(3_600),
};
/// The largest shard count the template allows: entries may sit in any shard below it.
pub const MAX_DUE_SHARDS: u32 = 1024;
/// Shards beyond the configured count swept per sweep: the ones just above it (where a lowered count
/// leaves its entries), and as many more rotating through the rest.
const STRAY_SHARDS_PER_SWEEP: u32 = 16;

/// The shards at or above `shards` this sweep visits: the `STRAY_SHARDS_PER_SWEEP` just above, every
/// sweep, and a window of as many beyond those that moves on every minute, so the whole range up to
/// `MAX_DUE_SHARDS` is covered within `MAX_DUE_SHARDS / STRAY_SHARDS_PER_SWEEP` minutes. An empty
/// Query costs half a read unit.
fn stray_shards(shards: u32, now: Timestamp) -> impl Iterator<Item = u32> {
    let near_end = shards
        .saturating_add(STRAY_SHARDS_PER_SWEEP)
        .min(MAX_DUE_SHARDS);
    let far = MAX_DUE_SHARDS.saturating_sub(near_end);
    let window = STRAY_SHARDS_PER_SWEEP.min(far);
    let offset = if far == 0 {
        0
    } else {
        ((now.millis() / 60_000) as u64 * u64::from(window) % u64::from(far)) as u32
    };
    (shards..near_end).chain((0..window).map(move |k| near_end + (offset + k) % far))
}

#[cfg(test)]
mod stray_tests {
    use super::*;

    #[test]
    fn stray_shards_cover_the_whole_range_above_the_count() {
        for shards in [1, 4, 16, 1000] {
            let mut seen = std::collections::BTreeSet::new();
            for minute in 0..(i64::from(MAX_DUE_SHARDS) / i64::from(STRAY_SHARDS_PER_SWEEP) + 1) {
                let visited: Vec<u32> =
                    stray_shards(shards, Timestamp::from_millis(minute * 60_000)).collect();
                assert!(visited.iter().all(|s| *s >= shards && *s < MAX_DUE_SHARDS));
                assert!(visited.len() <= 2 * STRAY_SHARDS_PER_SWEEP as usize);
                seen.extend(visited);
            }
            assert_eq!(
                seen.len() as u32,
                MAX_DUE_SHARDS - shards,
                "shards {shards}"
            );
        }
        assert_eq!(stray_shards(MAX_DUE_SHARDS, Timestamp::EPOCH).count(), 0);
    }
}

/// What a claim run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClaimReport {
    pub due: usize,
    pub claimed: usize,
    /// Executions written without taking a lease: found before they were due (entries kept early),
    /// their entries moved to when they are due (or an outbox given up).
    pub moved: usize,
    pub skipped: usize,
    pub failed: usize,
    /// Failed claims pushed back in the due index.
    pub deferred: usize,
    /// Due entries found in shards beyond the configured count.
    pub stray: usize,
    /// Pages of the due index read.
    pub pages: usize,
    pub failed_queries: usize,
    /// The sweep stopped before its invocation's deadline with shards left.
    pub stopped_early: bool,
}

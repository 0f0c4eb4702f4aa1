//! A fan-out child's end: checked against its parent (read, never written), counted in the fan-out
//! ledger, and, when that count settles the step, the parent resumed with one `FanOutSettled`. The
//! parent's item is written a constant number of times whatever the number of children: launched,
//! children started, settled (see `domain::fan_out`).

use std::sync::Arc;

use serde_json::Value;
use uuid::Uuid;

use super::items::{ItemReader, ItemSource, ItemsError};
use super::{Coordinator, CoordinatorError, Outbox, Read, Role};
use crate::claims::ClaimError;
use crate::claims::PAYLOAD_PREFIX;
use crate::domain::fan_out::{block_len, block_of, BLOCK};
use crate::domain::seal::SealKeys;
use crate::domain::{
    self, ChildEnd, Counted, Decision, Event, Execution, FanOutUnit, Skip, Status, StepDef,
    UnitProgress,
};
use crate::envelope::ChildEnded;
use crate::ports::{FanOutLedger, HeadChange, ItemOutcome, OutMessage, StoreError};

/// Child ends read from the ledger per request batch when a fan-out settles.
const ENDS_PAGE: u32 = 1000;

/// Counts a child's end (of its record's version `version`) in fan-out `unit` of `items` children:
/// its end kept, its outcome set in its block, and the block's completion, the child's failure, or
/// its recovery from an earlier failure (a re-driven child) written to the head. Each write is
/// idempotent, and each child has one outcome: an end older than the one counted changes nothing. A
/// crash between the writes is recovered by counting the same end again.
pub async fn count_child(
    ledger: &dyn FanOutLedger,
    unit: Uuid,
    items: u32,
    end: &ChildEnd,
    version: u64,
) -> Result<Counted, StoreError> {
    if !ledger.keep(unit, end, version).await? {
        return Ok(Counted::default());
    }
    let succeeded = end.succeeded();
    let block = block_of(end.item);
    let outcome = ItemOutcome {
        item: end.item,
        succeeded,
        version,
    };
    let Some(after) = ledger.set_outcome(unit, outcome).await? else {
        return Ok(Counted::default());
    };
    let block_done = after.counted >= block_len(block, items);
    let recovered = succeeded && after.was_failed;
    if succeeded && !block_done && !recovered {
        return Ok(Counted::default());
    }
    let change = HeadChange {
        block: block_done.then_some(block),
        failed: (!succeeded).then_some(end.item),
        recovered: recovered.then_some(end.item),
    };
    let (blocks, failed) = ledger.add_to_head(unit, change).await?;
    Ok(Counted {
        complete: blocks >= items.div_ceil(domain::fan_out::BLOCK),
        failed: Some(failed),
    })
}

impl Coordinator {
    /// Where fan-out children are counted.
    pub fn with_ledger(mut self, ledger: Arc<dyn FanOutLedger>) -> Self {
        self.ledger = Some(ledger);
        self
    }

    fn ledger(&self) -> Result<&dyn FanOutLedger, CoordinatorError> {
        self.ledger.as_deref().ok_or_else(|| {
            CoordinatorError::Invalid("this coordinator has no fan-out ledger".into())
        })
    }

    /// A child's end: counted in its parent's fan-out if its token is the parent's for that child and
    /// the attempt it answers still waits; the parent settled if that count settles it. `Ok(Some)`:
    /// why nothing was counted.
    pub(super) async fn child_ended(
        &self,
        outbox: &mut Outbox,
        source: usize,
        notice: &ChildEnded,
    ) -> Result<Option<Skip>, CoordinatorError> {
        let ledger = self.ledger()?;
        let parent = self.get(notice.parent).await?;
        let place = (notice.unit, notice.step, notice.end.item);
        let fan_out = match domain::child_notice(&parent, place, &notice.token) {
            Ok(fan_out) => fan_out,
            Err(Decision::Skip(skip)) => return Ok(Some(skip)),
            Err(Decision::Reject(rejection)) => return Err(rejection.into()),
            Err(Decision::Commit { .. }) => unreachable!("a notice check never commits"),
        };
        let counted = count_child(
            ledger,
            notice.unit,
            fan_out.items,
            &notice.end,
            notice.version,
        )
        .await?;
        tracing::info!(execution_id = %parent.id, child = %notice.end.execution_id, item = notice.end.item, status = %notice.end.status, ?counted, "fan-out child counted");
        if fan_out.settles(&counted) {
            self.settle_fan_out(outbox, source, &parent, notice.unit, fan_out)
                .await?;
        } else if let Some(next) = fan_out.next_after(notice.end.item) {
            // Within a window, this child's end starts the next (again on a redelivered notice:
            // the start is idempotent).
            let keys = outbox.keys.clone();
            self.start_next(keys.as_deref(), &parent, notice.unit, next)
                .await?;
        }
        Ok(None)
    }

    /// Resumes `parent` from fan-out `unit`: the tally read back, and, when every child succeeded or
    /// failed within tolerance, every child's end in item order (claim-checked when large).
    async fn settle_fan_out(
        &self,
        outbox: &mut Outbox,
        source: usize,
        parent: &Execution,
        unit: Uuid,
        fan_out: FanOutUnit,
    ) -> Result<(), CoordinatorError> {
        let ledger = self.ledger()?;
        let tally = ledger.tally(unit, fan_out.items).await?;
        if !fan_out.settled_by(&tally) {
            return Ok(());
        }
        let mut results = Vec::new();
        if tally.failed <= fan_out.tolerated {
            results.reserve(fan_out.items as usize);
            for from in (0..fan_out.items).step_by(ENDS_PAGE as usize) {
                let to = (from + ENDS_PAGE).min(fan_out.items);
                for end in ledger.ends(unit, from..to).await? {
                    results.push(serde_json::to_value(end).unwrap_or(Value::Null));
                }
            }
        }
        let results = self.claim_checked(parent.id, Value::Array(results)).await?;
        let event = Event::FanOutSettled {
            unit,
            tally,
            results,
        };
        let applied = self
            .decide_into(
                outbox,
                source,
                parent.id,
                &event,
                Role::FanOut,
                (false, false),
            )
            .await?;
        tracing::info!(execution_id = %parent.id, succeeded = tally.succeeded, failed = tally.failed, skipped = ?applied.skipped, "fan-out settled");
        Ok(())
    }

    /// Starts the children of a fan-out whose items are held in an object: the items counted and the
    /// unit sized (`FanOutSized`, unless it was), then read again page by page, each page's children
    /// started with one batch of sends, then the unit's starts marked sent. Run again from the start
    /// after a crash (by the sweeper: the starts are not marked sent), it starts no child twice.
    pub(super) async fn start_from_object(
        &self,
        keys: Option<Arc<SealKeys>>,
        record: &Execution,
        step: &StepDef,
    ) -> Result<(), CoordinatorError> {
        let Some(unit) = record.await_unit.as_ref() else {
            return Ok(());
        };
        let unit_id = unit.id;
        let Some(start_queue) = self.settings.queues.start.clone() else {
            return Err(CoordinatorError::Invalid(
                "no start queue to start children on".into(),
            ));
        };
        let input = record.step_input(record.step).cloned().unwrap_or_default();
        let read = match (&self.claims, ItemSource::of(&input)) {
            (_, Ok(None)) => return Ok(()),
            (Some(claims), Ok(Some(source))) => Ok((claims, source)),
            (None, _) => Err(ItemsError::Claim(ClaimError::Unresolvable(
                "no payload bucket is configured to read a fan-out's items from".into(),
            ))),
            (_, Err(e)) => Err(e),
        };
        let mut current = record.clone();
        let items = match unit.fan_out {
            Some(fan_out) => fan_out.items,
            None => {
                let counted = match &read {
                    Ok((claims, source)) => ItemReader::new(claims, source.clone()).count().await,
                    Err(e) => Err(e.clone()),
                };
                let items = match counted {
                    Err(e) if e.is_retryable() => return Err(items_error(e)),
                    other => other.map_err(|e| e.step_error()),
                };
                let sized = Event::FanOutSized {
                    unit: unit_id,
                    items,
                };
                let mut outbox = Outbox::sealing_with(keys.clone());
                let applied = self
                    .decide_into(
                        &mut outbox,
                        0,
                        record.id,
                        &sized,
                        Role::FanOut,
                        (false, false),
                    )
                    .await?;
                Box::pin(self.flush(outbox)).await;
                current = applied.record;
                let still = current
                    .await_unit
                    .as_ref()
                    .filter(|u| u.id == unit_id && !u.resolved)
                    .filter(|_| current.status == Status::WaitingExternal)
                    .and_then(|u| u.fan_out);
                match still {
                    Some(fan_out) => fan_out.items,
                    // No items, unreadable ones (the step failed), or the execution moved on.
                    None => return Ok(()),
                }
            }
        };
        let (claims, source) = read.map_err(items_error)?;
        let fan_out = current
            .await_unit
            .as_ref()
            .and_then(|u| u.fan_out)
            .unwrap_or_else(|| FanOutUnit::of(Some(step), items));
        let wave = fan_out.first_wave();
        let mut reader = ItemReader::new(claims, source);
        let mut item = 0u32;
        // With a window, every item is kept in blocks the later starts read (`start_next`), all
        // written before the first child starts; the first wave is started after.
        let mut block = Vec::new();
        let mut first_wave = Vec::new();
        while item < items {
            let Some(page) = reader.next_page().await.map_err(items_error)? else {
                break;
            };
            let mut messages: Vec<OutMessage> = Vec::with_capacity(page.len());
            for input in page.into_iter().take((items - item) as usize) {
                if fan_out.window.is_some() {
                    block.extend(serde_json::to_vec(&input).unwrap_or_default());
                    block.push(b'\n');
                }
                if item < wave {
                    messages.push(self.child_start(
                        keys.as_deref(),
                        &current,
                        step,
                        unit_id,
                        item,
                        input,
                    )?);
                }
                item += 1;
                if fan_out.window.is_some() && (item.is_multiple_of(BLOCK) || item == items) {
                    let key = block_key(record.id, unit_id, (item - 1) / BLOCK);
                    claims.put_named(&key, std::mem::take(&mut block)).await?;
                }
            }
            if fan_out.window.is_some() {
                first_wave.extend(messages);
            } else {
                self.send_starts(&start_queue, &messages).await?;
            }
        }
        self.send_starts(&start_queue, &first_wave).await?;
        if item < items {
            tracing::error!(execution_id = %record.id, counted = items, read = item, "the items' object holds fewer items than were counted: it changed");
        }
        tracing::info!(execution_id = %record.id, step = %step.id, children = item, "fan-out started from an object");
        self.commit_event(
            record.id,
            &Event::AwaitNoticeSent { unit: unit_id },
            Role::Outbox,
            Read::Fresh,
        )
        .await?;
        Ok(())
    }

    /// Starts child `next` of fan-out `unit` of `parent` (a window's next child): its item read from
    /// the parent's input, or from the block object the unit's start wrote.
    async fn start_next(
        &self,
        keys: Option<&SealKeys>,
        parent: &Execution,
        unit: Uuid,
        next: u32,
    ) -> Result<(), CoordinatorError> {
        let definition = self
            .definition(&parent.pipeline_id, &parent.release_version)
            .await?;
        let Some(step) = definition.step(parent.step) else {
            return Ok(());
        };
        let Some(start_queue) = self.settings.queues.start.clone() else {
            return Err(CoordinatorError::Invalid(
                "no start queue to start children on".into(),
            ));
        };
        let input = parent.step_input(parent.step).cloned().unwrap_or_default();
        let item = match ItemSource::of(&input).map_err(items_error)? {
            None => input.value()["items"][next as usize].clone(),
            Some(_) => {
                let claims = self.claims.as_ref().ok_or_else(|| {
                    CoordinatorError::Payload(ClaimError::Unresolvable(
                        "no payload bucket is configured to read a fan-out's items from".into(),
                    ))
                })?;
                let key = block_key(parent.id, unit, next / BLOCK);
                let bytes = claims
                    .fetch_range(claims.bucket(), &key, 0, u64::from(u32::MAX))
                    .await?;
                let line = bytes
                    .split(|b| *b == b'\n')
                    .nth((next % BLOCK) as usize)
                    .unwrap_or_default();
                serde_json::from_slice(line)
                    .map_err(|e| CoordinatorError::Invalid(format!("item {next} in {key}: {e}")))?
            }
        };
        let message = self.child_start(keys, parent, step, unit, next, item)?;
        self.send_starts(&start_queue, &[message]).await
    }

    async fn send_starts(
        &self,
        start_queue: &str,
        messages: &[OutMessage],
    ) -> Result<(), CoordinatorError> {
        for result in self.sender.send(start_queue, messages).await {
            result.map_err(|e| StoreError::Unavailable(e.to_string()))?;
        }
        Ok(())
    }

    /// How far an execution's await unit is (a fan-out's from its ledger); `None` when it waits on
    /// nothing.
    pub async fn unit_progress(
        &self,
        record: &Execution,
    ) -> Result<Option<UnitProgress>, CoordinatorError> {
        let Some(unit) = record.await_unit.as_ref() else {
            return Ok(None);
        };
        Ok(Some(match unit.fan_out {
            Some(fan_out) => {
                let tally = self.ledger()?.tally(unit.id, fan_out.items).await?;
                unit.fan_out_progress(&tally)
            }
            None => unit.progress(),
        }))
    }
}

fn items_error(e: ItemsError) -> CoordinatorError {
    match e {
        ItemsError::Claim(e) => CoordinatorError::Payload(e),
        ItemsError::Invalid(message) => CoordinatorError::Invalid(message),
    }
}

/// The object holding block `block` of the items of fan-out `unit` of `execution` (JSON lines), for a
/// window's later starts.
fn block_key(execution: Uuid, unit: Uuid, block: u32) -> String {
    format!("{PAYLOAD_PREFIX}{execution}/{unit}/items-{block}.jsonl")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::memory::InMemoryFanOutLedger;

    fn end(item: u32, status: Status) -> ChildEnd {
        ChildEnd {
            item,
            execution_id: Uuid::from_u128(u128::from(item) + 1),
            status,
            result: None,
            error: None,
        }
    }

    /// Counts item `item`'s end with `status` (of its version `version`) in the unit of `items`.
    async fn count(
        ledger: &InMemoryFanOutLedger,
        items: u32,
        item: u32,
        status: Status,
        version: u64,
    ) -> Counted {
        let unit = Uuid::from_u128(9);
        count_child(ledger, unit, items, &end(item, status), version)
            .await
            .unwrap()
    }

    async fn tally(ledger: &InMemoryFanOutLedger, unit: Uuid, items: u32) -> (u32, u32) {
        let t = ledger.tally(unit, items).await.unwrap();
        (t.succeeded, t.failed)
    }

    #[tokio::test]
    async fn a_child_reported_both_ways_is_counted_once_and_does_not_complete_its_parent() {
        let (ledger, unit) = (InMemoryFanOutLedger::default(), Uuid::from_u128(9));
        let first = count(&ledger, 2, 0, Status::Succeeded, 3).await;
        let second = count(&ledger, 2, 0, Status::Failed, 3).await;
        assert!(!first.complete && !second.complete, "item 1 never ended");
        assert_eq!(
            tally(&ledger, unit, 2).await,
            (0, 1),
            "one outcome, the last"
        );
    }

    #[tokio::test]
    async fn a_re_driven_child_replaces_its_failure_and_an_older_end_changes_nothing() {
        let (ledger, unit) = (InMemoryFanOutLedger::default(), Uuid::from_u128(9));
        let failed = count(&ledger, 2, 0, Status::Failed, 4).await;
        assert_eq!(failed.failed, Some(1));
        // The re-driven child succeeds at a later version: its failure is taken back.
        let recovered = count(&ledger, 2, 0, Status::Succeeded, 7).await;
        assert_eq!(recovered.failed, Some(0));
        assert!(!recovered.complete);
        // The first end, delivered again late, is stale.
        let stale = count(&ledger, 2, 0, Status::Failed, 4).await;
        assert_eq!(stale, Counted::default());
        assert_eq!(tally(&ledger, unit, 2).await, (1, 0));
        let kept = ledger.ends(unit, 0..1).await.unwrap();
        assert_eq!(kept[0].as_ref().map(|e| e.status), Some(Status::Succeeded));
        // The other child completes the unit, counted once each.
        let last = count(&ledger, 2, 1, Status::Succeeded, 2).await;
        assert!(last.complete);
        assert_eq!(last.failed, Some(0));
    }

    #[tokio::test]
    async fn counting_the_same_end_again_after_a_crash_changes_nothing() {
        let (ledger, unit) = (InMemoryFanOutLedger::default(), Uuid::from_u128(9));
        for _ in 0..3 {
            count(&ledger, 1, 0, Status::Failed, 5).await;
        }
        assert_eq!(tally(&ledger, unit, 1).await, (0, 1));
        let (_, failed) = ledger
            .add_to_head(unit, HeadChange::default())
            .await
            .unwrap();
        assert_eq!(failed, 1);
    }
}

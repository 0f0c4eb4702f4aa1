//! A fan-out's children are counted outside the parent's record, so the parent stays the same size
//! and is written a constant number of times however many children it has.
//!
//! The parent's await unit holds only how many children there are and how many may fail
//! (`FanOutUnit`). Each child's end is kept in the fan-out ledger (`ports::FanOutLedger`): its end
//! (`execution::ChildEnd`) under its own key, its item number added to the set of its block of `BLOCK` items
//! (succeeded or failed), and, when that completes the block or the child failed, the block or the
//! failure added to the unit's head. Adding to a set is idempotent, so a child recorded twice (a
//! redelivered notice, a crash between two of the writes and a retry) is counted once. The write
//! that completes the last block sees every block complete (`Counted::complete`); a failure sees
//! how many children have failed. Either may settle the parent (`settles`): the coordinator then
//! reads the tally and the ends and applies one `FanOutSettled` to the parent, a conditional write
//! that only the first of racing settlers wins.
//!
//! With a window (`maxConcurrency`), the first `window` children start with the step and the end of
//! child i starts child i + window: each child is started once (starts are idempotent), and at most
//! `window` run at once.

use serde::{Deserialize, Serialize};

use super::pipeline::StepDef;

/// Children per block of the ledger: a block's sets stay small (each write of one is billed by its
/// size), and a unit of N children has N / `BLOCK` blocks for its head to track.
pub const BLOCK: u32 = 256;

/// A fan-out's await unit: its children (one per item) and how many may fail without failing the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FanOutUnit {
    pub items: u32,
    pub tolerated: u32,
    /// At most this many children run at once: the first ones start together, then the end of
    /// child i starts child i + window (none: all start at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
}

impl FanOutUnit {
    /// The unit of `items` children of fan-out step `step`.
    pub fn of(step: Option<&StepDef>, items: u32) -> Self {
        Self {
            items,
            tolerated: step.map_or(0, |s| s.tolerated(items)),
            window: step
                .and_then(|s| s.max_concurrency)
                .filter(|window| *window < items),
        }
    }

    /// How many children start with the unit (the rest as others end).
    pub fn first_wave(&self) -> u32 {
        self.window.unwrap_or(self.items).min(self.items)
    }

    /// The child the end of child `item` starts, if any.
    pub fn next_after(&self, item: u32) -> Option<u32> {
        let next = item.checked_add(self.window?)?;
        (next < self.items).then_some(next)
    }

    /// Blocks of the ledger the unit's children are counted in.
    pub fn blocks(&self) -> u32 {
        self.items.div_ceil(BLOCK)
    }

    /// Whether what a count learned settles the step: every child counted, or more failed than tolerated.
    pub fn settles(&self, counted: &Counted) -> bool {
        counted.complete || counted.failed.is_some_and(|f| f > self.tolerated)
    }

    /// Whether a tally settles the step.
    pub fn settled_by(&self, tally: &Tally) -> bool {
        tally.counted() >= self.items || tally.failed > self.tolerated
    }
}

/// The block an item is counted in.
pub fn block_of(item: u32) -> u32 {
    item / BLOCK
}

/// How many items block `block` of a unit of `items` holds.
pub fn block_len(block: u32, items: u32) -> u32 {
    items.saturating_sub(block.saturating_mul(BLOCK)).min(BLOCK)
}

/// What counting one child learned from the writes it made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted {
    /// Every block is complete: every child has been counted.
    pub complete: bool,
    /// The unit's failed children, when the count wrote the unit's head (the child failed or
    /// completed its block).
    pub failed: Option<u32>,
}

/// A unit's children counted so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tally {
    pub succeeded: u32,
    pub failed: u32,
}

impl Tally {
    pub fn counted(&self) -> u32 {
        self.succeeded + self.failed
    }
}

/// The item number of a fan-out interaction name (`item-<n>`).
pub fn item_number(interaction: &str) -> Option<u32> {
    interaction.strip_prefix("item-")?.parse().ok()
}

/// The interaction name of item `n`.
pub fn item_name(n: u32) -> String {
    format!("item-{n}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_every_item_once() {
        for items in [0, 1, 255, 256, 257, 1000, 100_000] {
            let unit = FanOutUnit::of(None, items);
            let held: u32 = (0..unit.blocks()).map(|b| block_len(b, items)).sum();
            assert_eq!(held, items);
            if items > 0 {
                assert_eq!(block_of(items - 1), unit.blocks() - 1);
            }
        }
    }

    #[test]
    fn a_unit_settles_when_all_are_counted_or_too_many_failed() {
        let unit = FanOutUnit {
            items: 10,
            tolerated: 2,
            window: None,
        };
        let failed = |n| Counted {
            complete: false,
            failed: Some(n),
        };
        assert!(!unit.settles(&Counted::default()));
        assert!(!unit.settles(&failed(2)));
        assert!(unit.settles(&failed(3)));
        assert!(unit.settles(&Counted {
            complete: true,
            failed: None
        }));
        let tally = |succeeded, failed| Tally { succeeded, failed };
        assert!(!unit.settled_by(&tally(7, 2)));
        assert!(unit.settled_by(&tally(8, 2)));
        assert!(unit.settled_by(&tally(0, 3)));
    }

    #[test]
    fn a_window_starts_the_next_child_as_each_ends() {
        let step = StepDef::fan_out("f", "c").max_concurrency(3);
        let unit = FanOutUnit::of(Some(&step), 10);
        assert_eq!((unit.first_wave(), unit.window), (3, Some(3)));
        assert_eq!(unit.next_after(0), Some(3));
        assert_eq!(unit.next_after(6), Some(9));
        assert_eq!(unit.next_after(7), None);
        // Each of the ten is started exactly once: the first wave, then one per end.
        let mut started: Vec<u32> = (0..unit.first_wave()).collect();
        started.extend((0..10).filter_map(|i| unit.next_after(i)));
        started.sort();
        assert_eq!(started, (0..10).collect::<Vec<_>>());
        // A window as wide as the items is no window.
        let all = FanOutUnit::of(Some(&step), 3);
        assert_eq!(
            (all.first_wave(), all.window, all.next_after(0)),
            (3, None, None)
        );
    }

    #[test]
    fn item_names_map_to_numbers() {
        assert_eq!(item_number(&item_name(42)), Some(42));
        assert_eq!(item_number("approval"), None);
        assert_eq!(item_number("item-x"), None);
    }
}

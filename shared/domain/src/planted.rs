//! Planted bugs: deliberate defects the fault campaign must catch, each switched on for one simulated
//! schedule at a time (a thread's own setting). Only the `testing` build has them: elsewhere the
//! module does not exist and [`planted!`](crate::planted!) is `false`, so no function binary names
//! a planted bug.

/// A deliberate defect, named by what it breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bug {
    /// Launch work is carried out without checking that its lease's token and generation are the
    /// record's (fencing ignored).
    LaunchIgnoresFencing,
    /// Every other reply is acknowledged without being applied: the simulation's event source hands
    /// the completion handler half of each batch.
    DropsReplies,
    /// A worker's message is accepted without checking its reply token.
    AcceptsUnauthenticatedReplies,
    /// The sweep reads the first page of each shard only (`LastEvaluatedKey` ignored).
    SweepIgnoresLastEvaluatedKey,
    /// A write whose response was lost, once recognised as its own, is treated as lost: what it
    /// committed is never sent.
    LostResponseDropsSend,
    /// Every seventh child's end is acknowledged without being counted in the fan-out ledger.
    DropsFanOutNotices,
    /// History entries leave the record without their journal chunk being written first.
    SkipsHistoryJournal,
    /// The sealed record travels in the clear and a seal is accepted without its authentication
    /// tag: whoever reads a request can read the record, and make one the completion decides on.
    AcceptsUnauthenticatedSeals,
    /// A message that did not authenticate is noted as an incident on the execution it names (a
    /// write that anyone who can name an execution can cause).
    UnauthenticatedMessagesWrite,
    /// The fan-out ledger adds a child's outcome beside an earlier one instead of replacing it: a
    /// child that ended twice (re-driven while its parent waits) is counted twice.
    LedgerCountsTwice,
}

impl Bug {
    pub const ALL: [Bug; 10] = [
        Bug::LaunchIgnoresFencing,
        Bug::DropsReplies,
        Bug::AcceptsUnauthenticatedReplies,
        Bug::SweepIgnoresLastEvaluatedKey,
        Bug::LostResponseDropsSend,
        Bug::DropsFanOutNotices,
        Bug::SkipsHistoryJournal,
        Bug::AcceptsUnauthenticatedSeals,
        Bug::UnauthenticatedMessagesWrite,
        Bug::LedgerCountsTwice,
    ];
}

mod switch {
    use super::Bug;
    use std::cell::Cell;

    thread_local! {
        static PLANTED: Cell<Option<Bug>> = const { Cell::new(None) };
    }

    pub fn active(bug: Bug) -> bool {
        PLANTED.with(|p| p.get() == Some(bug))
    }

    /// Plants `bug` (or none) in this thread until the guard is dropped.
    pub fn plant(bug: Option<Bug>) -> Guard {
        let before = PLANTED.with(|p| p.replace(bug));
        Guard(before)
    }

    pub struct Guard(Option<Bug>);

    impl Drop for Guard {
        fn drop(&mut self) {
            PLANTED.with(|p| p.set(self.0));
        }
    }
}

pub use switch::{plant, Guard};

/// Whether `bug` is planted in this thread.
pub fn active(bug: Bug) -> bool {
    switch::active(bug)
}

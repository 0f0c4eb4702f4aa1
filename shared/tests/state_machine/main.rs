//! Pure tests of the coordinator's state machine (`stepline::domain::machine`): every row of its
//! transition table (claims, launch work, replies and their retries, re-drives, cancellation,
//! heartbeats, dead letters, incidents, await units, fan-outs, the lifecycle outbox), every event
//! delivered twice, full happy paths, replies checked against their sender, and the commit invariants
//! (version +1 per commit, pinned release / pipeline / input, generation moving only with a new lease),
//! also over random event sequences. `coverage` checks that the table in machine/ is complete and
//! that each of its rows names tests that exist.
//!
//! No AWS, no emulator: records are built with `start` and advanced with `decide` under hand-made
//! contexts whose clock is advanced by hand (`common/machine.rs`).

#[path = "../common/machine.rs"]
mod fixtures;

mod awaits;
mod bounded;
mod cancel;
mod claim;
mod coverage;
mod dead_letters;
mod fan_out;
mod heartbeat;
mod incidents;
mod invariants;
mod launch_work;
mod outbox;
mod paths;
mod redelivery;
mod redrive;
mod reply;
mod start;
mod workers;

//! Stepline's pure domain: pipeline definitions, their contracts and releases, the execution record, the
//! state machine and the catalogue of stable codes. No AWS and no I/O here; nothing here imports from
//! the layers above.

pub mod codes;
pub mod contract;
pub mod crypto;
pub mod entries;
pub mod execution;
pub mod fan_out;
pub mod history;
pub mod ids;
pub mod machine;
pub mod payload;
pub mod pipeline;
pub mod pipeline_file;
#[cfg(feature = "testing")]
pub mod planted;
pub mod release;
pub mod seal;
pub mod status;
pub mod time;

/// Whether the planted bug `Bug::$bug` (see [`planted`]) is switched on in this thread: in the
/// `testing` build of the crate that says so, and `false` in any other build, which names no bug.
#[macro_export]
macro_rules! planted {
    ($bug:ident) => {{
        #[cfg(feature = "testing")]
        let on = $crate::planted::active($crate::planted::Bug::$bug);
        #[cfg(not(feature = "testing"))]
        let on = false;
        on
    }};
}

pub use codes::Code;
pub use execution::{
    AwaitUnit, ChildEnd, DeadLetterMark, Execution, Incident, Interaction, InteractionCompletion,
    Lease, LifecycleEvent, LifecycleKind, ParentLink, Receipt, RedriveNote, Status, StepError,
    StepProgress, StepStatus, UnitProgress, Verdict, MAX_EARLIER_RECEIPTS, MAX_INCIDENTS,
    MAX_INCIDENT_DETAIL, MAX_REDRIVE_NOTES,
};
pub use fan_out::{Counted, FanOutUnit, Tally};
pub use ids::{
    fan_out_child_id, fan_out_event_id, idempotent_id, launch_id, new_secret, reply_token,
    start_event_key,
};
pub use machine::{
    child_notice, creation_actions, decide, oversized_reply, reply_actions, start, start_launched,
    Action, Context, Decision, Event, EventKind, NewExecution, Outcome, Pin, Rejection, Sender,
    Skip, Transition, TRANSITIONS,
};
pub use payload::Payload;
pub use pipeline::{PipelineDef, Problem, RetryPolicy, StepDef, StepKind};
pub use time::Timestamp;

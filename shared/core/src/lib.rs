//! Stepline's coordinator, free of AWS: the narrow ports it needs ([`ports`]), the wire formats
//! ([`envelope`]), claim checks for large payloads ([`claims`]), configuration read from the
//! environment ([`config`]), and the [`coordinator`] itself (load, decide, commit conditionally, carry
//! out the actions: the one path of every decision), with in-memory implementations of the ports
//! ([`adapters`]) for tests and the simulation. Built on the pure domain ([`domain`], the
//! `stepline-domain` crate).

pub use stepline_domain as domain;
pub use stepline_domain::{contract, pipeline_file, planted, release, Code};

pub mod adapters {
    //! The ports implemented in memory, and the batch limits every SQS adapter shares.
    pub mod batches;
    pub mod memory;

    pub use memory::{
        InMemoryExecutionStore, InMemoryFanOutLedger, InMemoryPayloadStore,
        InMemoryReleaseRegistry, MemoryKeys, RecordingSender,
    };
}
pub mod cache;
pub mod claims;
pub mod config;
pub mod coordinator;
pub mod envelope;
pub mod metrics;
pub mod ports;

pub use coordinator::{
    Applied, ClaimReport, Coordinator, CoordinatorError, ExecutionSummary, HistoryView,
    ListRequest, ListResponse, Settings, SubmitRequest, Submitted,
};

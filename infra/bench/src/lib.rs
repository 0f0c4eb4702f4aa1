//! The benchmark program's parts (the binary is `stepline-bench`).

pub mod analysis;
pub mod coldstart;
pub mod fanout;
pub mod meter;
pub mod pricing;
pub mod recovery;
pub mod report;
pub mod scale;
pub mod workload;

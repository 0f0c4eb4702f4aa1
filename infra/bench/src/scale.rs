//! P5: the due-time index and the claim path at scale, simulated. Executions arrive with random ids and
//! land on due-index shards by the coordinator's own `due_shard`; each writes its index entry as often as
//! the emulator run measured. The hottest shard's write rate is compared with DynamoDB's 1,000 write
//! units per second per partition (a keys-only entry is one unit). The claim sweeper runs on its
//! schedule, taking up to `claim_limit` due executions per shard per run, one after another.

use serde::Serialize;
use stepline::adapters::dynamodb::due_shard;
use uuid::Uuid;

use crate::recovery::Schedule;

/// DynamoDB's write throughput per partition (write units per second).
pub const PARTITION_WCU_LIMIT: f64 = 1000.0;

#[derive(Debug, Clone, Copy)]
pub struct Model {
    /// Index entries written per execution over its life (measured on the emulator).
    pub index_writes_per_execution: f64,
    /// Share of executions that need the sweeper (a crashed handler, a lost message, a deadline).
    pub recovery_fraction: f64,
    /// Seconds between claim runs (the template's schedule).
    pub claim_period_s: f64,
    /// Due executions taken per shard and run (CLAIM_LIMIT).
    pub claim_limit: u64,
    /// Time one claim takes (a read, a conditional write, its share of a batched send), milliseconds.
    pub claim_ms: f64,
    /// The claim function's timeout, seconds: a run cannot claim longer than this.
    pub claim_timeout_s: f64,
    /// Simulated seconds of arrivals.
    pub seconds: u32,
}

impl Model {
    /// The deployed sweeper (the template's schedule and timeout, `CLAIM_LIMIT` 100, about 10 ms a
    /// claim), 1 % of executions needing it, and the index writes an execution was measured to make.
    pub fn deployed(schedule: Schedule, index_writes_per_execution: f64, seconds: u32) -> Self {
        Self {
            index_writes_per_execution,
            recovery_fraction: 0.01,
            claim_period_s: schedule.period_s,
            claim_limit: 100,
            claim_ms: 10.0,
            claim_timeout_s: schedule.timeout_ms as f64 / 1e3,
            seconds,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub executions_per_s: u64,
    pub shards: u32,
    /// Index write units per second on the busiest shard (one partition), at its busiest second.
    pub hottest_partition_wcu_per_s: f64,
    pub within_partition_limit: bool,
    /// Executions becoming due for the sweeper per second, and what the sweeper claims per second.
    pub due_per_s: f64,
    pub claims_per_s: f64,
    /// Whether the sweeper keeps up (its backlog does not grow).
    pub claim_keeps_up: bool,
}

pub const RATES: [u64; 3] = [1_000, 10_000, 100_000];
pub const SHARDS: [u32; 5] = [1, 4, 16, 64, 256];

/// Simulates one rate and shard count. `seed` makes the ids reproducible.
pub fn simulate(model: &Model, executions_per_s: u64, shards: u32, seed: u64) -> Row {
    let mut rng = fastrand_like(seed);
    let mut hottest = 0u64;
    let mut due_per_shard = vec![0f64; shards as usize];
    for _ in 0..model.seconds {
        let mut per_shard = vec![0u64; shards as usize];
        for _ in 0..executions_per_s {
            let id = Uuid::from_u128(rng());
            let shard = due_shard(id, shards) as usize;
            per_shard[shard] += 1;
            due_per_shard[shard] += model.recovery_fraction;
        }
        hottest = hottest.max(per_shard.iter().copied().max().unwrap_or(0));
    }
    let seconds = f64::from(model.seconds.max(1));
    let hottest_wcu = hottest as f64 * model.index_writes_per_execution;
    // One claim run: shards in turn, up to the limit each, bounded by the function's timeout.
    let budget = (model.claim_timeout_s * 1000.0 / model.claim_ms).floor();
    let per_run_due: f64 = due_per_shard
        .iter()
        .map(|d| (d / seconds * model.claim_period_s).min(model.claim_limit as f64))
        .sum();
    let claimed_per_run = per_run_due.min(budget);
    let due_per_s = executions_per_s as f64 * model.recovery_fraction;
    let claims_per_s = claimed_per_run / model.claim_period_s;
    Row {
        executions_per_s,
        shards,
        hottest_partition_wcu_per_s: hottest_wcu,
        within_partition_limit: hottest_wcu <= PARTITION_WCU_LIMIT,
        due_per_s,
        claims_per_s,
        claim_keeps_up: claims_per_s + 1e-9 >= due_per_s,
    }
}

pub fn table(model: &Model, rates: &[u64], shards: &[u32]) -> Vec<Row> {
    let mut rows = Vec::new();
    for (i, rate) in rates.iter().enumerate() {
        for (j, s) in shards.iter().enumerate() {
            rows.push(simulate(model, *rate, *s, (i * 31 + j) as u64 + 1));
        }
    }
    rows
}

/// A small deterministic generator of 128-bit ids (splitmix64, twice).
fn fastrand_like(seed: u64) -> impl FnMut() -> u128 {
    let mut state = seed;
    move || {
        let mut next = || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        (u128::from(next()) << 64) | u128::from(next())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> Model {
        let schedule = Schedule {
            period_s: 60.0,
            timeout_ms: 300_000,
        };
        Model::deployed(schedule, 2.0, 2)
    }

    #[test]
    fn more_shards_cool_the_hottest_partition() {
        let one = simulate(&model(), 10_000, 1, 1);
        let many = simulate(&model(), 10_000, 64, 1);
        // One shard takes every write.
        assert_eq!(one.hottest_partition_wcu_per_s, 20_000.0);
        assert!(!one.within_partition_limit);
        assert!(many.hottest_partition_wcu_per_s < 20_000.0 / 64.0 * 1.5);
        assert!(many.hottest_partition_wcu_per_s >= 20_000.0 / 64.0);
    }

    #[test]
    fn the_sweeper_is_bounded_by_its_limit_per_shard() {
        // 1,000 exec/s at 1 % is 10 due/s = 600 a minute: one shard takes 100 a run.
        let row = simulate(&model(), 1_000, 1, 1);
        assert!((row.claims_per_s - 100.0 / 60.0).abs() < 1e-9);
        assert!(!row.claim_keeps_up);
        let row = simulate(&model(), 1_000, 16, 1);
        assert!(row.claim_keeps_up, "{row:?}");
    }
}

//! How the CLI prints what it reads: listings, an execution's story and summary, what it waits on.

use super::*;

pub(crate) struct Output {
    pub(crate) json: bool,
}

impl Output {
    /// Prints `value` as JSON (`--json`), or `human`'s text.
    pub(crate) fn show(&self, value: &impl serde::Serialize, human: impl FnOnce() -> String) {
        if self.json {
            println!("{}", serde_json::to_value(value).unwrap_or_default());
        } else {
            println!("{}", human());
        }
    }
}

pub(crate) fn listing(page: &stepline::ListResponse) -> String {
    let mut lines: Vec<String> = page
        .executions
        .iter()
        .map(|e| {
            format!(
                "{}  {:<16} step {} attempt {}  tenant {}  release {}  created {}{}",
                e.execution_id,
                e.status.as_str(),
                e.step + 1,
                e.attempt,
                e.tenant,
                e.release_version,
                e.created_at.utc(),
                e.error_code
                    .as_ref()
                    .map(|c| format!("  {c}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    if lines.is_empty() {
        lines.push("no executions".into());
    }
    if let Some(next) = &page.next {
        lines.push(format!("more: --after {next}"));
    }
    lines.join("\n")
}

pub(crate) fn story(history: &stepline::HistoryView) -> String {
    let e = &history.execution;
    let name = |k: u32| match history.steps.get(k as usize) {
        Some(step) => format!("{} ({})", k + 1, step.id),
        None => (k + 1).to_string(),
    };
    let mut lines = vec![format!(
        "{} {} pipeline {} release {} tenant {} created {}",
        e.execution_id,
        e.status,
        e.pipeline_id,
        e.release_version,
        e.tenant,
        e.created_at.utc()
    )];
    for entry in &history.entries {
        lines.push(format!(
            "  {}  +{:>9.3}s  {}{}",
            entry.at.utc(),
            entry.at.since(e.created_at).as_secs_f64(),
            describe(&entry.what, name),
            entry
                .launch_id
                .map(|l| format!("  launch {l}"))
                .unwrap_or_default()
        ));
    }
    lines.push("attempts:".into());
    for a in &history.attempts {
        lines.push(format!(
            "  step {} attempt {}  {}  {}{}{}",
            name(a.step),
            a.attempt,
            a.outcome,
            a.duration_ms
                .map(|d| format!("{d} ms"))
                .unwrap_or_else(|| "-".into()),
            a.code
                .as_ref()
                .map(|c| format!("  {c}"))
                .unwrap_or_default(),
            if a.heartbeats > 0 {
                format!("  {} heartbeat(s)", a.heartbeats)
            } else {
                String::new()
            }
        ));
    }
    if !history.missing_chunks.is_empty() {
        lines.push(format!(
            "journal chunks not found: {:?}",
            history.missing_chunks
        ));
    }
    lines.join("\n")
}

pub(crate) fn summary(record: &Execution, progress: Option<&UnitProgress>) -> String {
    let mut line = format!(
        "{} {} pipeline {} release {} step {} attempt {} version {}",
        record.id,
        record.status,
        record.pipeline_id,
        record.release_version,
        record.step + 1,
        record.attempt,
        record.version
    );
    if let (Some(unit), Some(progress)) = (&record.await_unit, progress) {
        if record.status == Status::WaitingExternal {
            line.push_str(&format!(" {}", waiting_on(unit, progress)));
        }
    }
    if let Some(error) = &record.error {
        line.push_str(&format!(" error {}: {}", error.code, error.message));
    }
    line
}

/// What an await unit waits on: its open interactions by name, or, for many (a fan-out's children),
/// the counts: `3/10 answered (SUCCEEDED 2, FAILED 1)`.
pub(crate) fn waiting_on(unit: &stepline::domain::AwaitUnit, progress: &UnitProgress) -> String {
    if unit.fan_out.is_none() && progress.interactions <= 3 {
        let pending: Vec<&str> = unit
            .interactions
            .iter()
            .filter(|i| i.completion.is_none())
            .map(|i| i.id.as_str())
            .collect();
        return format!("waiting on {}", pending.join(", "));
    }
    let answered: Vec<String> = progress
        .answered
        .iter()
        .map(|(outcome, n)| format!("{outcome} {n}"))
        .collect();
    format!(
        "{}/{} answered ({})",
        progress.interactions - progress.open,
        progress.interactions,
        answered.join(", ")
    )
}

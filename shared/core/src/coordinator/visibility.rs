//! What operators look at: executions listed by pipeline, status, tenant and creation time (the list
//! index, read a day at a time, newest first), and an execution's history (the journal and the
//! record's own entries).

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::{Coordinator, CoordinatorError};
use crate::domain::history::{self, AttemptView, Entry, Shown};
use crate::domain::Timestamp;
use crate::domain::{Execution, Status, StepKind};
use crate::ports::{ListCursor, ListQuery, DAY};

/// The window listed when none is given: the last week.
pub const DEFAULT_WINDOW: Duration = DAY.saturating_mul(7);
/// At most this many executions are read per listing call (a page may then hold fewer than asked
/// for when a filter is narrow; its `next` goes on from where the reading stopped).
pub const MAX_EXAMINED: usize = 1000;
/// Index entries read per Query.
const INDEX_PAGE: i32 = 100;
/// At most this many list-index pages (one Query each: a day, or a page of a day) are read per
/// listing call, however wide its window: a call that reaches it answers with what it found and a
/// `next` that goes on from the day it stopped at.
pub const MAX_INDEX_READS: usize = 30;
/// Nothing is created later than the clock plus this: a `to` further ahead lists from there.
const FUTURE_SLACK: Duration = DAY;
pub const MAX_LIMIT: usize = 200;

/// What to list: a pipeline's executions, optionally of some statuses and a tenant, created in
/// `[from, to)` (epoch ms), newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListRequest {
    pub pipeline_id: String,
    pub statuses: Vec<Status>,
    pub tenant: Option<String>,
    pub from: Option<Timestamp>,
    pub to: Option<Timestamp>,
    pub limit: usize,
    /// The `next` of the previous page.
    pub after: Option<String>,
}

/// One listed execution.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionSummary {
    pub execution_id: Uuid,
    pub pipeline_id: String,
    pub release_version: String,
    pub tenant: String,
    pub status: Status,
    /// The current step (0-based) and its attempt.
    pub step: u32,
    pub attempt: u32,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
}

impl ExecutionSummary {
    pub fn of(r: &Execution) -> Self {
        Self {
            execution_id: r.id,
            pipeline_id: r.pipeline_id.clone(),
            release_version: r.release_version.clone(),
            tenant: r.tenant.clone(),
            status: r.status,
            step: r.step,
            attempt: r.attempt,
            created_at: r.created_at,
            updated_at: r.updated_at,
            error_code: r.error.as_ref().map(|e| e.code.clone()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListResponse {
    pub executions: Vec<ExecutionSummary>,
    /// Pass as `after` for the next page; absent at the end of the window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Executions read to make this page.
    pub examined: usize,
}

/// A step of the pipeline and how far this execution is with it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepState {
    pub index: u32,
    pub id: String,
    pub kind: StepKind,
    /// PENDING, RUNNING, WAITING, RETRYING, SUCCEEDED, FAILED, CANCELLED or QUEUED.
    pub state: &'static str,
}

/// An execution's whole story.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryView {
    pub execution: ExecutionSummary,
    pub steps: Vec<StepState>,
    pub attempts: Vec<AttemptView>,
    pub entries: Vec<Shown>,
    /// The current step's input (what the next attempt gets).
    #[serde(skip_serializing_if = "Value::is_null")]
    pub input: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::domain::StepError>,
    /// Journal chunks the record counts on that could not be read (their entries are missing).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing_chunks: Vec<u32>,
}

fn encode(cursor: ListCursor) -> String {
    format!("{}.{}", cursor.created_at.millis(), cursor.id)
}

fn decode(text: &str) -> Result<ListCursor, CoordinatorError> {
    let bad = || CoordinatorError::Invalid(format!("not a listing position: {text:?}"));
    let (at, id) = text.split_once('.').ok_or_else(bad)?;
    // As `encode` writes it (and the spec's pattern says): a hyphenated id.
    if id.len() != 36 {
        return Err(bad());
    }
    Ok(ListCursor {
        created_at: Timestamp::from_millis(at.parse().map_err(|_| bad())?),
        id: id.parse().map_err(|_| bad())?,
    })
}

/// The state of step `k` of `record`, for a picture of the pipeline.
pub fn step_state(record: &Execution, k: u32) -> &'static str {
    use std::cmp::Ordering::*;
    match k.cmp(&record.step) {
        Less => "SUCCEEDED",
        Greater => "PENDING",
        Equal => match record.status {
            Status::Queued if record.attempt == 0 => "QUEUED",
            Status::Queued | Status::WaitRetry => "RETRYING",
            Status::Running => "RUNNING",
            Status::WaitingExternal => "WAITING",
            Status::Succeeded => "SUCCEEDED",
            Status::Failed | Status::Dlq => "FAILED",
            Status::Cancelled => "CANCELLED",
        },
    }
}

impl Coordinator {
    /// A page of a pipeline's executions, newest first (see [`ListRequest`]).
    pub async fn list(&self, request: ListRequest) -> Result<ListResponse, CoordinatorError> {
        if request.pipeline_id.is_empty() {
            return Err(CoordinatorError::Invalid("pipelineId is required".into()));
        }
        let limit = request.limit.clamp(1, MAX_LIMIT);
        let now = self.clock.now();
        let to = request
            .to
            .unwrap_or(now + Duration::from_millis(1))
            .min(now + FUTURE_SLACK);
        let from = request.from.unwrap_or(to - DEFAULT_WINDOW);
        if from >= to {
            // An empty window: nothing was created in it.
            return Ok(ListResponse {
                executions: Vec::new(),
                next: None,
                examined: 0,
            });
        }
        let mut position = match &request.after {
            Some(token) => decode(token)?.min(ListCursor::before(to)),
            None => ListCursor::before(to),
        };
        let mut day = position.created_at.days();
        let mut found = Vec::new();
        let mut examined = 0;
        let mut index_reads = 0;
        loop {
            if Timestamp::day_start(day + 1) <= from {
                return Ok(ListResponse {
                    executions: found,
                    next: None,
                    examined,
                });
            }
            if index_reads == MAX_INDEX_READS {
                return Ok(ListResponse {
                    executions: found,
                    next: Some(encode(position)),
                    examined,
                });
            }
            index_reads += 1;
            let page = self
                .store
                .list(ListQuery {
                    pipeline_id: request.pipeline_id.clone(),
                    day,
                    before: position,
                    limit: INDEX_PAGE,
                })
                .await?;
            let keys: Vec<ListCursor> = page
                .keys
                .iter()
                .copied()
                .filter(|k| k.created_at >= from)
                .collect();
            let window_ends = keys.len() < page.keys.len();
            let ids: Vec<Uuid> = keys.iter().map(|k| k.id).collect();
            let mut records = self.store.get_many(&ids).await?;
            examined += records.len();
            records.retain(|r| {
                (request.statuses.is_empty() || request.statuses.contains(&r.status))
                    && request.tenant.as_ref().is_none_or(|t| *t == r.tenant)
            });
            for key in &keys {
                position = *key;
                if let Some(r) = records.iter().find(|r| r.id == key.id) {
                    found.push(ExecutionSummary::of(r));
                    if found.len() == limit {
                        return Ok(ListResponse {
                            executions: found,
                            next: Some(encode(*key)),
                            examined,
                        });
                    }
                }
            }
            if window_ends {
                return Ok(ListResponse {
                    executions: found,
                    next: None,
                    examined,
                });
            }
            if examined >= MAX_EXAMINED {
                return Ok(ListResponse {
                    executions: found,
                    next: Some(encode(position)),
                    examined,
                });
            }
            if !page.more {
                day -= 1;
                position = ListCursor::before(Timestamp::day_start(day + 1));
            }
        }
    }

    /// The whole history of an execution: every entry, in order, with its attempts.
    pub async fn history(&self, id: Uuid) -> Result<HistoryView, CoordinatorError> {
        let record = self.get(id).await?;
        let chunks = (record.history_base / history::JOURNAL_CHUNK as u64) as u32;
        let mut entries: Vec<Entry> = Vec::new();
        let mut missing_chunks = Vec::new();
        if chunks > 0 {
            for (k, chunk) in self
                .store
                .journal(id, chunks)
                .await?
                .into_iter()
                .enumerate()
            {
                match chunk {
                    Some(chunk) => entries.extend(chunk),
                    None => missing_chunks.push(k as u32),
                }
            }
        }
        entries.extend(record.history.iter().cloned());
        let (shown, attempts) = history::attempts(id, record.created_at, &entries);
        let steps = match self
            .definition(&record.pipeline_id, &record.release_version)
            .await
        {
            Ok(definition) => (0..)
                .zip(&definition.steps)
                .map(|(k, step)| StepState {
                    index: k,
                    id: step.id.clone(),
                    kind: step.kind,
                    state: step_state(&record, k),
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        Ok(HistoryView {
            execution: ExecutionSummary::of(&record),
            steps,
            attempts,
            entries: shown,
            input: record.input.value().clone(),
            result: record.result.as_ref().map(|r| r.value().clone()),
            error: record.error.clone(),
            missing_chunks,
        })
    }
}

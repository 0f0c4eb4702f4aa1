//! Dead letters: bulk replay of the execution DLQ (re-drive every matching failed execution, on its
//! release or onto a fixed one) and moving messages from a queue's DLQ back to its source queue.
//! Both work on any SQS implementation (no `StartMessageMoveTask`): receive, act, then delete. A
//! crash between acting and deleting leaves the message in the DLQ; replaying it again is absorbed
//! (the execution is no longer at that failure, or the coordinator deduplicates the moved message),
//! so nothing is lost and nothing is applied twice.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{Coordinator, CoordinatorError, Role};
use crate::domain::{Event, Rejection, Status, Timestamp};
use crate::envelope::{DeadLetterEnvelope, REASON_ATTRIBUTE};
use crate::ports::{DeadLetter, DeadLetterQueue, OutMessage, StoreError};

/// Which dead letters to replay. Every field that is set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ReplayFilter {
    pub pipeline_id: Option<String>,
    pub tenant: Option<String>,
    pub error_code: Option<String>,
    /// The release the execution failed on.
    pub release_version: Option<String>,
    /// The step it failed at (its id).
    pub step_id: Option<String>,
    /// Inclusive.
    pub from: Option<Timestamp>,
    /// Exclusive.
    pub to: Option<Timestamp>,
}

/// What a dead letter says of itself, as far as it says it.
struct Facts<'a> {
    pipeline_id: Option<&'a str>,
    tenant: Option<&'a str>,
    error_code: Option<&'a str>,
    release_version: Option<&'a str>,
    step_id: Option<&'a str>,
    at: Option<Timestamp>,
}

impl ReplayFilter {
    fn matches(&self, facts: &Facts) -> bool {
        let same = |want: &Option<String>, have: Option<&str>| {
            want.as_deref().is_none_or(|w| have == Some(w))
        };
        let at = facts.at;
        same(&self.pipeline_id, facts.pipeline_id)
            && same(&self.tenant, facts.tenant)
            && same(&self.error_code, facts.error_code)
            && same(&self.release_version, facts.release_version)
            && same(&self.step_id, facts.step_id)
            && self.from.is_none_or(|from| at.is_some_and(|at| at >= from))
            && self.to.is_none_or(|to| at.is_some_and(|at| at < to))
    }
}

fn default_max() -> usize {
    100
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayRequest {
    #[serde(default)]
    pub filter: ReplayFilter,
    /// Report what would be replayed; change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Examine at most this many messages.
    #[serde(default = "default_max")]
    pub max_messages: usize,
    /// Replay at most this many messages per second (none: as fast as possible).
    #[serde(default)]
    pub rate_per_second: Option<f64>,
    /// Audit reason recorded on every re-driven execution.
    pub reason: String,
    /// Replay: continue each execution on this release of its pipeline (a hotfix), each move
    /// checked as a single re-drive onto it is; a refused one is reported and left in the DLQ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub onto_release: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayReport {
    pub examined: usize,
    pub matched: usize,
    /// Re-driven (or moved) and deleted from the DLQ.
    pub replayed: usize,
    /// Already handled (the execution was no longer at that failure): deleted from the DLQ.
    pub absorbed: usize,
    /// Not matching, dry run, or failed: left in the DLQ.
    pub kept: usize,
    /// Not replayed for an error, each one's in `refused` (with its execution when the message
    /// names one).
    pub failed: usize,
    #[serde(default)]
    pub refused: Vec<Refused>,
    pub dry_run: bool,
    /// Executions that matched.
    pub executions: Vec<Uuid>,
}

/// A matching dead letter left in its DLQ: the refusal's code and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Refused {
    pub execution_id: Option<Uuid>,
    pub code: String,
    pub message: String,
}

/// The text field `name` of a JSON object, if it has one.
fn text_of<'a>(object: Option<&'a serde_json::Value>, name: &str) -> Option<&'a str> {
    object?.get(name)?.as_str()
}

/// Paces actions to `rate` per second.
struct Pace {
    interval: Option<Duration>,
    next: Option<tokio::time::Instant>,
}

impl Pace {
    fn new(rate: Option<f64>) -> Self {
        Self {
            interval: rate
                .filter(|r| *r > 0.0)
                .map(|r| Duration::from_secs_f64(1.0 / r)),
            next: None,
        }
    }

    async fn wait(&mut self) {
        let Some(interval) = self.interval else {
            return;
        };
        if let Some(next) = self.next {
            tokio::time::sleep_until(next).await;
        }
        self.next = Some(tokio::time::Instant::now() + interval);
    }
}

enum Outcome {
    Replayed,
    Absorbed,
}

/// Walks a DLQ: `act` on each matching message, delete what was acted on, release the rest.
async fn walk<M, A, Fut>(
    queue: &dyn DeadLetterQueue,
    request: &ReplayRequest,
    began: Timestamp,
    mut matches: M,
    mut act: A,
) -> Result<ReplayReport, CoordinatorError>
where
    M: FnMut(&DeadLetter) -> Option<Option<Uuid>>,
    A: FnMut(DeadLetter) -> Fut,
    Fut: std::future::Future<Output = Result<Outcome, CoordinatorError>>,
{
    let mut report = ReplayReport {
        dry_run: request.dry_run,
        ..Default::default()
    };
    let mut held = Vec::new();
    let mut pace = Pace::new(request.rate_per_second);
    while report.examined < request.max_messages {
        let batch = queue
            .receive((request.max_messages - report.examined).min(10))
            .await?;
        if batch.is_empty() {
            break;
        }
        for message in batch {
            // Only what was in the DLQ when the walk began: a message dead-lettered again while it runs
            // (moved back, and refused again by its consumer) is left for the next walk, or one walk
            // would go round in circles.
            if message.sent_at.is_some_and(|sent| sent > began) {
                held.push(message.handle);
                continue;
            }
            report.examined += 1;
            let Some(execution) = matches(&message) else {
                report.kept += 1;
                held.push(message.handle);
                continue;
            };
            report.matched += 1;
            report.executions.extend(execution);
            if request.dry_run {
                report.kept += 1;
                held.push(message.handle);
                continue;
            }
            pace.wait().await;
            let handle = message.handle.clone();
            match act(message).await {
                Ok(outcome) => {
                    // Delete only after the act took effect: a crash before this line replays again.
                    queue.delete(&handle).await?;
                    match outcome {
                        Outcome::Replayed => report.replayed += 1,
                        Outcome::Absorbed => report.absorbed += 1,
                    }
                }
                Err(e) => {
                    tracing::warn!(code = %e.code(), error = %e, "dead letter not replayed; kept");
                    report.refused.push(Refused {
                        execution_id: execution,
                        code: e.code().as_str().to_string(),
                        message: e.to_string(),
                    });
                    report.failed += 1;
                    report.kept += 1;
                    held.push(handle);
                }
            }
        }
    }
    for handle in held {
        queue.release(&handle).await?;
    }
    Ok(report)
}

impl Coordinator {
    /// Re-drives the executions of matching dead-letter envelopes from the execution DLQ.
    pub async fn replay(
        &self,
        queue: &dyn DeadLetterQueue,
        request: &ReplayRequest,
    ) -> Result<ReplayReport, CoordinatorError> {
        super::requests::require_reason(&request.reason, "a replay")?;
        let envelope =
            |message: &DeadLetter| serde_json::from_str::<DeadLetterEnvelope>(&message.body).ok();
        walk(
            queue,
            request,
            self.now(),
            |message| {
                let e = envelope(message)?;
                request
                    .filter
                    .matches(&Facts {
                        pipeline_id: Some(&e.pipeline_id),
                        tenant: Some(&e.tenant),
                        error_code: e.error.as_ref().map(|x| x.code.as_str()),
                        release_version: Some(&e.release_version),
                        step_id: Some(&e.step_id),
                        at: Some(e.failed_at),
                    })
                    .then_some(Some(e.execution_id))
            },
            |message| {
                let e = envelope(&message);
                async move {
                    let e = e.expect("matched messages parse");
                    self.redrive_failure(&e, &request.reason, request.onto_release.as_deref())
                        .await
                }
            },
        )
        .await
    }

    /// Re-drives the failure an envelope was written for, if the execution is still at it.
    async fn redrive_failure(
        &self,
        envelope: &DeadLetterEnvelope,
        reason: &str,
        onto_release: Option<&str>,
    ) -> Result<Outcome, CoordinatorError> {
        for _ in 0..3 {
            let record = match self.get(envelope.execution_id).await {
                Ok(record) => record,
                Err(CoordinatorError::NotFound(_)) => return Ok(Outcome::Absorbed),
                Err(e) => return Err(e),
            };
            let at_this_failure = matches!(record.status, Status::Failed | Status::Dlq)
                && record.dead_letter.as_ref().map(|d| d.id) == Some(envelope.dead_letter_id);
            if !at_this_failure {
                return Ok(Outcome::Absorbed);
            }
            let onto = match onto_release {
                Some(to) => Some(self.hotfix_pin(&record, to).await?),
                None => None,
            };
            let event = Event::Redrive {
                expected_version: record.version,
                reason: reason.to_string(),
                onto,
            };
            match self.apply(record.id, &event, Role::Replay).await {
                Ok(_) => return Ok(Outcome::Replayed),
                // The record moved between the read and the write (e.g. its envelope was just marked sent).
                Err(CoordinatorError::Rejected(Rejection::VersionMismatch { .. })) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(CoordinatorError::Contention(3))
    }

    /// Moves matching messages from a queue's DLQ back to `target` (send, then delete). Filters use the
    /// dead-letter reason attribute as error code, the send time, and the envelope's identity and tenant
    /// when the body is a request or reply.
    pub async fn move_dead_letters(
        &self,
        queue: &dyn DeadLetterQueue,
        target: &str,
        request: &ReplayRequest,
    ) -> Result<ReplayReport, CoordinatorError> {
        if request.onto_release.is_some() {
            return Err(CoordinatorError::Invalid(
                "a move sends messages back as they are: ontoRelease is for a replay".into(),
            ));
        }
        walk(
            queue,
            request,
            self.now(),
            |message| {
                let body: serde_json::Value =
                    serde_json::from_str(&message.body).unwrap_or_default();
                let header = body.get("header").unwrap_or(&body);
                let identity = header.get("identity");
                let execution = header
                    .get("executionId")
                    .and_then(|v| v.as_str())
                    .and_then(|v| v.parse().ok());
                request
                    .filter
                    .matches(&Facts {
                        pipeline_id: text_of(identity, "pipelineId"),
                        tenant: text_of(Some(header), "tenant"),
                        error_code: message.attributes.get(REASON_ATTRIBUTE).map(String::as_str),
                        release_version: text_of(identity, "releaseVersion"),
                        step_id: text_of(Some(header), "stepId"),
                        at: message.sent_at,
                    })
                    .then_some(execution)
            },
            |message| async move {
                let result = self
                    .sender
                    .send(target, &[OutMessage::new(message.body)])
                    .await;
                match result.into_iter().next() {
                    Some(Ok(())) => Ok(Outcome::Replayed),
                    Some(Err(e)) => Err(CoordinatorError::Store(StoreError::Unavailable(
                        e.to_string(),
                    ))),
                    None => Err(CoordinatorError::Store(StoreError::Unavailable(
                        "nothing sent".into(),
                    ))),
                }
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(release: Option<&'a str>, step: Option<&'a str>) -> Facts<'a> {
        Facts {
            pipeline_id: Some("orders"),
            tenant: Some("acme"),
            error_code: Some("PRICING_BUG"),
            release_version: release,
            step_id: step,
            at: Some(Timestamp::from_millis(5)),
        }
    }

    #[test]
    fn a_filter_takes_only_the_release_and_step_it_names() {
        let filter = ReplayFilter {
            release_version: Some("1".into()),
            step_id: Some("price".into()),
            ..Default::default()
        };
        assert!(filter.matches(&facts(Some("1"), Some("price"))));
        assert!(!filter.matches(&facts(Some("2"), Some("price"))));
        assert!(!filter.matches(&facts(Some("1"), Some("validate"))));
        assert!(
            !filter.matches(&facts(None, Some("price"))),
            "a dead letter that does not say its release is not taken"
        );
        assert!(ReplayFilter::default().matches(&facts(None, None)));
    }
}

//! Claim checks on the coordinator's side: an execution's input, an interaction's answer and a
//! worker's inline output or error message above the threshold are stored in the payload bucket
//! before the record that refers to them is committed, so the record holds references, not payloads.

use serde_json::Value;
use uuid::Uuid;

use super::{Coordinator, CoordinatorError};
use crate::cache::json_size;
use crate::claims::{check_inline, ClaimCheck, ClaimError};
use crate::domain::{Event, Outcome};

impl Coordinator {
    /// Claim-checks payloads above `claims`' threshold (without one, payloads are kept inline up to the
    /// store's item limit).
    pub fn with_claim_check(mut self, claims: ClaimCheck) -> Self {
        self.claims = Some(claims);
        self
    }

    pub fn claims(&self) -> Option<&ClaimCheck> {
        self.claims.as_ref()
    }

    /// `value`, or its reference once stored when it is above the threshold. Without a payload
    /// bucket, a payload too large to travel inline is refused (`PAYLOAD_TOO_LARGE`).
    pub async fn claim_checked(
        &self,
        execution: Uuid,
        value: Value,
    ) -> Result<Value, CoordinatorError> {
        match &self.claims {
            Some(claims) => Ok(claims.offload(execution, value).await?),
            None => {
                check_inline(&value)?;
                Ok(value)
            }
        }
    }

    /// The event with its payloads above the threshold claim-checked; `None` if nothing changed.
    pub async fn claim_checked_event(
        &self,
        execution: Uuid,
        event: &Event,
    ) -> Result<Option<Event>, CoordinatorError> {
        let Some(claims) = &self.claims else {
            return inline_only_event(event);
        };
        let over = |value: &Value| json_size(value) > claims.threshold();
        Ok(match event {
            Event::CompleteInteraction { payload, .. } if over(payload) => {
                let mut event = event.clone();
                if let Event::CompleteInteraction { payload, .. } = &mut event {
                    *payload = claims.offload(execution, payload.take()).await?;
                }
                Some(event)
            }
            Event::FromWorker {
                sender,
                event: inner,
            } => {
                let Event::Reply { outcome, .. } = inner.as_ref() else {
                    return Ok(None);
                };
                let outcome = match outcome {
                    Outcome::Succeeded(output) if over(output) => {
                        Outcome::Succeeded(claims.offload(execution, output.clone()).await?)
                    }
                    Outcome::Failed(error) if error.message.len() > claims.threshold() => {
                        Outcome::Failed(claims.offload_error(execution, error.clone()).await?)
                    }
                    _ => return Ok(None),
                };
                let mut reply = inner.as_ref().clone();
                if let Event::Reply { outcome: slot, .. } = &mut reply {
                    *slot = outcome;
                }
                Some(Event::FromWorker {
                    sender: sender.clone(),
                    event: Box::new(reply),
                })
            }
            _ => None,
        })
    }
}

/// Without a payload bucket: an answer too large to travel inline is refused; a worker's output too
/// large to travel on fails its step for good (`PAYLOAD_TOO_LARGE`) instead of a request that could
/// never be sent.
fn inline_only_event(event: &Event) -> Result<Option<Event>, CoordinatorError> {
    match event {
        Event::CompleteInteraction { payload, .. } => {
            check_inline(payload)?;
            Ok(None)
        }
        Event::FromWorker {
            sender,
            event: inner,
        } => {
            let Event::Reply {
                outcome: Outcome::Succeeded(output),
                ..
            } = inner.as_ref()
            else {
                return Ok(None);
            };
            let Err(too_large) = check_inline(output) else {
                return Ok(None);
            };
            let mut reply = inner.as_ref().clone();
            if let Event::Reply { outcome, .. } = &mut reply {
                *outcome = Outcome::Failed(ClaimError::step_error(&too_large));
            }
            Ok(Some(Event::FromWorker {
                sender: sender.clone(),
                event: Box::new(reply),
            }))
        }
        _ => Ok(None),
    }
}

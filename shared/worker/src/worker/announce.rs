//! A worker's announcements to the coordinator: who it is, which queue it reads, whether it drains.

use std::sync::Mutex;

use aws_lambda_events::event::sqs::SqsEvent;

use super::{RawRequest, Worker};
use crate::ports::OutMessage;

/// When and where a worker announces itself: at its first batch, then at most every
/// [`ANNOUNCE_EVERY_MS`](crate::release::ANNOUNCE_EVERY_MS), on the reply queue it was given or, until
/// it is known, the one its requests name.
pub(super) struct Announcer {
    worker_id: String,
    reply_queue: Option<String>,
    queue: String,
    last: Option<std::time::Instant>,
    /// Once it drains, every later announcement says so.
    draining: bool,
}

impl Worker {
    /// Announces the worker (identity, queue, state) on the coordinator's reply queue: at its first
    /// batch and then now and then, so that `stepline workers` lists it and an activation of a release
    /// nobody serves warns. `reply_queue`: where to send before a request names it.
    pub fn with_announcements(mut self, reply_queue: Option<String>) -> Self {
        self.announcer = Some(Mutex::new(Announcer {
            worker_id: uuid::Uuid::new_v4().to_string(),
            reply_queue,
            queue: String::new(),
            last: None,
            draining: false,
        }));
        self
    }

    /// The name of the request queue it reads, when known before its first batch (a polling worker).
    pub fn reading(self, queue: &str) -> Self {
        if let Some(announcer) = &self.announcer {
            announcer.lock().expect("announcer").queue = queue.to_string();
        }
        self
    }

    /// Announces the worker if an announcement is due (a polling worker calls it while idle too).
    pub async fn announce_if_due(&self) {
        self.announce(crate::release::WorkerState::Healthy).await;
    }

    /// Announces that this worker drains (takes no more requests): submissions pinned to its
    /// release are refused once all its workers drain.
    pub async fn drain(&self) {
        self.announce(crate::release::WorkerState::Draining).await;
    }

    /// Sends an announcement if one is due (or `state` is draining); best effort.
    pub(super) async fn announce(&self, state: crate::release::WorkerState) {
        let Some(announcer) = &self.announcer else {
            return;
        };
        let every = crate::release::ANNOUNCE_EVERY;
        let (queue, message) = {
            let mut a = announcer.lock().expect("announcer");
            let due = a.last.is_none_or(|last| last.elapsed() >= every)
                || state == crate::release::WorkerState::Draining && !a.draining;
            a.draining |= state == crate::release::WorkerState::Draining;
            let state = if a.draining {
                crate::release::WorkerState::Draining
            } else {
                state
            };
            let Some(reply_queue) = a.reply_queue.clone().filter(|_| due) else {
                return;
            };
            a.last = Some(std::time::Instant::now());
            let announcement = crate::envelope::WorkerAnnouncement::new(
                a.worker_id.clone(),
                self.core.identity.clone(),
                a.queue.clone(),
                state,
            );
            let body = serde_json::to_string(&announcement).expect("an announcement serializes");
            (reply_queue, OutMessage::new(body))
        };
        if let Some(Err(e)) = self.core.sender.send(&queue, &[message]).await.pop() {
            tracing::warn!(error = %e, "worker announcement not sent");
            if let Some(announcer) = &self.announcer {
                announcer.lock().expect("announcer").last = None;
            }
        }
    }

    /// Learns the request queue and (unless given) the reply queue from a batch, then announces.
    pub(super) async fn announce_from(&self, event: &SqsEvent) {
        let Some(announcer) = &self.announcer else {
            return;
        };
        {
            let mut a = announcer.lock().expect("announcer");
            if a.queue.is_empty() {
                if let Some(arn) = event
                    .records
                    .iter()
                    .find_map(|m| m.event_source_arn.as_deref())
                {
                    a.queue = arn.rsplit(':').next().unwrap_or_default().to_string();
                }
            }
            if a.reply_queue.is_none() {
                a.reply_queue = event
                    .records
                    .iter()
                    .filter_map(|m| m.body.as_deref())
                    .find_map(|body| serde_json::from_str::<RawRequest>(body).ok())
                    .map(|request| request.header.reply_to)
                    .filter(|url| !url.is_empty());
            }
        }
        self.announce(crate::release::WorkerState::Healthy).await;
    }
}

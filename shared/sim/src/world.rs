//! The simulated world: queues with visibility timeouts, receive counts and redrive, the table and its
//! lagging due index, the payloads, the clock, and what every role's invocation is doing.

use crate::*;

pub(crate) struct Message {
    pub(crate) id: u64,
    /// When it was sent (SQS `SentTimestamp`).
    pub(crate) sent_at: i64,
    pub(crate) body: String,
    pub(crate) reason: Option<String>,
    pub(crate) visible_at: i64,
    pub(crate) receives: u32,
    pub(crate) receipt: u64,
}

#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) messages: Vec<Message>,
    pub(crate) dlq: Option<&'static str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Claim,
    Launch,
    Completion,
    Worker,
    Api,
    /// The user's system taking await notices and answering them.
    Approver,
}

#[derive(Default)]
pub(crate) struct Invocation {
    pub(crate) role: Option<Role>,
    pub(crate) killed: bool,
    /// The bodies of the batch it was given.
    pub(crate) batch: Vec<String>,
    /// Records it read.
    pub(crate) reads: BTreeSet<Uuid>,
    /// Leases it committed (execution, generation, token), and the launch work it sent.
    pub(crate) leases: Vec<(Uuid, u64, Uuid)>,
    pub(crate) launches: BTreeSet<(Uuid, u64)>,
    /// The worker process it ran on.
    pub(crate) worker: Option<usize>,
}

/// The due index's view of one record, from the time a write becomes visible in it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IndexEntry {
    pub(crate) visible_at: i64,
    /// Rounded due key and shard; `None`: not in the index.
    pub(crate) key: Option<(i64, u32)>,
}

pub(crate) struct World {
    pub(crate) rng: fastrand::Rng,
    pub(crate) now: i64,
    pub(crate) faults: bool,
    pub(crate) config: SimConfig,
    /// The table: records, their deferrals and the history journal, under the same conditional
    /// writes as every in-memory store. The due index beside it (`index`) lags, as DynamoDB's does.
    pub(crate) store: Arc<InMemoryExecutionStore>,
    pub(crate) index: BTreeMap<Uuid, Vec<IndexEntry>>,
    pub(crate) shards: u32,
    pub(crate) queues: BTreeMap<&'static str, Queue>,
    pub(crate) next_id: u64,
    pub(crate) current: Option<u64>,
    pub(crate) invocations: BTreeMap<u64, Invocation>,
    pub(crate) plans: BTreeMap<Uuid, Plan>,
    /// Lifecycle event ids published at least once.
    pub(crate) published: BTreeSet<String>,
    /// Step outcomes applied: (execution, step) -> count of writes that turned it SUCCEEDED.
    pub(crate) applied: BTreeMap<(Uuid, u32), u32>,
    /// Attempts that ended in failure: execution -> (step, attempt) -> code.
    pub(crate) attempt_ends: BTreeMap<Uuid, BTreeMap<(u32, u32), String>>,
    /// Attempts with a request or reply parked in a DLQ: (execution, step, attempt).
    pub(crate) parked: BTreeSet<(Uuid, u32, u32)>,
    /// Executions with an await notice or an interaction completion parked in a DLQ.
    pub(crate) parked_awaits: BTreeSet<Uuid>,
    /// Attempts whose worker the payload store failed (crashed) while it handled their request.
    pub(crate) payload_faults: BTreeSet<(Uuid, u32, u32)>,
    /// Request headers seen on the request queue (what an adversary reading it learns).
    pub(crate) overheard: Vec<RequestHeader>,
    /// Cancels that reached a result: execution -> committed.
    pub(crate) cancels: BTreeMap<Uuid, bool>,
    pub(crate) redrives: BTreeMap<Uuid, u32>,
    pub(crate) violations: Vec<String>,
    pub(crate) report: SimReport,
}

pub(crate) enum Fate {
    Proceed,
    CrashBefore,
    CrashAfter,
    /// Applied, but the caller is told otherwise (and lives on).
    LostResponse,
    Dead,
}

impl World {
    pub(crate) fn fate(&mut self) -> Fate {
        let Some(id) = self.current else {
            return Fate::Proceed;
        };
        if self.invocations.entry(id).or_default().killed {
            return Fate::Dead;
        }
        if !self.faults {
            return Fate::Proceed;
        }
        let roll = self.rng.f64();
        if roll < self.config.lost_response_rate {
            self.report.counts.lost_responses += 1;
            return Fate::LostResponse;
        }
        if roll >= self.config.lost_response_rate + self.config.crash_rate {
            return Fate::Proceed;
        }
        self.invocations.entry(id).or_default().killed = true;
        self.report.counts.crashes += 1;
        if self.rng.bool() {
            Fate::CrashBefore
        } else {
            Fate::CrashAfter
        }
    }

    pub(crate) fn invocation(&mut self) -> Option<&mut Invocation> {
        let id = self.current?;
        self.invocations.get_mut(&id)
    }

    pub(crate) fn push(
        &mut self,
        queue: &str,
        mut body: String,
        reason: Option<String>,
        delay_ms: i64,
    ) {
        let id = self.next_id;
        self.next_id += 1;
        let visible_at = self.now + delay_ms;
        // (A forged reply parked explains nothing: it names an attempt it does not answer.)
        if DLQS.contains(&queue) && !body.contains(FORGED) {
            self.note_parked(&body);
        }
        if queue == REQUEST {
            if let Some(header) = request_header(&body).filter(|h| h.kind == REQUEST_KIND) {
                if crate::domain::seal::split_token(&header.reply_token)
                    .1
                    .is_some()
                {
                    self.report.counts.sealed_requests += 1;
                }
                self.overheard.push(header);
            }
        }
        // A worker (or a relay) that mixes up the sealed part of its reply token: the reply is genuine
        // (its launch's own token), the record it carries another request's, of this execution or not.
        if queue == REPLY && !body.contains(FORGED) && self.rng.u8(0..16) == 0 {
            if let Some(mixed) = self.mix_seal(&body) {
                self.report.counts.mixed_seals += 1;
                body = mixed;
            }
        }
        if queue == LAUNCH {
            if let (Ok(work), Some(invocation)) = (
                serde_json::from_str::<LaunchWork>(&body),
                self.current.and_then(|c| self.invocations.get_mut(&c)),
            ) {
                invocation
                    .launches
                    .insert((work.execution_id, work.generation));
            }
        }
        if let Some(q) = self.queues.get_mut(queue) {
            q.messages.push(Message {
                id,
                sent_at: self.now,
                body,
                reason,
                visible_at,
                receives: 0,
                receipt: 0,
            });
        }
    }

    /// A request or reply reaching a DLQ explains its attempt's timeout.
    pub(crate) fn note_parked(&mut self, body: &str) {
        let attempt = request_header(body)
            .map(|h| (h.execution_id, h.step_index, h.attempt))
            .or_else(|| {
                serde_json::from_str::<ReplyEnvelope>(body)
                    .ok()
                    // (A heartbeat answers nothing.)
                    .filter(|r| r.outcome != ReplyOutcome::Running)
                    .map(|r| (r.execution_id, r.step_index, r.attempt))
            });
        if let Some(attempt) = attempt {
            self.parked.insert(attempt);
        }
        let awaited = serde_json::from_str::<AwaitNotice>(body)
            .map(|n| n.execution_id)
            .or_else(|_| serde_json::from_str::<InteractionMessage>(body).map(|m| m.execution_id));
        if let Ok(execution) = awaited {
            self.parked_awaits.insert(execution);
        }
    }

    /// Receives up to `max` visible messages in random order; a message received more than
    /// `max_receives` times moves to the queue's DLQ instead (SQS redrive policy).
    pub(crate) fn receive(&mut self, queue: &'static str, max: usize) -> Vec<(u64, u64, String)> {
        let now = self.now;
        let visibility = i64::from(self.config.visibility_secs) * 1000;
        let max_receives = self.config.max_receives;
        let mut visible: Vec<usize> = self.queues[queue]
            .messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m.visible_at <= now)
            .map(|(i, _)| i)
            .collect();
        self.rng.shuffle(&mut visible);
        visible.truncate(max);
        let mut out = Vec::new();
        let mut moved = Vec::new();
        for index in visible {
            let receipt = self.next_id;
            self.next_id += 1;
            let q = self.queues.get_mut(queue).expect("queue");
            let has_dlq = q.dlq.is_some();
            let message = &mut q.messages[index];
            if has_dlq && message.receives >= max_receives {
                moved.push(message.id);
                continue;
            }
            message.receives += 1;
            message.receipt = receipt;
            message.visible_at = now + visibility;
            out.push((message.id, receipt, message.body.clone()));
        }
        for id in moved {
            let q = self.queues.get_mut(queue).expect("queue");
            let index = q.messages.iter().position(|m| m.id == id).expect("message");
            let message = q.messages.remove(index);
            if let Some(dlq) = q.dlq {
                self.report.counts.parked += 1;
                let reason = message.reason.or(Some("MAX_RECEIVES".into()));
                self.push(dlq, message.body, reason, 0);
            }
        }
        out
    }

    pub(crate) fn delete(&mut self, queue: &str, id: u64, receipt: u64) {
        if let Some(q) = self.queues.get_mut(queue) {
            q.messages.retain(|m| !(m.id == id && m.receipt == receipt));
        }
    }

    /// Puts the record's current due time in the index, visible after a random lag.
    pub(crate) fn index(&mut self, id: Uuid) {
        let lag = if self.rng.bool() {
            0
        } else {
            self.rng.i64(0..=self.config.index_lag_ms)
        };
        let key = self.store.due_at(id).map(|due| {
            (
                due_key(
                    due,
                    Duration::from_millis(self.config.due_granularity_ms as u64),
                )
                .millis(),
                due_shard(id, self.shards),
            )
        });
        let now = self.now;
        let entries = self.index.entry(id).or_default();
        // Entries hidden behind a visible later one are never read again.
        if let Some(last_visible) = entries.iter().rposition(|e| e.visible_at <= now) {
            entries.drain(..last_visible);
        }
        entries.push(IndexEntry {
            visible_at: (now + lag).max(entries.last().map_or(0, |e| e.visible_at)),
            key,
        });
    }

    /// What the index shows for `id` now (the latest entry visible), and whether it is stale.
    pub(crate) fn indexed(&self, id: &Uuid) -> (Option<(i64, u32)>, bool) {
        let entries = &self.index[id];
        let visible = entries.iter().rev().find(|e| e.visible_at <= self.now);
        let stale = entries.last().is_some_and(|e| e.visible_at > self.now);
        (visible.and_then(|e| e.key), stale)
    }

    /// When the sweeper can next find something due: the earliest time an entry's key is due and the
    /// entry is visible.
    pub(crate) fn next_claimable(&self) -> Option<i64> {
        self.index
            .values()
            .filter_map(|entries| {
                let last = entries.last()?;
                last.key.map(|(key, _)| key.max(last.visible_at))
            })
            .min()
    }

    pub(crate) fn write(
        &mut self,
        record: &Execution,
        expected: Option<u64>,
    ) -> Result<(), StoreError> {
        let previous = self.store.snapshot(record.id);
        let fenced = matches!((expected, &previous), (Some(v), Some(p)) if p.version != v);
        // A store without the version condition replaces whatever version it holds.
        let condition = match &previous {
            Some(p) if expected.is_some() && self.config.broken_store => Some(p.version),
            _ => expected,
        };
        if let Err(refused) = self.store.write(record, condition) {
            if fenced && matches!(refused, StoreError::Conflict) {
                self.report.counts.fenced_writes += 1;
            }
            return Err(refused);
        }
        if let Some(p) = &previous {
            self.observe(p, record);
        }
        let new_lease = record.lease.as_ref().is_some_and(|l| {
            previous
                .as_ref()
                .and_then(|p| p.lease.as_ref())
                .is_none_or(|pl| pl.token != l.token)
        });
        if new_lease && !record.status.is_terminal() {
            let token = record.lease.as_ref().map(|l| l.token).unwrap_or_default();
            if let Some(invocation) = self.invocation() {
                invocation
                    .leases
                    .push((record.id, record.generation, token));
            }
        }
        self.index(record.id);
        Ok(())
    }

    /// Checks a write as it happens: versions, fencing, attempt ends, outcomes applied.
    /// An execution's whole history as a version of its record and the journal tell it; `None` when
    /// a chunk the record counts on is not in the journal.
    pub(crate) fn history(&self, r: &Execution) -> Option<Vec<crate::domain::history::Entry>> {
        let chunks = r.history_base / crate::domain::history::JOURNAL_CHUNK as u64;
        let mut all = Vec::new();
        for k in 0..chunks as u32 {
            all.extend(self.store.chunk(r.id, k)?);
        }
        all.extend(r.history.iter().cloned());
        Some(all)
    }

    pub(crate) fn observe(&mut self, p: &Execution, record: &Execution) {
        let id = record.id;
        // History is only appended to (its last entry, a heartbeat, may count on), and an entry leaves
        // the record only once the journal holds it.
        match (self.history(p), self.history(record)) {
            (Some(before), Some(after)) => {
                let kept = before.len().saturating_sub(1);
                if after.len() < before.len() || after[..kept] != before[..kept] {
                    self.violations.push(format!(
                        "history of {id} rewritten: version {} over {}",
                        record.version, p.version
                    ));
                }
            }
            (_, None) => self.violations.push(format!(
                "history of {id} lost: version {} dropped entries the journal does not hold",
                record.version
            )),
            (None, Some(_)) => {}
        }
        if record.version != p.version + 1 {
            self.violations.push(format!(
                "lost update on {id}: wrote version {} over version {}",
                record.version, p.version
            ));
        }
        if record.generation < p.generation {
            self.violations.push(format!(
                "fenced holder committed on {id}: generation {} over {}",
                record.generation, p.generation
            ));
        }
        // Launch work is carried out only under the lease it names, whatever the version says.
        let launching = self
            .current
            .and_then(|c| self.invocations.get(&c))
            .filter(|i| i.role == Some(Role::Launch));
        // (A launch invocation also writes what is not launch work: its lifecycle events published.)
        let lease_token = |r: &Execution| r.lease.as_ref().map(|l| l.token);
        let work = p.status != record.status
            || p.step != record.step
            || p.attempt != record.attempt
            || p.launch_id != record.launch_id
            || p.resends != record.resends
            || lease_token(p) != lease_token(record);
        if let Some(invocation) = launching.filter(|_| work) {
            let holds = invocation.batch.iter().any(|body| {
                serde_json::from_str::<LaunchWork>(body).is_ok_and(|w| {
                    w.execution_id == id
                        && w.generation == p.generation
                        && p.lease.as_ref().is_some_and(|l| l.token == w.token)
                })
            });
            if !holds {
                self.violations.push(format!(
                    "launch work wrote {id} without its lease (generation {}, lease {:?}))",
                    p.generation,
                    p.lease.as_ref().map(|l| l.token)
                ));
            }
        }
        for k in record.steps_succeeded_since(p) {
            *self.applied.entry((id, k)).or_default() += 1;
        }
        // A re-drive (by an operator or a bulk replay of the execution DLQ): a new budget.
        if matches!(p.status, Status::Failed | Status::Dlq) && !record.status.is_terminal() {
            self.report.counts.redrives += 1;
            *self.redrives.entry(id).or_default() += 1;
        }
        // An attempt ended in failure: it must end as its plan (or a parked message) says.
        let ended = matches!(p.status, Status::Running | Status::WaitingExternal)
            && matches!(record.status, Status::WaitRetry | Status::Failed);
        if ended {
            let (k, a) = (record.step, record.attempt);
            let code = record
                .progress(k)
                .and_then(|s| s.error.as_ref())
                .or(record.error.as_ref())
                .map(|e| e.code.clone())
                .unwrap_or_default();
            let planned = self.plans.get(&id).and_then(|plan| plan.answer(k, a));
            let explained = match code.as_str() {
                "STEP_TIMEOUT" => self.parked.contains(&(id, k, a)),
                "AWAIT_TIMEOUT" => self.parked_awaits.contains(&id),
                "PAYLOAD_UNAVAILABLE" => self.payload_faults.contains(&(id, k, a)),
                _ => false,
            };
            if planned != Some(code.as_str()) && !explained {
                self.violations.push(format!(
                    "{id} step {k} attempt {a} ended {code}, its plan says {planned:?}"
                ));
            }
            match code.as_str() {
                "STEP_TIMEOUT" => self.report.counts.timeouts += 1,
                "AWAIT_TIMEOUT" => self.report.counts.await_timeouts += 1,
                "REJECTED" => self.report.counts.rejections += 1,
                "ITEM_TOO_LARGE" => self.report.counts.oversized += 1,
                _ => {}
            }
            if record.status == Status::WaitRetry {
                self.report.counts.retries += 1;
            }
            let ends = self.attempt_ends.entry(id).or_default();
            if ends.insert((k, a), code).is_some() {
                self.violations
                    .push(format!("{id} step {k} attempt {a} ended twice"));
            }
        }
    }
}

/// The header of a request message (`{"header": .., "payload": ..}`).
pub(crate) fn request_header(body: &str) -> Option<RequestHeader> {
    let mut message: Value = serde_json::from_str(body).ok()?;
    serde_json::from_value(message.get_mut("header")?.take()).ok()
}

pub(crate) fn round_up(t: i64, step: i64) -> i64 {
    t.div_euclid(step) * step + if t.rem_euclid(step) == 0 { 0 } else { step }
}

impl World {
    /// A worker's heartbeat for a request it holds (what the worker runtime sends while a step runs):
    /// it extends the attempt's deadline if the attempt is current, and is ignored otherwise.
    pub(crate) fn heartbeat(&mut self) {
        if self.overheard.is_empty() {
            return;
        }
        let header = self.overheard[self.rng.usize(0..self.overheard.len())].clone();
        let beat = ReplyEnvelope::for_request(&header, ReplyOutcome::Running);
        self.report.counts.heartbeats += 1;
        let body = serde_json::to_string(&beat).expect("heartbeat");
        self.push(REPLY, body, None, 0);
    }

    /// `body` (a reply) with the sealed record in its token swapped for an overheard request's.
    pub(crate) fn mix_seal(&mut self, body: &str) -> Option<String> {
        let mut reply: Value = serde_json::from_str(body).ok()?;
        let token = reply.get("replyToken")?.as_str()?.to_string();
        let (own, _) = crate::domain::seal::split_token(&token);
        let other = self
            .overheard
            .get(self.rng.usize(0..self.overheard.len().max(1)))?;
        let (_, sealed) = crate::domain::seal::split_token(&other.reply_token);
        reply["replyToken"] = json!(crate::domain::seal::sealed_token(own, sealed?));
        serde_json::to_string(&reply).ok()
    }

    /// An adversary who read a request replies to it with a wrong token: a forged success or a forged
    /// permanent failure. It must be refused and parked, never applied.
    pub(crate) fn forge_reply(&mut self) {
        if self.overheard.is_empty() {
            return;
        }
        let header = self.overheard[self.rng.usize(0..self.overheard.len())].clone();
        let tag = format!("{FORGED} #{}#", self.report.counts.forged);
        let outcome = if self.rng.bool() {
            ReplyOutcome::Succeeded {
                output: json!({"trail": [tag], "plan": {}}),
            }
        } else {
            ReplyOutcome::Failed {
                error: StepError::new("FORGED", tag, false),
            }
        };
        let mut reply = ReplyEnvelope::for_request(&header, outcome);
        reply.reply_token = match self.rng.u8(0..3) {
            0 => String::new(),
            _ => "0".repeat(header.reply_token.len().max(32)),
        };
        // The adversary sees what a worker sees, the sealed part of the token included. Reading the
        // record there is a violation by itself; with it, the adversary seals a record of its own
        // making (its own secret) and signs the reply with that secret.
        if let Some(mut record) = read_seal(&header.reply_token) {
            self.violations.push(format!(
                "a worker read the record of {} sealed in its request",
                header.execution_id
            ));
            record.secret = "feed".repeat(8);
            let own = crate::domain::reply_token(&record.secret, header.launch_id);
            let mut sealed = vec![0; crate::domain::crypto::NONCE_BYTES];
            sealed.extend(serde_json::to_vec(&record).expect("a record serializes"));
            reply.reply_token =
                crate::domain::seal::sealed_token(&own, &URL_SAFE_NO_PAD.encode(sealed));
        }
        self.report.counts.forged += 1;
        let body = serde_json::to_string(&reply).expect("reply");
        self.push(REPLY, body, None, 0);
    }
}

//! The seeded scheduler: which invocation runs next, which faults it meets, and the simulated
//! approver.

use crate::*;

/// Starts, polls and ends invocations.
pub(crate) struct Scheduler<'a> {
    pub(crate) world: Shared,
    pub(crate) processes: &'a Processes<'a>,
    pub(crate) running: Vec<Running>,
    pub(crate) next_invocation: u64,
}

impl Scheduler<'_> {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().expect("world")
    }

    pub(crate) fn begin(&mut self, role: Role, batch: Vec<String>) -> u64 {
        let id = self.next_invocation;
        self.next_invocation += 1;
        let mut w = self.lock();
        w.report.counts.invocations += 1;
        w.invocations.insert(
            id,
            Invocation {
                role: Some(role),
                batch,
                ..Invocation::default()
            },
        );
        id
    }

    /// A sweep of the due index, with its function's deadline.
    pub(crate) fn start_sweep(&mut self) {
        let pick = self.lock().rng.usize(0..2);
        let claim = self.processes.claim[pick].clone();
        let id = self.begin(Role::Claim, Vec::new());
        let world = self.world.clone();
        let task: Task = Box::pin(async move {
            // Everything due when the sweep starts (as the index shows it), by version.
            let (started, due) = {
                let w = world.lock().expect("world");
                let due: Vec<(Uuid, u64)> = w
                    .index
                    .keys()
                    .filter(|id| {
                        let (key, stale) = w.indexed(id);
                        !stale && key.is_some_and(|(key, _)| key <= w.now)
                    })
                    .map(|id| (*id, w.store.read(*id, |r| r.version).expect("record")))
                    .collect();
                (w.now, due)
            };
            let deadline = Some(Timestamp::from_millis(started + CLAIM_TIMEOUT_MS));
            let report =
                crate::handlers::claim_within(&claim, EventBridgeEvent::default(), deadline).await;
            let mut w = world.lock().expect("world");
            w.report.counts.sweeps += 1;
            let Ok(report) = report else { return None };
            w.report.counts.sweeps_cut_short += usize::from(report.stopped_early);
            let invocation = &w.invocations[&id];
            if invocation.killed || report.stopped_early || report.failed_queries > 0 {
                return None;
            }
            let missed: Vec<Uuid> = due
                .into_iter()
                .filter(|(e, version)| {
                    !invocation.reads.contains(e)
                        && w.store.read(*e, |r| r.version) == Some(*version)
                })
                .map(|(e, _)| e)
                .collect();
            for e in missed {
                w.violations.push(format!(
                    "a sweep that ran to its end never read {e}, due when it started"
                ));
            }
            None
        });
        self.run_alone(id, task);
    }

    /// Runs `task` as invocation `id`, on no queue's messages.
    fn run_alone(&mut self, id: u64, task: Task) {
        self.running.push(Running {
            id,
            task,
            queue: None,
            receipts: Vec::new(),
        });
    }

    /// An operator's cancel, racing whatever runs.
    pub(crate) fn start_cancel(&mut self, execution: Uuid) {
        let api = self.processes.api.clone();
        let id = self.begin(Role::Api, Vec::new());
        let world = self.world.clone();
        let task: Task = Box::pin(async move {
            let result = api
                .cancel(CancelRequest {
                    execution_id: execution,
                    reason: "operator cancel in the sim".into(),
                })
                .await;
            let mut w = world.lock().expect("world");
            w.report.counts.cancels += 1;
            if !w.invocations[&id].killed {
                w.cancels.insert(execution, result.is_ok());
            }
            None
        });
        self.run_alone(id, task);
    }

    /// An operator's bulk replay of the execution DLQ.
    pub(crate) fn start_replay(&mut self) {
        let api = self.processes.api.clone();
        let id = self.begin(Role::Api, Vec::new());
        let world = self.world.clone();
        let task: Task = Box::pin(async move {
            let dlq = SimDeadLetterQueue {
                world: world.clone(),
                queue: EXECUTION_DLQ,
            };
            let request = ReplayRequest {
                filter: ReplayFilter::default(),
                dry_run: false,
                max_messages: 100,
                rate_per_second: None,
                reason: "bulk replay in the sim".into(),
                onto_release: None,
            };
            let report = api.replay(&dlq, &request).await;
            let mut w = world.lock().expect("world");
            w.report.counts.bulk_replays += 1;
            if let Ok(report) = report {
                w.report.counts.replayed += report.replayed;
            }
            None
        });
        self.run_alone(id, task);
    }

    /// An SQS-triggered invocation of a random process of the queue's consumer.
    pub(crate) fn start_delivery(&mut self, queue: &'static str) {
        let batch = {
            let mut w = self.lock();
            let max = w.rng.usize(1..=10);
            w.receive(queue, max)
        };
        if batch.is_empty() {
            return;
        }
        let mut event = SqsEvent::default();
        let mut receipts = Vec::new();
        let mut bodies = Vec::new();
        for (i, (message_id, receipt, body)) in batch.into_iter().enumerate() {
            let mut m = SqsMessage::default();
            m.message_id = Some(format!("m{i}"));
            m.receipt_handle = Some(receipt.to_string());
            bodies.push(body.clone());
            m.body = Some(body);
            event.records.push(m);
            receipts.push((format!("m{i}"), message_id, receipt));
        }
        let pick = self.lock().rng.usize(0..2);
        let (role, task): (Role, Task) = match queue {
            LAUNCH => {
                let c = self.processes.launch[pick].clone();
                (
                    Role::Launch,
                    Box::pin(async move { Some(crate::handlers::launch(&c, event).await) }),
                )
            }
            REPLY => {
                let c = self.processes.completion[pick].clone();
                let mut event = event;
                // Planted: the event source hands the completion every other reply, and the others
                // are acknowledged with its batch, never applied.
                if planted::active(Bug::DropsReplies) {
                    let mut n = 0;
                    event.records.retain(|_| {
                        n += 1;
                        n % 2 == 1
                    });
                }
                (
                    Role::Completion,
                    Box::pin(async move { Some(crate::handlers::completion(&c, event).await) }),
                )
            }
            APPROVALS => {
                let approver = Approver {
                    world: self.world.clone(),
                    api: self.processes.api.clone(),
                    sender: self.processes.approver.clone(),
                };
                (
                    Role::Approver,
                    Box::pin(async move { Some(approver.handle(event).await) }),
                )
            }
            _ => {
                let w = self.processes.workers.lock().expect("workers")[pick].clone();
                (
                    Role::Worker,
                    Box::pin(async move { Some(w.handle(event).await) }),
                )
            }
        };
        // A worker that gets a request of a hanging attempt never answers (nor acknowledges).
        let hangs = {
            let w = self.lock();
            role == Role::Worker
                && bodies.iter().filter_map(|b| request_header(b)).any(|h| {
                    w.plans.get(&h.execution_id).and_then(|p| p.hang)
                        == Some((h.step_index, h.attempt))
                })
        };
        let id = self.begin(role, bodies);
        if role == Role::Worker {
            self.lock()
                .invocations
                .get_mut(&id)
                .expect("invocation")
                .worker = Some(pick);
        }
        if hangs {
            let mut w = self.lock();
            w.report.counts.hangs += 1;
            w.invocations.get_mut(&id).expect("invocation").killed = true;
        }
        self.running.push(Running {
            id,
            task,
            queue: Some(queue),
            receipts,
        });
    }

    /// Polls invocation `index` once; a finished one has its batch acknowledged (unless it died) and
    /// is checked: a live invocation sent the launch of every lease it committed.
    pub(crate) fn poll(&mut self, index: usize) {
        let mut cx = TaskContext::from_waker(Waker::noop());
        self.lock().current = Some(self.running[index].id);
        let poll = self.running[index].task.as_mut().poll(&mut cx);
        let world = self.world.clone();
        let mut w = world.lock().expect("world");
        w.current = None;
        let Poll::Ready(response) = poll else { return };
        let done = self.running.swap_remove(index);
        let invocation = w.invocations.remove(&done.id).unwrap_or_default();
        if invocation.killed {
            drop(w);
            if let Some(slot) = invocation.worker {
                let fresh = (self.processes.new_worker)();
                self.processes.workers.lock().expect("workers")[slot] = fresh;
            }
            return;
        }
        // (A lease no longer in the record was taken over or ended: its launch is moot.)
        for (execution, generation, token) in &invocation.leases {
            let token_of = |r: &Execution| r.lease.as_ref().map(|l| l.token);
            let held = w.store.read(*execution, token_of).flatten() == Some(*token);
            if held && !invocation.launches.contains(&(*execution, *generation)) {
                w.violations.push(format!(
                    "a live {:?} invocation committed lease {generation} of {execution} and never \
                     sent its launch",
                    invocation.role
                ));
            }
        }
        if let (Some(queue), Some(response)) = (done.queue, response) {
            let failed: BTreeSet<String> = response
                .batch_item_failures
                .into_iter()
                .map(|f| f.item_identifier)
                .collect();
            for (event_id, message_id, receipt) in done.receipts {
                if !failed.contains(&event_id) {
                    w.delete(queue, message_id, receipt);
                }
            }
        }
    }

    pub(crate) fn faulty_action(&mut self) {
        let choice = self.lock().rng.u8(0..100);
        match choice {
            0..=41 if !self.running.is_empty() => {
                let index = self.lock().rng.usize(0..self.running.len());
                self.poll(index);
            }
            42..=70 => {
                let queue = WORK_QUEUES[self.lock().rng.usize(0..WORK_QUEUES.len())];
                self.start_delivery(queue);
            }
            71..=77 => self.start_sweep(),
            78..=88 => {
                let mut w = self.lock();
                let jump = if w.rng.u8(0..5) == 0 {
                    w.report.counts.lease_expiries += 1;
                    w.rng.i64(20_000..70_000)
                } else {
                    w.rng.i64(0..5_000)
                };
                w.report.counts.time_jumps += 1;
                w.now += jump;
            }
            89..=91 => {
                // Duplicate delivery of a random message.
                let mut w = self.lock();
                let queue = [LAUNCH, REPLY, REQUEST][w.rng.usize(0..3)];
                let count = w.queues[queue].messages.len();
                if count > 0 {
                    let i = w.rng.usize(0..count);
                    let body = w.queues[queue].messages[i].body.clone();
                    w.report.counts.duplicates += 1;
                    w.push(queue, body, None, 0);
                }
            }
            92..=93 => self.lock().forge_reply(),
            94 => self.lock().heartbeat(),
            95 => {
                let mut w = self.lock();
                let shards = w.rng.u32(1..=4);
                if shards != w.shards {
                    w.report.counts.shard_changes += 1;
                    w.shards = shards;
                }
            }
            _ => {
                let mut w = self.lock();
                let queue = [LAUNCH, REPLY, REQUEST][w.rng.usize(0..3)];
                let tag = format!("{GARBAGE} #{}#", w.report.counts.garbage);
                let body = match w.rng.u8(0..3) {
                    0 => tag,
                    1 => format!("{{\"{tag}\": true}}"),
                    _ => format!("{{\"kind\":\"stepline.reply.v1\",\"x\":\"{tag}\"}}"),
                };
                w.report.counts.garbage += 1;
                w.push(queue, body, None, 0);
            }
        }
    }

    /// Runs without faults until nothing is left to do; an execution still running
    /// `SETTLE_WITHIN_MS` (simulated) later is a violation. Sweeps run on their schedule.
    pub(crate) fn settle(&mut self) {
        let calm_from = self.lock().now;
        let mut last_sweep = i64::MIN;
        for _ in 0..50_000 {
            if !self.running.is_empty() {
                let index = self.lock().rng.usize(0..self.running.len());
                self.poll(index);
                continue;
            }
            let (now, visible, next_visible, claimable) = {
                let w = self.lock();
                let queues = WORK_QUEUES;
                let visible = queues
                    .into_iter()
                    .find(|q| w.queues[q].messages.iter().any(|m| m.visible_at <= w.now));
                let next_visible = queues
                    .into_iter()
                    .flat_map(|q| w.queues[q].messages.iter().map(|m| m.visible_at))
                    .min();
                (w.now, visible, next_visible, w.next_claimable())
            };
            if now - calm_from > SETTLE_WITHIN_MS {
                let mut w = self.lock();
                let open: Vec<String> = w
                    .store
                    .find(|r| !r.status.is_terminal())
                    .iter()
                    .map(|r| format!("{} {}", r.id, r.status))
                    .collect();
                w.violations.push(format!(
                    "not settled {} h after the faults stopped: {open:?}",
                    SETTLE_WITHIN_MS / 3_600_000
                ));
                return;
            }
            if let Some(queue) = visible {
                self.start_delivery(queue);
                continue;
            }
            let next_sweep = claimable.map(|t| round_up(t.max(now), SWEEP_EVERY_MS));
            if next_sweep == Some(now) && last_sweep != now {
                last_sweep = now;
                self.start_sweep();
                continue;
            }
            let next_sweep = claimable.map(|t| round_up(t.max(now + 1), SWEEP_EVERY_MS));
            match [next_visible, next_sweep].into_iter().flatten().min() {
                Some(t) => {
                    let mut w = self.lock();
                    w.now = w.now.max(t).max(now + 1);
                }
                None => return,
            }
        }
        self.lock()
            .violations
            .push("did not settle within 50,000 calm actions".into());
    }
}

/// The approver: answers each await notice as the execution's plan says, through the API or through
/// the await-completion queue (chosen at random), presenting a forged token first when planned.
pub(crate) struct Approver {
    pub(crate) world: Shared,
    pub(crate) api: Arc<Coordinator>,
    pub(crate) sender: Arc<SimSender>,
}

impl Approver {
    pub(crate) async fn handle(&self, event: SqsEvent) -> SqsBatchResponse {
        let mut response = SqsBatchResponse::default();
        for message in event.records {
            let id = message.message_id.clone().unwrap_or_default();
            let notice = message
                .body
                .as_deref()
                .and_then(|b| serde_json::from_str::<AwaitNotice>(b).ok());
            let Some(notice) = notice else { continue };
            if !self.answer(&notice).await {
                let mut failure = aws_lambda_events::event::sqs::BatchItemFailure::default();
                failure.item_identifier = id;
                response.batch_item_failures.push(failure);
            }
        }
        response
    }

    /// Answers one notice; `false` if it must be delivered again.
    pub(crate) async fn answer(&self, notice: &AwaitNotice) -> bool {
        let (approval, by_queue, tag) = {
            let mut w = self.world.lock().expect("world");
            let approval = w
                .plans
                .get(&notice.execution_id)
                .map_or(Approval::Approve, |p| p.approval);
            let by_queue = w.rng.bool();
            let tag = format!("{FORGED} #{}#", w.report.counts.forged);
            (approval, by_queue, tag)
        };
        let Some(interaction) = notice.interactions.first() else {
            return true;
        };
        let message = |verdict, token: &str, payload: Value| InteractionMessage {
            kind: INTERACTION_KIND.to_string(),
            execution_id: notice.execution_id,
            interaction: interaction.id.clone(),
            token: token.to_string(),
            verdict,
            payload,
            unit: Some(notice.await_unit_id),
        };
        if approval == Approval::ForgeThenApprove {
            let forged = message(
                Verdict::Approved,
                &"0".repeat(interaction.token.len().max(16)),
                json!({"forged": tag}),
            );
            // (Sent by an adversary, beside the approver: not subject to the approver's faults.)
            let refused = if by_queue {
                let mut w = self.world.lock().expect("world");
                w.report.counts.forged += 1;
                let body = serde_json::to_string(&forged).expect("interaction");
                w.push(REPLY, body, None, 0);
                true
            } else {
                let result = self.api.complete_interaction(forged).await;
                if result.is_ok() {
                    self.world.lock().expect("world").violations.push(format!(
                        "a forged interaction token was accepted for {}",
                        notice.execution_id
                    ));
                }
                true
            };
            self.world
                .lock()
                .expect("world")
                .report
                .counts
                .forged_interactions += 1;
            if !refused {
                return false;
            }
        }
        let verdict = match approval {
            Approval::Ignore => return true,
            Approval::Reject => Verdict::Rejected,
            Approval::Approve | Approval::ForgeThenApprove => Verdict::Approved,
        };
        let answer = message(verdict, &interaction.token, json!({"by": "sim"}));
        let done = if by_queue {
            self.send(&answer).await
        } else {
            self.api
                .complete_interaction(answer)
                .await
                .map_or_else(|e| !e.is_retryable(), |_| true)
        };
        if done && verdict == Verdict::Approved {
            self.world.lock().expect("world").report.counts.approvals += 1;
        }
        done
    }

    pub(crate) async fn send(&self, message: &InteractionMessage) -> bool {
        let body = serde_json::to_string(message).expect("interaction");
        let results = self.sender.send(REPLY, &[OutMessage::new(body)]).await;
        results.iter().all(Result::is_ok)
    }
}

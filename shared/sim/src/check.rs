//! The invariants checked as the schedule runs and at its end.

use crate::*;

/// The record sealed in a reply token, if whoever holds the token can read it (a seal that is not
/// encrypted: never, unless the sealing is broken).
pub(crate) fn read_seal(token: &str) -> Option<Execution> {
    let sealed = crate::domain::seal::split_token(token).1?;
    let bytes = URL_SAFE_NO_PAD.decode(sealed).ok()?;
    serde_json::from_slice(bytes.get(crate::domain::crypto::NONCE_BYTES..)?).ok()
}

/// The invariants, checked once the system has settled.
pub(crate) fn check(world: &Shared, config: &SimConfig, claims: Option<&ClaimCheck>) {
    // Results, claim-checked ones read back as the API's caller would (before the world is locked:
    // the payload store takes its lock).
    let results: BTreeMap<Uuid, Value> = {
        let records = world.lock().expect("world").store.find(|_| true);
        records
            .into_iter()
            .filter_map(|r| {
                let value = r.result.as_ref()?.value().clone();
                let value = match claims {
                    Some(claims) => block_on(claims.resolve(value)).ok()?,
                    None => value,
                };
                Some((r.id, value))
            })
            .collect()
    };
    let mut w = world.lock().expect("world");
    let mut violations = Vec::new();
    let plans: Vec<Plan> = w.plans.values().cloned().collect();
    for plan in &plans {
        let id = plan.id;
        let Some(record) = w.store.snapshot(id) else {
            violations.push(format!("execution {id} lost"));
            continue;
        };
        let faulted: BTreeMap<(u32, u32), String> = w
            .attempt_ends
            .get(&id)
            .into_iter()
            .flatten()
            .filter(|(_, code)| FAULT_CODES.contains(&code.as_str()))
            .map(|(attempt, code)| (*attempt, code.clone()))
            .collect();
        let redrives = w.redrives.get(&id).copied().unwrap_or(0);
        let expected = expected_end(plan, &faulted, redrives, config.max_attempts);
        let cancel = w.cancels.get(&id).copied();
        let expect_end = match (record.status, cancel) {
            (Status::Cancelled, _) if plan.cancel_at.is_some() => None,
            (Status::Cancelled, _) => {
                violations.push(format!("{id} CANCELLED, never cancelled"));
                None
            }
            (_, Some(true)) => {
                violations.push(format!(
                    "{id} ended {} although its cancel was committed",
                    record.status
                ));
                None
            }
            _ => Some(&expected),
        };
        let dlq: Vec<&str> = w.queues[EXECUTION_DLQ]
            .messages
            .iter()
            .map(|m| m.body.as_str())
            .collect();
        for violation in judge_end(&record, expect_end, &dlq) {
            violations.push(format!("{violation}; plan {plan:?}"));
        }
        if record.status == Status::Succeeded {
            let trail = results.get(&id).map(|r| r["trail"].clone());
            if trail != Some(json!(STEP_IDS)) {
                violations.push(format!("{id} SUCCEEDED with wrong result {trail:?}"));
            }
        }
        let done_steps = match record.status {
            Status::Succeeded => STEPS,
            _ => record.step,
        };
        for k in 0..STEPS {
            let applied = w.applied.get(&(id, k)).copied().unwrap_or(0);
            let expected = u32::from(k < done_steps);
            if applied != expected {
                violations.push(format!(
                    "{id} step {k} outcome applied {applied} times, expected {expected}"
                ));
            }
        }
        // Every lifecycle event committed was published (at least once).
        for seq in 0..record.event_seq {
            if !w.published.contains(&format!("{id}/{seq}")) {
                violations.push(format!("{id} lifecycle event {seq} never published"));
            }
        }
        if record.event_seq == 0 {
            violations.push(format!("{id} recorded no lifecycle event"));
        }
        // A message that did not prove it may act on an execution writes nothing to it.
        for incident in &record.incidents {
            if UNAUTHENTICATED_CODES.contains(&incident.code.as_str()) {
                violations.push(format!(
                    "{id} noted {}: a message that did not authenticate wrote to it",
                    incident.code
                ));
            }
        }
        match record.status {
            Status::Succeeded => w.report.counts.succeeded += 1,
            Status::Failed => w.report.counts.failed += 1,
            Status::Cancelled => w.report.counts.cancelled += 1,
            _ => {}
        }
    }
    for q in WORK_QUEUES {
        let left = w.queues[q].messages.len();
        if left > 0 {
            violations.push(format!("{left} messages left on {q}"));
        }
    }
    // Every garbage and forged message sits in a DLQ (duplicated deliveries may put it there twice).
    let in_a_dlq = |tag: &str| {
        DLQS.into_iter()
            .any(|q| w.queues[q].messages.iter().any(|m| m.body.contains(tag)))
    };
    for n in 0..w.report.counts.garbage {
        if !in_a_dlq(&format!("{GARBAGE} #{n}#")) {
            violations.push(format!("garbage message #{n} lost: in no DLQ"));
        }
    }
    for n in 0..w.report.counts.forged {
        if !in_a_dlq(&format!("{FORGED} #{n}#")) {
            violations.push(format!("forged reply #{n} lost: in no DLQ"));
        }
    }
    w.violations.extend(violations);
}

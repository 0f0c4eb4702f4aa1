//! Deterministic identifiers.

use uuid::Uuid;

use super::crypto::hmac_sha256;

/// Namespace of launch ids (a fixed, project-specific UUID).
const LAUNCH_NAMESPACE: Uuid = Uuid::from_u128(0x6f1c_2a4e_9b3d_4c57_a8e2_5d0f_7b19_c6e3);

/// The launch id of attempt `attempt` of step `step` of `execution`: UUIDv5, so every party that knows the
/// triple derives the same id, and a re-sent request carries the id of the original.
pub fn launch_id(execution: Uuid, step: u32, attempt: u32) -> Uuid {
    Uuid::new_v5(
        &LAUNCH_NAMESPACE,
        format!("{execution}/{step}/{attempt}").as_bytes(),
    )
}

/// Namespace of the ids of executions submitted with an idempotency key.
const IDEMPOTENCY_NAMESPACE: Uuid = Uuid::from_u128(0x3b0e_91c4_55d2_4f0a_9c7e_1a2b_8d6f_40e1);

/// The id of the execution a submission with idempotency key `key` creates: the same key (per tenant
/// and pipeline) always names the same execution.
pub fn idempotent_id(tenant: &str, pipeline: &str, key: &str) -> Uuid {
    Uuid::new_v5(
        &IDEMPOTENCY_NAMESPACE,
        format!("{tenant}/{pipeline}/{key}").as_bytes(),
    )
}

/// The idempotency key of an execution started by an event (`StartExecution`) with id `event`.
pub fn start_event_key(event: &str) -> String {
    format!("event:{event}")
}

/// The id of the start event of item `item` of the fan-out at step `step` of `parent`: the same for
/// every attempt of the step, so the child is the same execution (see `Event::Rejoin`).
pub fn fan_out_event_id(parent: Uuid, step: u32, item: &str) -> String {
    format!("{parent}/{step}/{item}")
}

/// Namespace of fan-out children's ids: apart from every id a submission or a start event names, so
/// that nobody but the parent's coordinator (with a signed link) can make, or take, a child's id.
const CHILD_NAMESPACE: Uuid = Uuid::from_u128(0x9a4d_27c1_0e6b_4f38_b5d2_73e8_c1f0_5a96);

/// The id of that child, an execution of `pipeline` for `tenant`.
pub fn fan_out_child_id(tenant: &str, pipeline: &str, parent: Uuid, step: u32, item: &str) -> Uuid {
    let key = fan_out_event_id(parent, step, item);
    Uuid::new_v5(
        &CHILD_NAMESPACE,
        format!("{tenant}/{pipeline}/{key}").as_bytes(),
    )
}

/// A new execution's reply secret: 128 random bits drawn for it alone (`Context::secret`), as hex.
pub fn new_secret(random: [u8; 16]) -> String {
    hex::encode(random)
}

/// The token a reply (or heartbeat) for `launch` must carry: HMAC-SHA256 under the execution's secret,
/// over the launch id, truncated to 128 bits (hex). A worker learns the token of the launches it was
/// sent and nothing else: a launch id anyone can derive, its token only the coordinator can.
pub fn reply_token(secret: &str, launch: Uuid) -> String {
    hex::encode(&hmac_sha256(secret.as_bytes(), launch.as_bytes())[..16])
}

/// The resume token of item `item` of the fan-out at step `step` of `execution`: HMAC-SHA256 under the
/// execution's secret (128 bits, hex). The same for every attempt of the step, so a child started by an
/// earlier attempt (a retry, a re-drive) completes the current attempt's interaction, and only the
/// coordinator can derive it.
pub fn fan_out_token(secret: &str, execution: Uuid, step: u32, item: &str) -> String {
    let message = format!("fan-out/{execution}/{step}/{item}");
    hex::encode(&hmac_sha256(secret.as_bytes(), message.as_bytes())[..16])
}

/// The key of step `step` of `execution` for its side effects: HMAC-SHA256 under the execution's
/// secret (128 bits, hex). The same for every attempt of the step and across re-drives (the launch id
/// changes per attempt), so a worker that keys a payment or an email on it does it once however often
/// the step runs; and only the coordinator can derive it, so nobody can take another execution's key
/// at a downstream service before it.
pub fn step_key(secret: &str, execution: Uuid, step: u32) -> String {
    let message = format!("step/{execution}/{step}");
    hex::encode(&hmac_sha256(secret.as_bytes(), message.as_bytes())[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_key_is_the_steps_alone_and_needs_the_executions_secret() {
        let (execution, other) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let key = step_key("secret", execution, 0);
        assert_eq!(key, step_key("secret", execution, 0));
        assert_eq!(key.len(), 32);
        assert_ne!(key, step_key("secret", execution, 1));
        assert_ne!(key, step_key("secret", other, 0));
        assert_ne!(key, step_key("another secret", execution, 0));
        // Apart from every token the same secret makes.
        assert_ne!(key, reply_token("secret", launch_id(execution, 0, 1)));
        assert_ne!(key, fan_out_token("secret", execution, 0, "0"));
    }

    #[test]
    fn no_submission_or_start_event_names_a_fan_out_child() {
        let parent = Uuid::from_u128(5);
        let child = fan_out_child_id("t", "p", parent, 1, "item-0");
        let event = fan_out_event_id(parent, 1, "item-0");
        for key in [
            start_event_key(&event),
            event.clone(),
            format!("child:{event}"),
        ] {
            assert_ne!(idempotent_id("t", "p", &key), child, "{key}");
        }
        assert_eq!(child, fan_out_child_id("t", "p", parent, 1, "item-0"));
        assert_ne!(child, fan_out_child_id("t", "p", parent, 1, "item-1"));
    }

    #[test]
    fn launch_ids_are_deterministic_and_distinct() {
        let e = Uuid::from_u128(7);
        assert_eq!(launch_id(e, 1, 2), launch_id(e, 1, 2));
        assert_ne!(launch_id(e, 1, 2), launch_id(e, 1, 3));
        assert_ne!(launch_id(e, 1, 2), launch_id(e, 2, 1));
        assert_eq!(launch_id(e, 0, 1).get_version_num(), 5);
    }

    #[test]
    fn fan_out_tokens_are_stable_per_item_and_secret() {
        let secret = new_secret([1; 16]);
        let e = Uuid::from_u128(7);
        assert_eq!(
            fan_out_token(&secret, e, 1, "item-0"),
            fan_out_token(&secret, e, 1, "item-0")
        );
        assert_ne!(
            fan_out_token(&secret, e, 1, "item-0"),
            fan_out_token(&secret, e, 1, "item-1")
        );
        assert_ne!(
            fan_out_token(&secret, e, 1, "item-0"),
            fan_out_token(&new_secret([2; 16]), e, 1, "item-0")
        );
    }

    #[test]
    fn reply_tokens_depend_on_the_secret_and_the_launch() {
        let secret = new_secret([1; 16]);
        let launch = launch_id(Uuid::from_u128(7), 0, 1);
        assert_eq!(reply_token(&secret, launch), reply_token(&secret, launch));
        assert_eq!(reply_token(&secret, launch).len(), 32);
        assert_ne!(
            reply_token(&secret, launch),
            reply_token(&new_secret([2; 16]), launch)
        );
        assert_ne!(
            reply_token(&secret, launch),
            reply_token(&secret, launch_id(Uuid::from_u128(7), 0, 2))
        );
    }
}

//! Deterministic identifiers.

use uuid::Uuid;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_ids_are_deterministic_and_distinct() {
        let e = Uuid::from_u128(7);
        assert_eq!(launch_id(e, 1, 2), launch_id(e, 1, 2));
        assert_ne!(launch_id(e, 1, 2), launch_id(e, 1, 3));
        assert_ne!(launch_id(e, 1, 2), launch_id(e, 2, 1));
        assert_eq!(launch_id(e, 0, 1).get_version_num(), 5);
    }
}

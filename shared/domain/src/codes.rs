//! The catalogue of stable codes: every error the API, the Lambda handlers and the dead-letter
//! attributes report, and every step error code the coordinator itself writes. One table gives each
//! code its text and its HTTP status, so a new code cannot be added without deciding how the API
//! answers it (the match is exhaustive), and `openapi.yaml`'s status table is checked against it.

use std::fmt;

use serde::{Serialize, Serializer};

macro_rules! catalogue {
    ($($(#[doc = $doc:literal])* $variant:ident = $text:literal => $status:literal,)*) => {
        /// A stable, machine-readable code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Code {
            /// Every code, in catalogue order.
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// The code as it appears on the wire (`SCREAMING_SNAKE_CASE`).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $text,)*
                }
            }

            /// The HTTP status an API response carries with this code.
            pub const fn http_status(self) -> u16 {
                match self {
                    $(Code::$variant => $status,)*
                }
            }
        }
    };
}

catalogue! {
    // Requests the API refuses.
    /// A body that does not parse or lacks a field.
    InvalidBody = "INVALID_BODY" => 400,
    /// A path parameter that is not a UUID, is empty or is badly percent-encoded.
    InvalidId = "INVALID_ID" => 400,
    /// Well-formed but not acceptable (an empty tenant or reason, ...).
    InvalidRequest = "INVALID_REQUEST" => 400,
    /// A release descriptor inconsistent with its definition.
    InvalidRelease = "INVALID_RELEASE" => 400,
    /// No such path.
    NoRoute = "NO_ROUTE" => 404,
    /// The route is for another audience than the endpoint serves (`http::Audience`).
    NotServed = "NOT_SERVED" => 403,
    /// The path exists with another method.
    MethodNotAllowed = "METHOD_NOT_ALLOWED" => 405,
    BodyTooLarge = "BODY_TOO_LARGE" => 413,
    /// Another descriptor is registered under that release version.
    ReleaseConflict = "RELEASE_CONFLICT" => 409,
    /// No result yet: the execution is still running.
    NotFinished = "NOT_FINISHED" => 409,
    /// No result: the execution ended without success.
    NotSucceeded = "NOT_SUCCEEDED" => 409,
    /// The response could not be encoded.
    Internal = "INTERNAL" => 500,

    // The coordinator.
    NotFound = "NOT_FOUND" => 404,
    UnknownRelease = "UNKNOWN_RELEASE" => 404,
    NoActiveRelease = "NO_ACTIVE_RELEASE" => 404,
    /// Every worker of the release a submission would pin drains: it would never run.
    ReleaseDraining = "RELEASE_DRAINING" => 409,
    /// A stored item cannot be read.
    CorruptRecord = "CORRUPT_RECORD" => 500,
    /// DynamoDB (or SQS) throttled or unreachable: safe to retry.
    StoreUnavailable = "STORE_UNAVAILABLE" => 503,
    /// Too many concurrent writes to one execution: safe to retry.
    Contention = "CONTENTION" => 503,
    /// A write the store refuses for its size (DynamoDB's 400 KB item limit): final. As a step error
    /// code: the step's outcome did not fit in the execution record.
    ItemTooLarge = "ITEM_TOO_LARGE" => 413,
    /// A payload larger than any path takes (a message's limit, with no payload bucket to hold it):
    /// final.
    PayloadTooLarge = "PAYLOAD_TOO_LARGE" => 413,
    /// The payload bucket throttled or unreachable: safe to retry.
    PayloadUnavailable = "PAYLOAD_UNAVAILABLE" => 503,
    /// A payload reference that does not resolve: its object is missing, in another bucket than the
    /// stack's, or does not match the reference's size and digest. As a step error code: final.
    PayloadUnresolvable = "PAYLOAD_UNRESOLVABLE" => 422,

    // Events the state machine refuses.
    UnknownCorrelation = "UNKNOWN_CORRELATION" => 409,
    ReceiptConflict = "RECEIPT_CONFLICT" => 409,
    VersionConflict = "VERSION_CONFLICT" => 409,
    NotRedrivable = "NOT_REDRIVABLE" => 409,
    /// A re-drive onto a release that cannot continue the execution from its step (the message
    /// says why, with the two releases' diff).
    IncompatibleRelease = "INCOMPATIBLE_RELEASE" => 409,
    AlreadyTerminal = "ALREADY_TERMINAL" => 409,
    NotWaiting = "NOT_WAITING" => 409,
    UnknownInteraction = "UNKNOWN_INTERACTION" => 404,
    /// The resume token does not match the interaction.
    InvalidToken = "INVALID_TOKEN" => 403,
    InteractionConflict = "INTERACTION_CONFLICT" => 409,
    AwaitExpired = "AWAIT_EXPIRED" => 409,
    /// A worker's reply without the reply token of the launch it names.
    Unauthenticated = "UNAUTHENTICATED" => 403,
    /// A message naming another pipeline, contract or release than the execution's pinned one.
    IdentityMismatch = "IDENTITY_MISMATCH" => 403,

    // Messages a queue consumer cannot process (the dead-letter reason attribute).
    Undecodable = "UNDECODABLE" => 400,
    Oversized = "OVERSIZED" => 413,
    UnknownKind = "UNKNOWN_KIND" => 400,

    // Step error codes written by the coordinator and the worker runtime (never an API status).
    /// An attempt had no reply by its deadline, its request re-sent once.
    StepTimeout = "STEP_TIMEOUT" => 500,
    /// An await unit's deadline passed with interactions open.
    AwaitTimeout = "AWAIT_TIMEOUT" => 500,
    /// An interaction was answered with a rejection.
    Rejected = "REJECTED" => 500,
    /// More of a fan-out's children failed than its step tolerates.
    FanOutFailed = "FAN_OUT_FAILED" => 500,
    /// A fan-out's items cannot be read: not an array, a line that is not JSON, a CSV row with
    /// another number of fields than its header.
    InvalidItems = "INVALID_ITEMS" => 500,
    /// The execution was cancelled (the reason is the message).
    Cancelled = "CANCELLED" => 500,
    /// The worker could not decode a step's input.
    UndecodableInput = "UNDECODABLE_INPUT" => 500,
    /// The step panicked or its task was aborted.
    StepCrashed = "STEP_CRASHED" => 500,
    /// The worker's reply could not be sent.
    ReplyFailed = "REPLY_FAILED" => 500,
    /// An incident: lifecycle events given up after repeated failed publications.
    EventsDropped = "EVENTS_DROPPED" => 500,
}

impl Code {
    /// Whether the same request may succeed later.
    pub const fn is_retryable(self) -> bool {
        self.http_status() == 503
    }

    /// The code of a text, if it is one of the catalogue's.
    pub fn parse(text: &str) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| c.as_str() == text)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Code {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl PartialEq<&str> for Code {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<Code> for &str {
    fn eq(&self, other: &Code) -> bool {
        *self == other.as_str()
    }
}

impl From<Code> for String {
    fn from(code: Code) -> String {
        code.as_str().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_code_is_distinct_and_screaming_snake_case() {
        let texts: BTreeSet<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(texts.len(), Code::ALL.len());
        for code in Code::ALL {
            let text = code.as_str();
            assert!(
                text.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
                "{text}"
            );
            assert_eq!(Code::parse(text), Some(*code));
        }
    }

    /// The API's documented status table names each code with the status the catalogue gives it,
    /// and every code the API can answer with (4xx, 503, and the documented 500s) is documented.
    #[test]
    fn openapi_status_table_matches_the_catalogue() {
        let spec = include_str!("../../../openapi.yaml");
        let mut documented = BTreeSet::new();
        for line in spec.lines().map(str::trim) {
            let Some(rest) = line.strip_prefix("| ") else {
                continue;
            };
            let Some((status, codes)) = rest.split_once(" | ") else {
                continue;
            };
            let Ok(status) = status.parse::<u16>() else {
                continue;
            };
            for (k, part) in codes.split('`').enumerate() {
                let named = k % 2 == 1 && part.chars().all(|c| c.is_ascii_uppercase() || c == '_');
                if named {
                    let code = Code::parse(part)
                        .unwrap_or_else(|| panic!("openapi.yaml names unknown code {part}"));
                    assert_eq!(code.http_status(), status, "{part}");
                    documented.insert(code);
                }
            }
        }
        let api_facing = [
            Code::InvalidBody,
            Code::InvalidId,
            Code::InvalidRequest,
            Code::InvalidRelease,
            Code::NoRoute,
            Code::NotServed,
            Code::MethodNotAllowed,
            Code::BodyTooLarge,
            Code::PayloadTooLarge,
            Code::PayloadUnavailable,
            Code::PayloadUnresolvable,
            Code::ReleaseConflict,
            Code::NotFinished,
            Code::NotSucceeded,
            Code::Internal,
            Code::NotFound,
            Code::UnknownRelease,
            Code::NoActiveRelease,
            Code::ReleaseDraining,
            Code::CorruptRecord,
            Code::StoreUnavailable,
            Code::Contention,
            Code::UnknownCorrelation,
            Code::ReceiptConflict,
            Code::VersionConflict,
            Code::NotRedrivable,
            Code::IncompatibleRelease,
            Code::AlreadyTerminal,
            Code::NotWaiting,
            Code::UnknownInteraction,
            Code::InvalidToken,
            Code::InteractionConflict,
            Code::AwaitExpired,
        ];
        for code in api_facing {
            assert!(
                documented.contains(&code),
                "{code} is not in openapi.yaml's status table"
            );
            assert!(
                spec.contains(&format!("- {code}\n")),
                "{code} is not in openapi.yaml's Error enum"
            );
        }
    }
}

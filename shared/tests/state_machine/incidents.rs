//! `Incident`: a message about the execution that went to a DLQ is noted on the record.

use stepline::domain::execution::{Incident, MAX_INCIDENTS};
use stepline::domain::history::{Entry, What};

use crate::fixtures::*;

#[test]
fn incident_is_noted_on_the_record_whatever_its_status_and_changes_nothing_else() {
    let m = Machine::of(three_steps());
    let (queued, _) = m.started();
    let at = T0 + 500_000;
    for record in [
        queued,
        m.running(),
        m.succeeded(),
        m.exhausted(),
        m.cancelled(),
    ] {
        let (next, actions) = m.commit(&record, at, 70, &incident("UNDECODABLE"));

        assert!(actions.is_empty());
        let mut expected = record.clone();
        expected.version += 1;
        expected.updated_at = ts(at);
        expected.incidents = vec![Incident {
            at: ts(at),
            code: "UNDECODABLE".to_string(),
            detail: "message m-1 on reply: UNDECODABLE".to_string(),
        }];
        expected.history.push(Entry {
            after_ms: at - record.created_at.millis(),
            what: What::Incident {
                code: "UNDECODABLE".into(),
            },
        });
        assert_eq!(next, expected, "incident on a {} execution", record.status);
    }
}

#[test]
fn incidents_keep_only_the_latest_ones() {
    let m = Machine::of(three_steps());
    let mut record = m.running();
    for i in 0..(MAX_INCIDENTS as u128 + 2) {
        let code = format!("I{i}");
        record = m
            .commit(&record, T0 + 1_000 + i as i64, 70 + i, &incident(&code))
            .0;
    }

    assert_eq!(MAX_INCIDENTS, 10);
    let codes: Vec<&str> = record.incidents.iter().map(|i| i.code.as_str()).collect();
    assert_eq!(
        codes,
        vec!["I2", "I3", "I4", "I5", "I6", "I7", "I8", "I9", "I10", "I11"]
    );
}

//! A message outbox's messages: mapped by their keys, or a dead letter with what could
//! be read.

use super::*;
use crate::outbox::MessageMapping;

fn message_outbox() -> MessageMapping {
    let c = walfold_config::Config::from_toml(
        "[source]\nurl = \"postgresql://h/db\"\n[[outbox]]\nmessage_prefix = \"orders\"\naggregate_id = \"aggregateId\"\n",
        vec![],
    )
    .unwrap();
    MessageMapping::new(&c.outbox[0]).unwrap()
}

#[test]
fn a_message_maps_by_its_keys() {
    let m = message_outbox();
    let e = m
        .map(
            format!(r#"{{"id": "{ID}", "aggregate_type": "order", "aggregateId": 12, "event_type": "Paid", "version": "3", "payload": {{"amount": 1.50}}, "headers": null, "occurred_at": "2026-11-30T02:25:48.5Z"}}"#).as_bytes(),
            tx(),
            None,
        )
        .unwrap();
    assert_eq!(e.id.to_string(), ID);
    assert_eq!(e.aggregate_id, "12");
    assert_eq!(e.version, Some(3));
    assert_eq!(e.payload.get("amount").unwrap().to_string(), "1.50");
    assert_eq!(e.headers, None);
    assert!(e.occurred_at.is_some());
}

#[test]
fn a_message_that_is_no_event_is_a_dead_letter_with_what_could_be_read() {
    let m = message_outbox();
    let cases = [
        ("{", "message content is not JSON"),
        ("\"x\"", "must be a JSON object, not a string"),
        (r#"{"aggregate_type": "a"}"#, "key `id` is missing"),
        (
            &format!(
                r#"{{"id": "{ID}", "aggregate_type": "a", "aggregateId": "1", "event_type": "T", "payload": null}}"#
            ),
            "key `payload` is null",
        ),
        (
            &format!(
                r#"{{"id": "{ID}", "aggregate_type": ["a"], "aggregateId": "1", "event_type": "T", "payload": {{}}}}"#
            ),
            "key `aggregate_type` must be a string or a number, not an array",
        ),
    ];
    for (content, error) in cases {
        let dl = m.map(content.as_bytes(), tx(), None).unwrap_err();
        assert!(dl.error.contains(error), "{content}: {}", dl.error);
        assert_eq!(dl.raw.as_ref().unwrap()["message_prefix"], "orders");
    }
    let dl = m
        .map(
            format!(r#"{{"id": "{ID}", "aggregateId": "o-1"}}"#).as_bytes(),
            tx(),
            None,
        )
        .unwrap_err();
    assert_eq!(dl.event_id.map(|u| u.to_string()).as_deref(), Some(ID));
    assert_eq!(dl.aggregate_id.as_deref(), Some("o-1"));
    assert_eq!(dl.raw.unwrap()["content"]["aggregateId"], "o-1");
    let good = format!(
        r#"{{"id": "{ID}", "aggregate_type": "a", "aggregateId": "1", "event_type": "T", "payload": {{}}}}"#
    );
    let dl = m.reject_nontransactional(good.as_bytes(), tx());
    assert!(
        dl.error.starts_with("emitted non-transactional"),
        "{}",
        dl.error
    );
    assert_eq!(dl.event_id.map(|u| u.to_string()).as_deref(), Some(ID));
}

//! What an outbox cannot take: too large, `\u0000` in JSON, a large object's column.

use walfold_event::Reason;

use super::*;
use crate::outbox::limits::has_nul_escape;
use crate::outbox::{Mapping, MessageMapping};

#[test]
fn a_row_over_the_size_limit_is_a_too_large_dead_letter_without_its_payload() {
    let payload = format!(r#"{{"blob": "{}"}}"#, "x".repeat(5000));
    let values = [
        Some(ID),
        Some("order"),
        Some("o-1"),
        Some("OrderPaid"),
        Some("3"),
        Some(payload.as_str()),
        None,
    ];
    let m = Mapping::new(&config(), &relation(COLS)).with_max_bytes(4096);
    let dead = m.map(&row(&values), tx(), None).unwrap_err();
    assert_eq!(dead.reason, Reason::TooLarge);
    assert_eq!(dead.event_id.unwrap().to_string(), ID);
    assert_eq!(dead.aggregate_id.as_deref(), Some("o-1"));
    assert!(
        dead.error.contains("over pipeline.max_event_bytes (4096)"),
        "{}",
        dead.error
    );
    let raw = dead.raw.unwrap();
    assert_eq!(raw["payload"], "<5012 bytes, left out>");
    assert_eq!(raw["aggregate_id"], "o-1");
    // Within the limit it is an event.
    let m = Mapping::new(&config(), &relation(COLS)).with_max_bytes(8192);
    assert!(m.map(&row(&values), tx(), None).made_event());
    // A message too.
    let c = walfold_config::Config::from_toml(
        "[source]\nurl = \"postgresql://h/db\"\n[[outbox]]\nmessage_prefix = \"m\"\n",
        vec![],
    )
    .unwrap();
    // Within it, the payload is taken as written.
    let m = MessageMapping::new(&c.outbox[0]).unwrap();
    let content = format!(
        r#"{{"id": "{ID}", "aggregate_type": "order", "aggregate_id": "o-1",
           "event_type": "Paid", "payload": {{ "a" : 1.50, "b": [1,2] }}}}"#
    );
    let e = m.map(content.as_bytes(), tx(), None).unwrap();
    assert_eq!(e.payload.as_str(), r#"{ "a" : 1.50, "b": [1,2] }"#);
    let m = MessageMapping::new(&c.outbox[0])
        .unwrap()
        .with_max_bytes(100);
    let dead = m.map(payload.as_bytes(), tx(), None).unwrap_err();
    assert_eq!(dead.reason, Reason::TooLarge);
    assert_eq!(dead.raw.unwrap()["content"], "<5012 bytes, left out>");
}

#[test]
fn only_a_real_nul_escape_is_refused() {
    // As JSON text: a NUL escape, with escaped backslashes before it, or not one at all.
    assert!(has_nul_escape(r#"{"a": "\u0000"}"#));
    assert!(
        has_nul_escape(r#"{"a": "x\\\u0000"}"#),
        "an escaped backslash, then an escape"
    );
    assert!(has_nul_escape(r#"{"\u0000": 1}"#));
    assert!(
        !has_nul_escape(r#"{"a": "\\u0000"}"#),
        "an escaped backslash, then u0000"
    );
    assert!(!has_nul_escape(r#"{"a": "\\\\u0000"}"#));
    assert!(!has_nul_escape(r#"{"a": "\u0001"}"#));
    assert!(!has_nul_escape(r#"{"a": "u0000\\"}"#));
    assert!(!has_nul_escape(""));

    let m = Mapping::new(&config(), &relation(COLS));
    let with = |payload: &'static str| {
        row(&[
            Some(ID),
            Some("a"),
            Some("1"),
            Some("T"),
            Some("1"),
            Some(payload),
            None,
        ])
    };
    let e = m
        .map(&with(r#"{"path": "C:\\u0000"}"#), tx(), None)
        .unwrap();
    assert_eq!(e.payload.get("path").unwrap(), "C:\\u0000");
    let dl = m
        .map(&with(r#"{"path": "\u0000"}"#), tx(), None)
        .unwrap_err();
    assert!(dl.error.contains("jsonb cannot store"), "{}", dl.error);
}

#[test]
fn a_field_read_from_a_large_object_is_refused_not_folded() {
    let mut cols = COLS.to_vec();
    assert!(Mapping::new(&config(), &relation(&cols))
        .unreadable()
        .is_none());
    cols[5].1 = oid::OID;
    let refusal = Mapping::new(&config(), &relation(&cols))
        .unreadable()
        .unwrap();
    assert!(
        refusal
            .problem
            .contains("column `payload` (outbox.payload) is of type oid"),
        "{}",
        refusal.problem
    );
    assert!(refusal.fix.contains("bytea"), "{}", refusal.fix);
}

//! A table outbox's rows: columns and expressions read, ids derived, `where` and
//! `expand` applied, a row that is no event a dead letter saying why.

use std::time::UNIX_EPOCH;

use walfold_event::{producer_event_id, Lsn, Reason, RowOrigin};
use walfold_pgoutput::oid;

use super::*;
use crate::outbox::{Mapped, Mapping};

#[test]
fn a_good_row_becomes_an_event() {
    let m = Mapping::new(&config(), &relation(COLS));
    let e = m
        .map(
            &row(&[
                Some(ID),
                Some("order"),
                Some("o-1"),
                Some("OrderPaid"),
                Some("3"),
                Some(r#"{"amount": "12.50"}"#),
                Some("2026-11-30 02:25:48.5+00"),
            ]),
            tx(),
            None,
        )
        .unwrap();
    assert_eq!(e.id.to_string(), ID);
    assert_eq!(e.version, Some(3));
    assert_eq!(e.payload.get("amount").unwrap(), "12.50");
    assert_eq!(e.source_lsn, Lsn(42));
    assert_eq!(
        e.occurred_at
            .unwrap()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros(),
        1_796_005_548_500_000
    );
    assert_eq!(e.headers, None);
}

#[test]
fn numbers_keep_every_digit() {
    let m = Mapping::new(&config(), &relation(COLS));
    let e = m
        .map(
            &row(&[
                Some(ID),
                Some("account"),
                Some("a-1"),
                Some("Credited"),
                None,
                Some(r#"{"amount": 12345678901234567890.123456789012, "n": 1e400}"#),
                None,
            ]),
            tx(),
            None,
        )
        .unwrap();
    assert_eq!(
        e.payload.get("amount").unwrap().to_string(),
        "12345678901234567890.123456789012"
    );
    assert_eq!(
        e.payload.get("n").unwrap().to_string(),
        "1e+400",
        "the value, not an f64 infinity"
    );
    assert_eq!(e.version, None);
}

#[test]
fn malformed_rows_become_dead_letters_with_reasons() {
    let m = Mapping::new(&config(), &relation(COLS));
    let cases: &[(&[Option<&str>], &str)] = &[
        (
            &[
                None,
                Some("a"),
                Some("1"),
                Some("T"),
                Some("1"),
                Some("{}"),
                None,
            ],
            "`id` is null",
        ),
        (
            &[
                Some(" "),
                Some("a"),
                Some("1"),
                Some("T"),
                Some("1"),
                Some("{}"),
                None,
            ],
            "column `id` is empty",
        ),
        (
            &[
                Some(ID),
                Some("a"),
                Some("1"),
                Some("T"),
                Some("1.5"),
                Some("{}"),
                None,
            ],
            "not an integer",
        ),
        (
            &[
                Some(ID),
                Some("a"),
                None,
                Some("T"),
                Some("1"),
                Some("{}"),
                None,
            ],
            "`aggregate_id` is null",
        ),
        (
            &[
                Some(ID),
                Some("a"),
                Some("1"),
                Some("T"),
                Some("1"),
                Some("{x"),
                None,
            ],
            "not JSON",
        ),
        (
            &[
                Some(ID),
                Some("a"),
                Some("1"),
                Some(" "),
                Some("1"),
                Some("{}"),
                None,
            ],
            "`event_type` is empty",
        ),
        (
            &[
                Some(ID),
                Some(""),
                Some("1"),
                Some("T"),
                Some("1"),
                Some("{}"),
                None,
            ],
            "`aggregate_type` is empty",
        ),
        (
            &[
                Some(ID),
                Some("a"),
                Some("1"),
                Some("T"),
                Some("1"),
                Some("null"),
                None,
            ],
            "`payload` is null",
        ),
        (
            &[
                Some(ID),
                Some("a"),
                Some("1"),
                Some("T"),
                Some("1"),
                Some("{}"),
                Some("0044-03-15 12:00:00+00 BC"),
            ],
            "`occurred_at` is a BC date",
        ),
    ];
    for (vals, reason) in cases {
        let dl = m.map(&row(vals), tx(), None).unwrap_err();
        assert_eq!(dl.reason, Reason::Malformed);
        assert!(dl.error.contains(reason), "{} vs {reason}", dl.error);
        assert!(dl.raw.as_ref().unwrap().get("payload").is_some());
    }
}

#[test]
fn a_timestamp_without_time_zone_column_is_read_as_utc() {
    let mut cols = COLS.to_vec();
    cols[6].1 = oid::TIMESTAMP;
    let m = Mapping::new(&config(), &relation(&cols));
    let e = m
        .map(
            &row(&[
                Some(ID),
                Some("a"),
                Some("1"),
                Some("T"),
                None,
                Some("{}"),
                Some("2026-11-30 02:25:48.5"),
            ]),
            tx(),
            None,
        )
        .unwrap();
    let us = e
        .occurred_at
        .unwrap()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros();
    assert_eq!(us, 1_796_005_548_500_000);
}

/// A table outbox mapped by `fields` (TOML lines), over `cols`.
fn mapping(fields: &str, cols: &[(&str, u32)]) -> Mapping {
    let c = walfold_config::Config::from_toml(
        &format!(
            "[source]\nurl = \"postgresql://h/db\"\n[[outbox]]\ntable = \"outbox\"\n{fields}\n"
        ),
        vec![],
    )
    .unwrap_or_else(|e| panic!("{fields}: {e}"));
    Mapping::new(&c.outbox[0], &relation(cols))
}

const TEXT_COLS: &[(&str, u32)] = &[
    ("MessageId", oid::VARCHAR),
    ("stream", oid::TEXT),
    ("kind", oid::TEXT),
    ("body", oid::BYTEA),
    ("position", oid::INT8),
    ("keep", oid::BOOL),
];

/// `body` as pgoutput sends a bytea: `\x` and hex.
fn hex(text: &str) -> String {
    format!(
        "\\x{}",
        text.bytes().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

const TEXT_FIELDS: &str = "id = \"MessageId\"\naggregate_id = \"stream\"\nevent_type = \"kind\"\npayload = \"body\"\nversion = \"position\"";

#[test]
fn an_id_that_is_no_uuid_is_derived_and_kept_as_the_producers() {
    let m = mapping(TEXT_FIELDS, TEXT_COLS);
    let body = hex(r#"{"n": 1}"#);
    let map = |id: &str| {
        let values = [
            Some(id),
            Some("s-1"),
            Some("Made"),
            Some(body.as_str()),
            Some("7"),
            None,
        ];
        m.map(&row(&values), tx(), None).unwrap()
    };
    let e = map("4b81771282e2cebe-db34f0492c9853ef");
    assert_eq!(
        e.id,
        producer_event_id("public.outbox", &["4b81771282e2cebe-db34f0492c9853ef"])
    );
    assert_eq!(
        e.producer_id.as_deref(),
        Some("4b81771282e2cebe-db34f0492c9853ef")
    );
    assert_eq!(
        map("4b81771282e2cebe-db34f0492c9853ef").id,
        e.id,
        "the same value, the same ID"
    );
    assert_ne!(map("4b81771282e2cebe-db34f0492c9853f0").id, e.id);
    // A UUID in text is the ID itself, as before.
    let u = map(ID);
    assert_eq!(u.id.to_string(), ID);
    assert_eq!(u.producer_id, None);
    // Read from bytea: UTF-8 JSON.
    assert_eq!(e.payload.get("n").unwrap(), 1);
    // aggregate_type left out, no such column: the table's name.
    assert_eq!(e.aggregate_type, "outbox");
    assert_eq!(e.version, Some(7));
}

#[test]
fn a_composite_id_is_the_json_array_of_its_parts_and_a_null_part_is_a_dead_letter() {
    let m = mapping(
        "id = [\"stream\", \"position\"]\naggregate_id = \"stream\"\nevent_type = \"kind\"\npayload = \"body\"\naggregate_type = \"'stream'\"",
        TEXT_COLS,
    );
    let body = hex("{}");
    let e = m
        .map(
            &row(&[
                None,
                Some("s-1"),
                Some("Made"),
                Some(&body),
                Some("3"),
                None,
            ]),
            tx(),
            None,
        )
        .unwrap();
    assert_eq!(e.producer_id.as_deref(), Some(r#"["s-1","3"]"#));
    assert_eq!(e.id, producer_event_id("public.outbox", &["s-1", "3"]));
    assert_eq!(e.aggregate_type, "stream", "a constant");
    // No part's text can make another composite's: ["a-b","c"] is not ["a","b-c"].
    let dl = m
        .map(
            &row(&[None, Some("s-1"), Some("Made"), Some(&body), None, None]),
            tx(),
            None,
        )
        .unwrap_err();
    assert!(
        dl.error.contains("id[1] column `position` is null"),
        "{}",
        dl.error
    );
}

#[test]
fn bytes_that_are_not_utf8_json_are_a_dead_letter_saying_so() {
    let m = mapping(TEXT_FIELDS, TEXT_COLS);
    for (body, error) in [
        ("\\xff00".to_owned(), "not UTF-8"),
        (hex("not json"), "not JSON"),
        ("plain".to_owned(), "not in hex format"),
    ] {
        let dl = m
            .map(
                &row(&[Some(ID), Some("s"), Some("K"), Some(&body), None, None]),
                tx(),
                None,
            )
            .unwrap_err();
        assert!(dl.error.contains("column `body`"), "{}", dl.error);
        assert!(dl.error.contains(error), "{} vs {error}", dl.error);
    }
}

#[test]
fn where_keeps_the_rows_it_is_true_for() {
    let m = mapping(&format!("{TEXT_FIELDS}\nwhere = \"keep\""), TEXT_COLS);
    let body = hex("{}");
    let with = |keep: Option<&'static str>| {
        m.map(
            &row(&[Some(ID), Some("s"), Some("K"), Some(&body), None, keep]),
            tx(),
            None,
        )
    };
    assert!(with(Some("t")).made_event());
    assert!(matches!(with(Some("f")), Mapped::Filtered));
    assert!(matches!(with(None), Mapped::Filtered), "null is not true");
    // A where that is no boolean dead-letters the row, never drops it.
    let m = mapping(&format!("{TEXT_FIELDS}\nwhere = \"stream\""), TEXT_COLS);
    let dl = m
        .map(
            &row(&[Some(ID), Some("s"), Some("K"), Some(&body), None, None]),
            tx(),
            None,
        )
        .unwrap_err();
    assert!(
        dl.error.contains("where (`\"stream\"`) is not a boolean"),
        "{}",
        dl.error
    );
}

#[test]
fn a_bad_elements_dead_letter_keeps_the_element_not_the_whole_array_again() {
    let cols = &[("ref", oid::TEXT), ("ops", oid::JSONB)];
    let m = mapping(
        "expand = \"ops\"\nid = \"element->>'id'\"\naggregate_id = \"'a-1'\"\naggregate_type = \"'a'\"\nevent_type = \"'E'\"\npayload = \"element\"",
        cols,
    );
    let ops = serde_json::to_string(
        &(0..500)
            .map(|n| serde_json::json!({ "n": n }))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let out: Vec<_> = m
        .map(&row(&[Some("r-1"), Some(&ops)]), tx(), None)
        .into_iter()
        .collect();
    assert_eq!(out.len(), 500);
    let raw_bytes: usize = out
        .iter()
        .map(|o| {
            o.as_ref()
                .unwrap_err()
                .raw
                .as_ref()
                .unwrap()
                .to_string()
                .len()
        })
        .sum();
    // Linear in the row: each letter holds its element and the row's small values.
    assert!(raw_bytes < 200 * 500, "{raw_bytes} bytes of raw rows");
    let raw = out[7].as_ref().unwrap_err().raw.clone().unwrap();
    assert_eq!(raw["ref"], "r-1");
    assert_eq!(raw["element"]["index"], 7);
    assert_eq!(raw["element"]["value"], serde_json::json!({ "n": 7 }));
    assert!(
        raw["ops"].as_str().unwrap().ends_with("bytes, left out>"),
        "{raw}"
    );
}

#[test]
fn expand_makes_one_event_per_element_and_a_bad_element_loses_no_other() {
    let cols = &[("ops", oid::JSONB), ("at", oid::TIMESTAMPTZ)];
    let m = mapping(
        "expand = \"ops\"\nid = \"element\"\naggregate_id = \"'a-1'\"\naggregate_type = \"'a'\"\nevent_type = \"'E'\"\npayload = \"element\"",
        cols,
    );
    let ops = format!(r#"["{ID}", 42, null, "x"]"#);
    let origin = RowOrigin::Wal {
        lsn: Lsn(7),
        index: 2,
        element: 0,
    };
    let out: Vec<_> = m
        .map(&row(&[Some(&ops), None]), tx(), Some(origin))
        .into_iter()
        .collect();
    assert_eq!(out.len(), 4);
    let e0 = out[0].as_ref().unwrap();
    // `element` is jsonb: its text form is JSON, as `element::text` in PostgreSQL.
    assert_eq!(
        e0.producer_id.as_deref(),
        Some(format!("\"{ID}\"").as_str())
    );
    assert_eq!(out[1].as_ref().unwrap().producer_id.as_deref(), Some("42"));
    let dl = out[2].as_ref().unwrap_err();
    assert!(dl.error.starts_with("element 2: "), "{}", dl.error);
    assert_eq!(dl.raw.as_ref().unwrap()["element"]["index"], 2);
    assert!(out[3].is_ok());
    // Each element has an origin of its own: their dead letters are recorded apart.
    let origins: Vec<_> = out
        .iter()
        .map(|o| match o {
            Ok(e) => e.origin,
            Err(d) => d.origin,
        })
        .collect();
    assert_eq!(
        origins[2],
        Some(RowOrigin::Wal {
            lsn: Lsn(7),
            index: 2,
            element: 2
        })
    );
    assert_ne!(origins[0], origins[1]);
    // Not an array: the row is one dead letter.
    for (ops, error) in [
        (r#"{"a": 1}"#, "is an object, not a JSON array"),
        ("[1", "invalid input syntax for type json"),
    ] {
        let dl = m.map(&row(&[Some(ops), None]), tx(), None).unwrap_err();
        assert!(dl.error.contains(error), "{} vs {error}", dl.error);
        assert!(dl.error.starts_with("expand (`\"ops\"`)"), "{}", dl.error);
    }
    // Null: no elements to make events of, said as for any other value.
    let dl = m.map(&row(&[None, None]), tx(), None).unwrap_err();
    assert!(
        dl.error.contains("is null, not a JSON array"),
        "{}",
        dl.error
    );
    // An empty array: no events.
    assert_eq!(
        m.map(&row(&[Some("[]"), None]), tx(), None)
            .into_iter()
            .count(),
        0
    );
}

#[test]
fn an_expression_reading_a_column_the_table_lacks_is_missing_not_a_dead_letter() {
    let m = mapping(
        &format!("{TEXT_FIELDS}\naggregate_type = '\"Kind\"'"),
        TEXT_COLS,
    );
    assert_eq!(
        m.missing_required(),
        Some(("aggregate_type", "Kind".into()))
    );
    let m = mapping(TEXT_FIELDS, TEXT_COLS);
    assert_eq!(m.missing_required(), None);
    // An expression reading a large object is refused like a column.
    let mut cols = TEXT_COLS.to_vec();
    cols[1].1 = oid::OID;
    let m = mapping(
        "id = \"MessageId\"\naggregate_id = '\"stream\"'\nevent_type = \"kind\"\npayload = \"body\"",
        &cols,
    );
    let refusal = m.unreadable().unwrap();
    assert!(
        refusal
            .problem
            .contains("column `stream` (outbox.aggregate_id)"),
        "{}",
        refusal.problem
    );
}

#[test]
fn expressions_read_where_each_field_sits_and_a_failing_one_dead_letters_its_row() {
    let cols = &[
        ("stream_name", oid::TEXT),
        ("type", oid::TEXT),
        ("Body", oid::TEXT),
        ("data64", oid::TEXT),
        ("position", oid::INT8),
    ];
    let m = mapping(
        r#"id = ["stream_name", "position"]
aggregate_type = "message_store.category(stream_name)"
aggregate_id = "split_part(stream_name, '-', 2)"
event_type = "\"Body\"::jsonb->'message'->>'kind'"
version = "position::bigint"
payload = "convert_from(decode(data64, 'base64'), 'UTF8')"
headers = "\"Body\"::jsonb->'headers'"
where = "type <> 'Ignored'""#,
        cols,
    );
    assert_eq!(m.missing_required(), None);
    let body = r#"{"message": {"kind": "Paid"}, "headers": {"h": 1}}"#;
    let e = m
        .map(
            &row(&[
                Some("account-123"),
                Some("T"),
                Some(body),
                Some("eyJuIjogMX0="),
                Some("4"),
            ]),
            tx(),
            None,
        )
        .unwrap();
    assert_eq!(
        (
            e.aggregate_type.as_str(),
            e.aggregate_id.as_str(),
            e.event_type.as_str()
        ),
        ("account", "123", "Paid")
    );
    assert_eq!(e.version, Some(4));
    assert_eq!(e.payload.get("n").unwrap(), 1);
    assert_eq!(e.headers.unwrap().get("h").unwrap(), 1);
    assert_eq!(e.producer_id.as_deref(), Some(r#"["account-123","4"]"#));
    assert!(matches!(
        m.map(
            &row(&[
                Some("account-123"),
                Some("Ignored"),
                Some(body),
                Some("e30="),
                Some("4")
            ]),
            tx(),
            None
        ),
        Mapped::Filtered
    ));
    // Invalid base64 and invalid JSON: the row's dead letter names the key, the
    // expression and what failed.
    let dl = m
        .map(
            &row(&[
                Some("account-1"),
                Some("T"),
                Some(body),
                Some("%%%"),
                Some("4"),
            ]),
            tx(),
            None,
        )
        .unwrap_err();
    assert!(
        dl.error
            .starts_with("payload (`convert_from(decode(data64, 'base64'), 'UTF8')`): "),
        "{}",
        dl.error
    );
    let dl = m
        .map(
            &row(&[
                Some("account-1"),
                Some("T"),
                Some("{oops"),
                Some("e30="),
                Some("4"),
            ]),
            tx(),
            None,
        )
        .unwrap_err();
    assert!(
        dl.error
            .contains("event_type (`\"Body\"::jsonb->'message'->>'kind'`): "),
        "{}",
        dl.error
    );
    assert_eq!(
        dl.aggregate_id.as_deref(),
        Some("1"),
        "what could be read is kept"
    );
}

#[test]
fn expand_reads_each_element_by_the_pseudo_column() {
    let cols = &[("MessageId", oid::VARCHAR), ("Operations", oid::JSONB)];
    let m = mapping(
        r#"expand = '"Operations"'
id = "element->>'MessageId'"
aggregate_type = "'sales'"
aggregate_id = "element->'Headers'->>'Order'"
event_type = "element->>'MessageType'"
payload = "convert_from(decode(element->>'Body', 'base64'), 'UTF8')""#,
        cols,
    );
    assert_eq!(m.missing_required(), None);
    let ops = r#"[
        {"MessageId": "m-1", "MessageType": "Placed", "Headers": {"Order": "o-1"}, "Body": "eyJhIjogMX0="},
        {"MessageId": "m-2", "MessageType": "Billed", "Headers": {"Order": "o-1"}, "Body": "bm90IGpzb24="}
    ]"#;
    let out: Vec<_> = m
        .map(&row(&[Some("outer"), Some(ops)]), tx(), None)
        .into_iter()
        .collect();
    let e = out[0].as_ref().unwrap();
    assert_eq!(e.producer_id.as_deref(), Some("m-1"));
    assert_eq!(
        (e.aggregate_id.as_str(), e.event_type.as_str()),
        ("o-1", "Placed")
    );
    assert_eq!(e.payload.get("a").unwrap(), 1);
    let dl = out[1].as_ref().unwrap_err();
    assert!(dl.error.starts_with("element 1: payload"), "{}", dl.error);
    assert!(dl.error.contains("not JSON"), "{}", dl.error);
    assert_eq!(
        dl.event_id,
        Some(producer_event_id("public.outbox", &["m-2"]))
    );
}

#[test]
fn a_missing_required_column_is_a_dead_letter_not_a_crash() {
    let m = Mapping::new(&config(), &relation(&COLS[..3]));
    let dl = m
        .map(&row(&[Some(ID), Some("a"), Some("1")]), tx(), None)
        .unwrap_err();
    assert!(
        dl.error.contains("has no column `event_type`"),
        "{}",
        dl.error
    );
    assert_eq!(
        m.missing_required(),
        Some(("event_type", "event_type".into()))
    );
    let full = Mapping::new(&config(), &relation(COLS));
    assert_eq!(full.missing_required(), None);
}

#[test]
fn a_where_of_the_config_narrows_the_presets_and_never_replaces_it() {
    // Eventuate Tram: the preset keeps domain events (headers with an event-type), the
    // config one destination's.
    let cols = &[
        ("id", oid::VARCHAR),
        ("destination", oid::TEXT),
        ("headers", oid::TEXT),
        ("payload", oid::TEXT),
        ("published", oid::INT2),
        ("creation_time", oid::INT8),
    ];
    let m = mapping(
        "preset = \"eventuate_tram\"\nwhere = \"destination = 'orders'\"",
        cols,
    );
    let headers = |event: bool| {
        let mut h =
            r#"{"ID":"0000018b2c4e6a1f-e6a1f0000000000a","DESTINATION":"orders""#.to_owned();
        if event {
            h.push_str(r#","event-type":"OrderCreated","event-aggregate-type":"Order","event-aggregate-id":"1""#);
        } else {
            h.push_str(r#","command_type":"ReserveCredit","command_reply_to":"orders-reply""#);
        }
        h.push('}');
        h
    };
    let (event, command) = (headers(true), headers(false));
    let with = |destination: &'static str, headers: &str| {
        m.map(
            &row(&[
                Some("0000018b2c4e6a1f-e6a1f0000000000a"),
                Some(destination),
                Some(headers),
                Some("{}"),
                Some("0"),
                Some("1"),
            ]),
            tx(),
            None,
        )
    };
    assert!(with("orders", &event).made_event());
    assert!(
        matches!(with("orders", &command), Mapped::Filtered),
        "the preset's filter (domain events only) was lost"
    );
    assert!(matches!(with("customers", &event), Mapped::Filtered));
}

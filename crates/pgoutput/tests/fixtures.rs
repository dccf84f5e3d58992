//! Decodes byte fixtures captured from a real PostgreSQL 15 and checks every decoded field.
//!
//! # How the fixtures were captured
//!
//! `tests/fixtures/*.hex` hold one pgoutput message per line as lowercase hex,
//! each preceded by a `#` comment line naming the message and the step that
//! produced it; each step starts with `# === step:`, `# SQL:` and
//! `# captured with:` lines. They were produced by `tests/fixtures/capture.py`
//! against a throwaway PostgreSQL 15.20 cluster:
//!
//! ```text
//! mkdir /tmp/pgo-fix && chown postgres /tmp/pgo-fix
//! runuser -u postgres -- /usr/lib/postgresql/15/bin/initdb -D /tmp/pgo-fix/data -U postgres -A trust
//! runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D /tmp/pgo-fix/data \
//!     -o "-p 55499 -k /tmp/pgo-fix -c wal_level=logical -c logical_decoding_work_mem=64kB" \
//!     -l /tmp/pgo-fix/log start
//! python3 crates/pgoutput/tests/fixtures/capture.py /tmp/pgo-fix 55499
//! ```
//!
//! Each step gets a fresh `pgoutput` slot (publication `pub` for all tables).
//! The `v1_*` steps run their SQL, then read the slot with
//! `pg_logical_slot_peek_binary_changes('fix', NULL, NULL, 'proto_version', '1',
//! 'publication_names', 'pub', 'messages', 'true')` (plus `'binary', 'true'` for
//! `v1_binary`) in a session with the noted `TimeZone`, and store
//! `encode(data, 'hex')` of each row. The `v2_*` steps stream the slot over a
//! real replication connection (`START_REPLICATION ... (proto_version '2',
//! streaming 'on', ...)`) while the SQL runs, because PostgreSQL only streams a
//! transaction, and sends Stream Abort for it, while it is in progress; the
//! 700-row transactions exceed `logical_decoding_work_mem` (64kB).

mod common;

use common::{decode_all, load, FIXTURES};
use walfold_pgoutput::{
    decode, oid, parse_text, Column, DecodeError, Message, Relation, Truncate, Tuple, Value,
};

/// Microseconds from the Unix epoch to PostgreSQL's epoch (2000-01-01).
const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

/// `2026-11-30 02:25:48.123456+00` as microseconds since the Unix epoch.
const OCCURRED_AT_ROW1: i64 = 1_796_005_548_123_456;
/// `1850-01-01 12:00:00.5+05:53:28` (Asia/Kolkata local mean time).
const OCCURRED_AT_LMT: i64 = -3_786_803_607_500_000;

/// Parses column `name` of `tuple` with the type OID the relation declares for it.
fn value<'a>(rel: &Relation, tuple: &Tuple<'a>, name: &str) -> Option<Value<'a>> {
    let index = rel
        .columns
        .iter()
        .position(|c| c.name == name)
        .unwrap_or_else(|| panic!("no column {name}"));
    match tuple.columns.get(index).expect("tuple has every column") {
        Column::Null => None,
        Column::Text(raw) => {
            let type_oid = rel.columns.get(index).expect("column").type_oid;
            Some(parse_text(type_oid, raw).unwrap_or_else(|e| panic!("{name}: {e}")))
        }
        other => panic!("{name}: unexpected {other:?}"),
    }
}

fn uuid(text: &str) -> Value<'static> {
    let hex: String = text.chars().filter(|&c| c != '-').collect();
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(i * 2..i * 2 + 2).expect("32 digits"), 16).expect("hex");
    }
    Value::Uuid(out)
}

fn relations<'m>(messages: &'m [(bool, Message<'_>)]) -> Vec<&'m Relation> {
    messages
        .iter()
        .filter_map(|(_, m)| match m {
            Message::Relation(r) => Some(r),
            _ => None,
        })
        .collect()
}

#[test]
fn every_fixture_decodes_and_every_prefix_fails() {
    let mut total = 0;
    for name in FIXTURES {
        let raw = load(name);
        let decoded = decode_all(&raw);
        total += decoded.len();
        for ((in_stream, _), buf) in decoded.iter().zip(&raw) {
            for len in 0..buf.len() {
                let prefix = buf.get(..len).expect("in range");
                assert!(
                    decode(prefix, *in_stream).is_err(),
                    "{name}: prefix of {len}/{} bytes decoded",
                    buf.len()
                );
            }
            let mut longer = buf.clone();
            longer.push(0);
            assert!(
                matches!(
                    decode(&longer, *in_stream),
                    Err(DecodeError::TrailingBytes { .. })
                ),
                "{name}: trailing byte accepted"
            );
        }
    }
    assert!(total > 1500, "only {total} messages");
}

#[test]
fn transactions_are_framed_by_matching_begin_and_commit() {
    for name in FIXTURES.iter().filter(|n| n.starts_with("v1_")) {
        let raw = load(name);
        let mut open: Option<(u64, i64)> = None;
        let mut xids = Vec::new();
        for (in_stream, message) in decode_all(&raw) {
            assert!(!in_stream);
            match message {
                Message::Begin(b) => {
                    assert!(open.is_none(), "{name}: nested begin");
                    assert!(!xids.contains(&b.xid), "{name}: xid reused");
                    xids.push(b.xid);
                    open = Some((b.final_lsn, b.commit_time));
                }
                Message::Commit(c) => {
                    let (final_lsn, commit_time) = open.take().expect("commit without begin");
                    assert_eq!(c.flags, 0);
                    assert_eq!(c.commit_lsn, final_lsn, "{name}");
                    assert_eq!(c.commit_time, commit_time, "{name}");
                    assert!(c.end_lsn > c.commit_lsn);
                }
                Message::LogicalMessage(m) if !m.transactional => {
                    assert!(
                        open.is_none(),
                        "{name}: non-transactional message in a transaction"
                    );
                }
                Message::StreamStart(_)
                | Message::StreamStop
                | Message::StreamCommit(_)
                | Message::StreamAbort(_) => panic!("{name}: stream message in protocol v1"),
                other => {
                    assert!(open.is_some(), "{name}: {other:?} outside a transaction");
                    let xid = match &other {
                        Message::Relation(r) => r.xid,
                        Message::Type(t) => t.xid,
                        Message::Insert(i) => i.xid,
                        Message::Update(u) => u.xid,
                        Message::Delete(d) => d.xid,
                        Message::Truncate(t) => t.xid,
                        Message::LogicalMessage(m) => m.xid,
                        _ => None,
                    };
                    assert_eq!(xid, None, "{name}: xid outside a stream");
                }
            }
        }
        assert!(open.is_none(), "{name}: unterminated transaction");
    }
}

#[test]
fn outbox_relation_schema() {
    let raw = load("v1_insert");
    let decoded = decode_all(&raw);
    let rels = relations(&decoded);
    assert_eq!(rels.len(), 4, "one Relation per peek session");
    let rel = rels.first().expect("relation");
    assert_eq!(rel.namespace, "public");
    assert_eq!(rel.name, "outbox");
    assert_eq!(rel.replica_identity, b'd');
    let expected = [
        ("id", oid::UUID, 1),
        ("aggregate_type", oid::TEXT, 0),
        ("aggregate_id", oid::TEXT, 0),
        ("event_type", oid::TEXT, 0),
        ("version", oid::INT8, 0),
        ("payload", oid::JSONB, 0),
        ("headers", oid::JSONB, 0),
        ("occurred_at", oid::TIMESTAMPTZ, 0),
        ("amount", oid::NUMERIC, 0),
        ("flag", oid::BOOL, 0),
        ("small", oid::INT2, 0),
        ("vc", oid::VARCHAR, 0),
    ];
    assert_eq!(rel.columns.len(), expected.len());
    for (col, (name, type_oid, flags)) in rel.columns.iter().zip(expected) {
        assert_eq!(col.name, name);
        assert_eq!(col.type_oid, type_oid, "{name}");
        assert_eq!(col.flags, flags, "{name}");
        // varchar(20) has typmod 20 + VARHDRSZ.
        let typmod = if name == "vc" { 24 } else { -1 };
        assert_eq!(col.type_modifier, typmod, "{name}");
    }
    assert!(
        rels.iter().all(|r| r == rel),
        "identical schema in every session"
    );
}

#[test]
fn outbox_inserts_parse_to_typed_values() {
    let raw = load("v1_insert");
    let decoded = decode_all(&raw);
    let rel = *relations(&decoded).first().expect("relation");
    let inserts: Vec<_> = decoded
        .iter()
        .filter_map(|(_, m)| match m {
            Message::Insert(i) => Some(i),
            _ => None,
        })
        .collect();
    assert_eq!(inserts.len(), 6);
    for insert in &inserts {
        assert_eq!(insert.relation_id, rel.id);
        assert_eq!(insert.xid, None);
        assert_eq!(insert.new.columns.len(), 12);
    }
    let row = |i: usize, col: &str| value(rel, &inserts.get(i).expect("insert").new, col);

    // Full row, TimeZone=UTC.
    assert_eq!(
        row(0, "id"),
        Some(uuid("5f0c6c1e-8a3b-4d2e-9f10-0123456789ab"))
    );
    assert_eq!(row(0, "aggregate_type"), Some(Value::Text("order")));
    assert_eq!(row(0, "aggregate_id"), Some(Value::Text("o-42")));
    assert_eq!(row(0, "event_type"), Some(Value::Text("OrderPlaced")));
    assert_eq!(row(0, "version"), Some(Value::Int(7)));
    // jsonb is normalized by PostgreSQL (keys sorted by length, then bytes).
    assert_eq!(
        row(0, "payload"),
        Some(Value::Json(r#"{"items": [1, 2], "total": 12.50}"#))
    );
    assert_eq!(row(0, "headers"), Some(Value::Json(r#"{"trace": "abc"}"#)));
    assert_eq!(
        row(0, "occurred_at"),
        Some(Value::Timestamptz(OCCURRED_AT_ROW1))
    );
    assert_eq!(row(0, "amount"), Some(Value::Numeric("12345.6789")));
    assert_eq!(row(0, "flag"), Some(Value::Bool(true)));
    assert_eq!(row(0, "small"), Some(Value::Int(-3)));
    assert_eq!(row(0, "vc"), Some(Value::Text("short")));

    // Row with NULLs; uuid was inserted uppercase; TimeZone=America/Los_Angeles.
    assert_eq!(
        row(1, "id"),
        Some(uuid("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"))
    );
    assert_eq!(row(1, "version"), Some(Value::Int(i64::MIN)));
    assert_eq!(row(1, "payload"), Some(Value::Json("null")));
    assert_eq!(row(1, "headers"), None);
    // Sent as "1999-01-08 04:05:06-08".
    assert_eq!(
        row(1, "occurred_at"),
        Some(Value::Timestamptz(915_797_106_000_000))
    );
    assert_eq!(row(1, "amount"), Some(Value::Numeric("NaN")));
    for col in ["flag", "small", "vc"] {
        assert_eq!(row(1, col), None, "{col}");
    }

    // Extremes; TimeZone=Asia/Kolkata prints 1850 in local mean time (+05:53:28).
    assert_eq!(row(2, "id"), Some(Value::Uuid([0; 16])));
    assert_eq!(row(2, "version"), Some(Value::Int(i64::MAX)));
    assert_eq!(row(2, "payload"), Some(Value::Json("[]")));
    assert_eq!(row(2, "headers"), Some(Value::Json("{}")));
    assert_eq!(
        row(2, "occurred_at"),
        Some(Value::Timestamptz(OCCURRED_AT_LMT))
    );
    assert_eq!(row(2, "amount"), Some(Value::Numeric("-0.000001")));
    assert_eq!(row(2, "flag"), Some(Value::Bool(false)));
    assert_eq!(row(2, "small"), Some(Value::Int(32767)));
    assert_eq!(row(2, "vc"), Some(Value::Text("twenty chars exactly")));

    // One transaction, three rows; TimeZone=Asia/Kathmandu (+05:45).
    assert_eq!(row(3, "id"), Some(Value::Uuid([0xff; 16])));
    assert_eq!(row(3, "occurred_at"), Some(Value::Timestamptz(i64::MAX)));
    assert_eq!(row(3, "amount"), Some(Value::Numeric("Infinity")));
    assert_eq!(row(3, "payload"), Some(Value::Json("\"s\"")));
    assert_eq!(row(3, "small"), Some(Value::Int(-32768)));
    assert_eq!(row(3, "vc"), Some(Value::Text("")));
    // Inserted as 2026-11-30 02:25:48.5+00, sent as "2026-11-30 08:10:48.5+05:45".
    assert_eq!(
        row(4, "occurred_at"),
        Some(Value::Timestamptz(1_796_005_548_500_000))
    );
    assert_eq!(row(4, "amount"), Some(Value::Numeric("-Infinity")));
    assert_eq!(row(5, "occurred_at"), Some(Value::Timestamptz(i64::MIN)));
    assert_eq!(row(5, "event_type"), Some(Value::Text("UserMerged")));
    assert_eq!(row(5, "version"), None);
}

#[test]
fn updates_and_deletes_with_default_and_full_identity() {
    let raw = load("v1_update_delete");
    let decoded = decode_all(&raw);
    let rels = relations(&decoded);
    let default = *rels.first().expect("relation");
    let full = *rels.last().expect("relation");
    assert_eq!(default.replica_identity, b'd');
    assert_eq!(full.replica_identity, b'f');
    assert_eq!(full.id, default.id);
    assert!(
        full.columns.iter().all(|c| c.flags == 1),
        "full identity: all key"
    );

    let changes: Vec<_> = decoded
        .iter()
        .filter(|(_, m)| matches!(m, Message::Update(_) | Message::Delete(_)))
        .map(|(_, m)| m)
        .collect();
    let [Message::Update(plain), Message::Update(key), Message::Delete(del_key), Message::Update(upd_full), Message::Delete(del_full)] =
        changes.as_slice()
    else {
        panic!("unexpected change sequence {changes:?}")
    };

    // Non-key update: no old tuple.
    assert_eq!(plain.old, None);
    assert!(!plain.key_only);
    assert_eq!(
        value(default, &plain.new, "event_type"),
        Some(Value::Text("OrderPaid"))
    );
    assert_eq!(value(default, &plain.new, "version"), Some(Value::Int(8)));

    // Key update: old key ('K') has only the key column.
    assert!(key.key_only);
    let old = key.old.as_ref().expect("old key");
    assert_eq!(
        value(default, old, "id"),
        Some(uuid("5f0c6c1e-8a3b-4d2e-9f10-0123456789ab"))
    );
    assert!(old.columns.iter().skip(1).all(|c| *c == Column::Null));
    assert_eq!(
        value(default, &key.new, "id"),
        Some(uuid("5f0c6c1e-8a3b-4d2e-9f10-0123456789ac"))
    );

    // Delete with default identity: key only.
    assert!(del_key.key_only);
    assert_eq!(
        value(default, &del_key.old, "id"),
        Some(uuid("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"))
    );
    assert!(del_key
        .old
        .columns
        .iter()
        .skip(1)
        .all(|c| *c == Column::Null));

    // Replica identity full: whole old row ('O').
    assert!(!upd_full.key_only);
    let old = upd_full.old.as_ref().expect("old row");
    assert_eq!(value(full, old, "flag"), Some(Value::Bool(false)));
    assert_eq!(value(full, &upd_full.new, "flag"), Some(Value::Bool(true)));
    // Same instant as inserted, now printed in UTC: "1850-01-01 06:06:32.5+00".
    assert_eq!(
        value(full, old, "occurred_at"),
        Some(Value::Timestamptz(OCCURRED_AT_LMT))
    );
    assert_eq!(value(full, old, "aggregate_id"), Some(Value::Text("u-1")));

    assert!(!del_full.key_only);
    assert_eq!(
        value(full, &del_full.old, "aggregate_id"),
        Some(Value::Text("u-2"))
    );
    assert_eq!(value(full, &del_full.old, "headers"), None);
    assert_eq!(
        value(full, &del_full.old, "occurred_at"),
        Some(Value::Timestamptz(i64::MAX))
    );
}

#[test]
fn truncates() {
    let raw = load("v1_truncate");
    let decoded = decode_all(&raw);
    let rels = relations(&decoded);
    let id_of = |name: &str| rels.iter().find(|r| r.name == name).expect("relation").id;
    let truncates: Vec<_> = decoded
        .iter()
        .filter_map(|(_, m)| match m {
            Message::Truncate(t) => Some(t),
            _ => None,
        })
        .collect();
    let [single, cascade] = truncates.as_slice() else {
        panic!("expected two truncates")
    };
    assert_eq!(single.options, 0);
    assert_eq!(single.relation_ids, vec![id_of("outbox_ref")]);
    assert_eq!(
        cascade.options,
        Truncate::CASCADE | Truncate::RESTART_IDENTITY
    );
    assert_eq!(
        cascade.relation_ids,
        vec![id_of("outbox"), id_of("outbox_ref")]
    );
}

#[test]
fn logical_messages() {
    let raw = load("v1_messages");
    let decoded = decode_all(&raw);
    let kinds: Vec<_> = decoded.iter().map(|(_, m)| m).collect();
    let [Message::Begin(begin), Message::LogicalMessage(tx), Message::Relation(rel), Message::Insert(ins), Message::Commit(commit), Message::LogicalMessage(nontx)] =
        kinds.as_slice()
    else {
        panic!("unexpected sequence {kinds:?}")
    };
    assert!(tx.transactional);
    assert_eq!(tx.prefix, "walfold");
    assert_eq!(tx.content, b"in-tx content");
    assert!(tx.lsn < begin.final_lsn);
    assert_eq!(rel.name, "outbox_ref");
    assert_eq!(value(rel, &ins.new, "id"), Some(Value::Int(1)));
    assert_eq!(value(rel, &ins.new, "outbox_id"), None);
    assert!(!nontx.transactional);
    assert_eq!(nontx.prefix, "walfold.nontx");
    assert_eq!(nontx.content, b"outside");
    assert!(nontx.lsn > commit.end_lsn);
}

#[test]
fn enum_column_sends_a_type_message() {
    let raw = load("v1_enum_type");
    let decoded = decode_all(&raw);
    let kinds: Vec<_> = decoded.iter().map(|(_, m)| m).collect();
    let [Message::Begin(_), Message::Type(ty), Message::Relation(rel), Message::Insert(ins), Message::Commit(_)] =
        kinds.as_slice()
    else {
        panic!("unexpected sequence {kinds:?}")
    };
    assert_eq!((ty.namespace, ty.name), ("public", "mood"));
    assert_eq!(rel.name, "moods");
    let m = rel
        .columns
        .iter()
        .find(|c| c.name == "m")
        .expect("column m");
    assert_eq!(m.type_oid, ty.id);
    assert_eq!(value(rel, &ins.new, "m"), Some(Value::Other("happy")));
    assert_eq!(value(rel, &ins.new, "note"), Some(Value::Text("n1")));
}

#[test]
fn unchanged_toast_column() {
    let raw = load("v1_toast");
    let decoded = decode_all(&raw);
    let rel = *relations(&decoded).first().expect("relation");
    assert_eq!(rel.name, "docs");
    let mut changes = decoded.iter().filter_map(|(_, m)| match m {
        Message::Insert(i) => Some(&i.new),
        Message::Update(u) => Some(&u.new),
        _ => None,
    });
    let inserted = changes.next().expect("insert");
    let Some(Value::Text(body)) = value(rel, inserted, "body") else {
        panic!("body is text")
    };
    assert_eq!(body.len(), 3200, "100 md5 digests");
    // md5('1'), md5('2'): the first two digests.
    assert!(body.starts_with("c4ca4238a0b923820dcc509a6f75849bc81e728d9d4c2f636f067f89cc14862c"));
    assert!(body.bytes().all(|b| b.is_ascii_hexdigit()));
    let updated = changes.next().expect("update");
    assert_eq!(
        updated.columns,
        vec![Column::Text(b"1"), Column::Unchanged, Column::Text(b"5")]
    );
    assert!(changes.next().is_none());
}

#[test]
fn replication_origin() {
    let raw = load("v1_origin");
    let decoded = decode_all(&raw);
    let kinds: Vec<_> = decoded.iter().map(|(_, m)| m).collect();
    let [Message::Begin(begin), Message::Origin(origin), Message::Type(_), Message::Relation(rel), Message::Insert(ins), Message::Commit(commit)] =
        kinds.as_slice()
    else {
        panic!("unexpected sequence {kinds:?}")
    };
    assert_eq!(origin.name, "walfold_origin");
    assert_eq!(
        origin.commit_lsn, 0x0ABC_DEF0,
        "pg_replication_origin_xact_setup('0/ABCDEF0', ...)"
    );
    // The origin's commit timestamp, 2026-11-30 02:25:48+00, in PostgreSQL-epoch µs.
    assert_eq!(
        begin.commit_time,
        1_796_005_548_000_000 - PG_EPOCH_UNIX_MICROS
    );
    assert_eq!(commit.commit_time, begin.commit_time);
    assert_eq!(
        value(rel, &ins.new, "note"),
        Some(Value::Text("from origin"))
    );
}

#[test]
fn binary_column_values() {
    let raw = load("v1_binary");
    let decoded = decode_all(&raw);
    let insert = decoded
        .iter()
        .find_map(|(_, m)| match m {
            Message::Insert(i) => Some(i),
            _ => None,
        })
        .expect("insert");
    assert_eq!(
        insert.new.columns,
        vec![
            Column::Binary(&3i32.to_be_bytes()),
            Column::Binary(b"sad"),
            Column::Binary(b"bin"),
        ]
    );
}

/// The xid a change or schema message carries (None for others).
fn message_xid(m: &Message<'_>) -> Option<u32> {
    match m {
        Message::Relation(r) => r.xid,
        Message::Type(t) => t.xid,
        Message::Insert(i) => i.xid,
        Message::Update(u) => u.xid,
        Message::Delete(d) => d.xid,
        Message::Truncate(t) => t.xid,
        Message::LogicalMessage(m) => m.xid,
        _ => None,
    }
}

/// Checks Stream Start/Stop framing: changes only inside blocks, each with an xid;
/// Stream Commit/Abort only outside; no Begin/Commit.
fn check_stream_framing(decoded: &[(bool, Message<'_>)]) {
    let mut current: Option<u32> = None;
    for (in_stream, m) in decoded {
        match m {
            Message::StreamStart(s) => {
                assert!(current.is_none() && !in_stream);
                current = Some(s.xid);
            }
            Message::StreamStop => {
                assert!(current.take().is_some() && *in_stream);
            }
            Message::StreamCommit(_) | Message::StreamAbort(_) => {
                assert!(current.is_none() && !in_stream, "outside a block");
            }
            Message::Begin(_) | Message::Commit(_) => {
                panic!("streamed transaction sent begin/commit")
            }
            other => {
                assert!(current.is_some() && *in_stream, "{other:?} outside a block");
                assert!(
                    message_xid(other).is_some(),
                    "in-stream message without xid"
                );
            }
        }
    }
    assert!(current.is_none());
}

#[test]
fn streamed_commit() {
    let raw = load("v2_stream_commit");
    let decoded = decode_all(&raw);
    check_stream_framing(&decoded);
    let starts: Vec<_> = decoded
        .iter()
        .filter_map(|(_, m)| match m {
            Message::StreamStart(s) => Some(s),
            _ => None,
        })
        .collect();
    assert!(starts.len() >= 2, "transaction streamed in several blocks");
    let xid = starts.first().expect("start").xid;
    assert!(starts.first().is_some_and(|s| s.first_segment));
    assert!(starts
        .iter()
        .skip(1)
        .all(|s| !s.first_segment && s.xid == xid));
    // No subtransactions: everything carries the top-level xid.
    for (in_stream, m) in &decoded {
        if *in_stream && !matches!(m, Message::StreamStop) {
            assert_eq!(message_xid(m), Some(xid), "{m:?}");
        }
    }
    let rel = *relations(&decoded).first().expect("relation");
    assert_eq!(rel.name, "stream_t");
    let mut ids = Vec::new();
    for (_, m) in &decoded {
        if let Message::Insert(i) = m {
            assert_eq!(i.relation_id, rel.id);
            let Some(Value::Int(id)) = value(rel, &i.new, "id") else {
                panic!("int id")
            };
            let expected_v = format!("row-{id}");
            assert_eq!(value(rel, &i.new, "v"), Some(Value::Text(&expected_v)));
            assert_eq!(value(rel, &i.new, "m"), Some(Value::Other("ok")));
            ids.push(id);
        }
    }
    assert_eq!(ids, (1..=700).collect::<Vec<i64>>());
    let tail: Vec<_> = decoded
        .iter()
        .map(|(_, m)| m)
        .filter(|m| {
            !matches!(
                m,
                Message::Insert(_) | Message::Type(_) | Message::Relation(_)
            )
        })
        .skip_while(|m| !matches!(m, Message::Update(_)))
        .collect();
    let [Message::Update(upd), Message::Delete(del), Message::LogicalMessage(msg), Message::Truncate(tr), Message::StreamStop, Message::StreamCommit(commit)] =
        tail.as_slice()
    else {
        panic!("unexpected tail {tail:?}")
    };
    assert_eq!(value(rel, &upd.new, "v"), Some(Value::Text("updated")));
    assert!(del.key_only);
    assert_eq!(value(rel, &del.old, "id"), Some(Value::Int(2)));
    assert!(msg.transactional);
    assert_eq!((msg.prefix, msg.content), ("walfold", &b"streamed"[..]));
    assert_eq!(tr.relation_ids, vec![rel.id]);
    assert_eq!(commit.xid, xid);
    assert_eq!(commit.flags, 0);
    assert!(commit.end_lsn > commit.commit_lsn && msg.lsn < commit.commit_lsn);
}

#[test]
fn streamed_aborts() {
    let raw = load("v2_stream_abort");
    let decoded = decode_all(&raw);
    check_stream_framing(&decoded);
    let rel = *relations(&decoded).first().expect("relation");
    let ends: Vec<_> = decoded
        .iter()
        .enumerate()
        .filter(|(_, (_, m))| matches!(m, Message::StreamAbort(_) | Message::StreamCommit(_)))
        .map(|(i, _)| i)
        .collect();
    let [top_abort_at, sub_abort_at, commit_at] = ends.as_slice() else {
        panic!("expected abort, abort, commit")
    };

    // 1. Whole transaction rolled back: subxid == xid, every streamed change has that xid.
    let first = decoded.get(..*top_abort_at).expect("range");
    let Some((_, Message::StreamAbort(top))) = decoded.get(*top_abort_at) else {
        unreachable!()
    };
    assert_eq!(top.subxid, top.xid);
    let mut streamed = 0;
    for (_, m) in first {
        match m {
            Message::StreamStart(s) => assert_eq!(s.xid, top.xid),
            Message::StreamStop => {}
            other => {
                assert_eq!(message_xid(other), Some(top.xid));
                if matches!(other, Message::Insert(_)) {
                    streamed += 1;
                }
            }
        }
    }
    assert!(streamed > 0 && streamed <= 700);

    // 2. Savepoint rolled back, then commit: StreamAbort names the subtransaction.
    let second = decoded.get(top_abort_at + 1..*sub_abort_at).expect("range");
    let Some((_, Message::StreamAbort(sub))) = decoded.get(*sub_abort_at) else {
        unreachable!()
    };
    let Some((_, Message::StreamCommit(commit))) = decoded.get(*commit_at) else {
        unreachable!()
    };
    assert_ne!(sub.xid, sub.subxid);
    assert_eq!(commit.xid, sub.xid);
    assert_ne!(sub.xid, top.xid);
    let mut kept = Vec::new();
    let mut aborted = 0;
    for (_, m) in second {
        match m {
            Message::StreamStart(s) => {
                assert_eq!(s.xid, sub.xid);
                assert!(s.first_segment);
            }
            Message::Insert(i) => {
                let Some(Value::Int(id)) = value(rel, &i.new, "id") else {
                    panic!("int id")
                };
                if i.xid == Some(sub.xid) {
                    kept.push(id);
                } else {
                    assert_eq!(i.xid, Some(sub.subxid), "aborted rows carry the subxid");
                    assert!((1..=700).contains(&id));
                    aborted += 1;
                }
            }
            Message::StreamStop => {}
            other => assert_eq!(message_xid(other), Some(sub.xid)),
        }
    }
    assert_eq!(kept, vec![5000]);
    assert!(aborted > 0);
    // The last block: the row inserted after ROLLBACK TO SAVEPOINT, in a new subxact.
    let third = decoded.get(sub_abort_at + 1..*commit_at).expect("range");
    let mut last_rows = Vec::new();
    for (_, m) in third {
        match m {
            Message::StreamStart(s) => {
                assert_eq!(s.xid, sub.xid);
                assert!(!s.first_segment);
            }
            Message::Insert(i) => {
                assert!(i.xid.is_some_and(|x| x != sub.xid && x != sub.subxid));
                last_rows.push(value(rel, &i.new, "v"));
            }
            _ => {}
        }
    }
    assert_eq!(last_rows, vec![Some(Value::Text("kept too"))]);
}

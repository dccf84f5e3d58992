//! Unit tests for [`decode`](super::decode) over hand-built messages of every type.

use super::{decode, decode_insert, decode_message_head, decode_tuple};
use crate::error::DecodeError;
use crate::message::{
    Begin, Column, Commit, Delete, Insert, LogicalMessage, Message, MessageHead, Origin, Relation,
    RelationColumn, StreamAbort, StreamCommit, StreamStart, Truncate, Tuple, TypeMessage, Update,
};

/// Little builder for big-endian wire bytes.
#[derive(Default)]
struct W(Vec<u8>);

impl W {
    fn tag(t: u8) -> Self {
        Self(vec![t])
    }
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn i16(mut self, v: i16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn raw(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
    fn s(self, v: &str) -> Self {
        self.raw(v.as_bytes()).u8(0)
    }
    fn text(self, v: &[u8]) -> Self {
        let len = i32::try_from(v.len()).expect("test value fits");
        self.u8(b't').i32(len).raw(v)
    }
}

/// Every proper prefix must fail, the full buffer must decode, and one extra
/// byte must be rejected as trailing.
fn check_exact(buf: &[u8], in_stream: bool) {
    for len in 0..buf.len() {
        let prefix = buf.get(..len).expect("in range");
        assert!(
            decode(prefix, in_stream).is_err(),
            "prefix of {len} bytes decoded"
        );
    }
    let mut longer = buf.to_vec();
    longer.push(0);
    assert!(matches!(
        decode(&longer, in_stream),
        Err(DecodeError::TrailingBytes { count: 1, .. })
    ));
}

fn ok(buf: &[u8], in_stream: bool) -> Message<'_> {
    check_exact(buf, in_stream);
    decode(buf, in_stream).expect("decodes")
}

#[test]
fn begin() {
    let buf = W::tag(b'B').u64(0x0100_0000_2000).i64(-5).u32(742).0;
    assert_eq!(
        ok(&buf, false),
        Message::Begin(Begin {
            final_lsn: 0x0100_0000_2000,
            commit_time: -5,
            xid: 742
        })
    );
}

#[test]
fn commit() {
    let buf = W::tag(b'C').u8(0).u64(10).u64(20).i64(30).0;
    assert_eq!(
        ok(&buf, false),
        Message::Commit(Commit {
            flags: 0,
            commit_lsn: 10,
            end_lsn: 20,
            commit_time: 30
        })
    );
}

#[test]
fn origin() {
    let buf = W::tag(b'O').u64(0xABCDEF0).s("walfold_origin").0;
    assert_eq!(
        ok(&buf, false),
        Message::Origin(Origin {
            commit_lsn: 0xABCDEF0,
            name: "walfold_origin"
        })
    );
}

fn relation_body(w: W) -> W {
    w.u32(16384)
        .s("public")
        .s("outbox")
        .u8(b'd')
        .i16(2)
        .u8(1)
        .s("id")
        .u32(2950)
        .i32(-1)
        .u8(0)
        .s("vc")
        .u32(1043)
        .i32(24)
}

#[test]
fn relation() {
    let expected = |xid| {
        Message::Relation(Relation {
            xid,
            id: 16384,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: vec![
                RelationColumn {
                    flags: 1,
                    name: "id".into(),
                    type_oid: 2950,
                    type_modifier: -1,
                },
                RelationColumn {
                    flags: 0,
                    name: "vc".into(),
                    type_oid: 1043,
                    type_modifier: 24,
                },
            ],
        })
    };
    let buf = relation_body(W::tag(b'R')).0;
    assert_eq!(ok(&buf, false), expected(None));
    let buf = relation_body(W::tag(b'R').u32(99)).0;
    assert_eq!(ok(&buf, true), expected(Some(99)));
    let Message::Relation(r) = expected(None) else {
        unreachable!()
    };
    assert!(r.columns.first().is_some_and(RelationColumn::is_key));
}

#[test]
fn relation_with_no_columns_and_huge_count() {
    let buf = W::tag(b'R').u32(1).s("").s("t").u8(b'n').i16(0).0;
    assert!(matches!(ok(&buf, false), Message::Relation(r) if r.columns.is_empty()));
    let buf = W::tag(b'R').u32(1).s("").s("t").u8(b'n').i16(i16::MAX).0;
    assert!(matches!(
        decode(&buf, false),
        Err(DecodeError::Truncated { .. })
    ));
    let buf = W::tag(b'R').u32(1).s("").s("t").u8(b'n').i16(-1).0;
    assert!(matches!(
        decode(&buf, false),
        Err(DecodeError::NegativeLength { value: -1, .. })
    ));
}

#[test]
fn type_message() {
    let buf = W::tag(b'Y').u32(16390).s("public").s("mood").0;
    assert_eq!(
        ok(&buf, false),
        Message::Type(TypeMessage {
            xid: None,
            id: 16390,
            namespace: "public",
            name: "mood"
        })
    );
    let buf = W::tag(b'Y').u32(7).u32(16390).s("public").s("mood").0;
    assert!(matches!(ok(&buf, true), Message::Type(t) if t.xid == Some(7)));
}

#[test]
fn insert() {
    let buf = W::tag(b'I')
        .u32(16384)
        .u8(b'N')
        .i16(3)
        .text(b"42")
        .u8(b'n')
        .u8(b'b')
        .i32(2)
        .raw(&[0, 1])
        .0;
    assert_eq!(
        ok(&buf, false),
        Message::Insert(Insert {
            xid: None,
            relation_id: 16384,
            new: Tuple {
                columns: vec![Column::Text(b"42"), Column::Null, Column::Binary(&[0, 1])]
            }
        })
    );
    let buf = W::tag(b'I').u32(5).u32(16384).u8(b'N').i16(0).0;
    assert!(matches!(ok(&buf, true), Message::Insert(i) if i.xid == Some(5)));
}

/// `decode_insert` reads what `decode` reads of an insert: the same result (its row read
/// by `decode_tuple`) and the same error, for every prefix and one trailing byte.
#[test]
fn decode_insert_agrees_with_decode() {
    let agree =
        |buf: &[u8], in_stream: bool| match (decode(buf, in_stream), decode_insert(buf, in_stream))
        {
            (Ok(Message::Insert(i)), Ok(at)) => {
                assert_eq!((at.xid, at.relation_id), (i.xid, i.relation_id));
                let row = buf.get(at.tuple_at..).expect("in the message");
                assert_eq!(decode_tuple(row), Ok(i.new));
            }
            (Err(e), Err(f)) => assert_eq!(e, f, "{buf:?}"),
            (a, b) => panic!("{buf:?}: {a:?} against {b:?}"),
        };
    let row = |w: W| {
        w.u8(b'N')
            .i16(4)
            .text(b"42")
            .u8(b'n')
            .u8(b'u')
            .u8(b'b')
            .i32(2)
            .raw(&[0, 1])
    };
    let messages = [
        (row(W::tag(b'I').u32(16384)).0, false),
        (row(W::tag(b'I').u32(9).u32(16384)).0, true),
        (W::tag(b'I').u32(1).u8(b'N').i16(0).0, false),
        (W::tag(b'I').u32(1).u8(b'K').i16(0).0, false),
        (W::tag(b'I').u32(1).u8(b'N').i16(1).u8(b'x').0, false),
        (
            W::tag(b'I').u32(1).u8(b'N').i16(1).u8(b't').i32(-1).0,
            false,
        ),
        (W::tag(b'I').u32(1).u8(b'N').i16(-1).0, false),
    ];
    for (buf, in_stream) in messages {
        for len in 0..=buf.len() {
            agree(buf.get(..len).expect("in range"), in_stream);
        }
        let mut longer = buf.clone();
        longer.push(0);
        agree(&longer, in_stream);
    }
    assert_eq!(
        decode_insert(&W::tag(b'U').0, false),
        Err(DecodeError::UnknownTag(b'U'))
    );
}

#[test]
fn insert_requires_new_marker() {
    let buf = W::tag(b'I').u32(1).u8(b'K').i16(0).0;
    assert_eq!(
        decode(&buf, false),
        Err(DecodeError::UnexpectedTupleMarker {
            offset: 5,
            marker: b'K'
        })
    );
}

#[test]
fn update_variants() {
    let new_only = W::tag(b'U').u32(1).u8(b'N').i16(2).text(b"a").u8(b'u').0;
    assert_eq!(
        ok(&new_only, false),
        Message::Update(Update {
            xid: None,
            relation_id: 1,
            old: None,
            key_only: false,
            new: Tuple {
                columns: vec![Column::Text(b"a"), Column::Unchanged]
            }
        })
    );
    let with_key = W::tag(b'U')
        .u32(1)
        .u8(b'K')
        .i16(2)
        .text(b"k")
        .u8(b'n')
        .u8(b'N')
        .i16(2)
        .text(b"k2")
        .text(b"v")
        .0;
    let Message::Update(u) = ok(&with_key, false) else {
        panic!("not an update")
    };
    assert!(u.key_only);
    assert_eq!(
        u.old,
        Some(Tuple {
            columns: vec![Column::Text(b"k"), Column::Null]
        })
    );
    let with_old = W::tag(b'U')
        .u32(9)
        .u32(1)
        .u8(b'O')
        .i16(1)
        .text(b"o")
        .u8(b'N')
        .i16(1)
        .text(b"n")
        .0;
    let Message::Update(u) = ok(&with_old, true) else {
        panic!("not an update")
    };
    assert_eq!(u.xid, Some(9));
    assert!(!u.key_only);
    assert!(u.old.is_some());
}

#[test]
fn update_bad_markers() {
    let buf = W::tag(b'U').u32(1).u8(b'X').i16(0).0;
    assert!(matches!(
        decode(&buf, false),
        Err(DecodeError::UnexpectedTupleMarker { marker: b'X', .. })
    ));
    // Old tuple must be followed by 'N', not another 'K'.
    let buf = W::tag(b'U').u32(1).u8(b'K').i16(0).u8(b'K').i16(0).0;
    assert!(matches!(
        decode(&buf, false),
        Err(DecodeError::UnexpectedTupleMarker { marker: b'K', .. })
    ));
}

#[test]
fn delete() {
    let buf = W::tag(b'D').u32(3).u8(b'K').i16(1).text(b"1").0;
    assert_eq!(
        ok(&buf, false),
        Message::Delete(Delete {
            xid: None,
            relation_id: 3,
            old: Tuple {
                columns: vec![Column::Text(b"1")]
            },
            key_only: true
        })
    );
    let buf = W::tag(b'D').u32(4).u32(3).u8(b'O').i16(0).0;
    assert!(matches!(ok(&buf, true), Message::Delete(d) if !d.key_only && d.xid == Some(4)));
    let buf = W::tag(b'D').u32(3).u8(b'N').i16(0).0;
    assert!(matches!(
        decode(&buf, false),
        Err(DecodeError::UnexpectedTupleMarker { marker: b'N', .. })
    ));
}

#[test]
fn truncate() {
    let buf = W::tag(b'T').i32(2).u8(3).u32(10).u32(11).0;
    assert_eq!(
        ok(&buf, false),
        Message::Truncate(Truncate {
            xid: None,
            options: Truncate::CASCADE | Truncate::RESTART_IDENTITY,
            relation_ids: vec![10, 11]
        })
    );
    let buf = W::tag(b'T').u32(8).i32(0).u8(0).0;
    assert!(matches!(ok(&buf, true), Message::Truncate(t) if t.xid == Some(8)));
    let buf = W::tag(b'T').i32(-1).u8(0).0;
    assert!(matches!(
        decode(&buf, false),
        Err(DecodeError::NegativeLength { .. })
    ));
    let buf = W::tag(b'T').i32(i32::MAX).u8(0).u32(1).0;
    assert!(matches!(
        decode(&buf, false),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn a_message_head_is_read_from_the_first_bytes_of_its_payload() {
    let whole = W::tag(b'M')
        .u8(1)
        .u64(77)
        .s("big")
        .i32(1000)
        .raw(&[7; 1000])
        .0;
    let head = MessageHead {
        xid: None,
        transactional: true,
        lsn: 77,
        prefix: "big",
        content_len: 1000,
    };
    // The head alone, or with some of the content: the same.
    for start in [18, 19, 500, whole.len()] {
        assert_eq!(
            decode_message_head(&whole[..start], whole.len(), false),
            Some(head.clone()),
            "{start} bytes"
        );
    }
    // Not all of the head yet: the prefix's NUL, or the length, still to come.
    for start in [0, 1, 10, 13, 14, 17] {
        assert_eq!(
            decode_message_head(&whole[..start], whole.len(), false),
            None
        );
    }
    // The head's length and the payload's disagree, or not a message.
    assert_eq!(decode_message_head(&whole, whole.len() + 1, false), None);
    let insert = W::tag(b'I').u32(1).0;
    assert_eq!(decode_message_head(&insert, 1000, false), None);
    // Inside a streamed block, the xid first.
    let streamed = W::tag(b'M').u32(9).u8(0).u64(5).s("p").i32(2).raw(b"ab").0;
    let head = decode_message_head(&streamed[..22], streamed.len(), true).unwrap();
    assert_eq!(
        (head.xid, head.transactional, head.content_len),
        (Some(9), false, 2)
    );
}

#[test]
fn logical_message() {
    let buf = W::tag(b'M')
        .u8(1)
        .u64(77)
        .s("walfold")
        .i32(3)
        .raw(b"a\0b")
        .0;
    assert_eq!(
        ok(&buf, false),
        Message::LogicalMessage(LogicalMessage {
            xid: None,
            transactional: true,
            lsn: 77,
            prefix: "walfold",
            content: b"a\0b"
        })
    );
    let buf = W::tag(b'M').u32(6).u8(0).u64(1).s("p").i32(0).0;
    assert!(
        matches!(ok(&buf, true), Message::LogicalMessage(m) if !m.transactional && m.xid == Some(6))
    );
    let buf = W::tag(b'M').u8(2).u64(1).s("p").i32(0).0;
    assert_eq!(
        decode(&buf, false),
        Err(DecodeError::InvalidFlag {
            field: "message flags",
            offset: 1,
            value: 2
        })
    );
}

#[test]
fn stream_start_stop() {
    let buf = W::tag(b'S').u32(750).u8(1).0;
    assert_eq!(
        ok(&buf, false),
        Message::StreamStart(StreamStart {
            xid: 750,
            first_segment: true
        })
    );
    let buf = W::tag(b'S').u32(750).u8(0).0;
    assert!(matches!(ok(&buf, false), Message::StreamStart(s) if !s.first_segment));
    let buf = W::tag(b'S').u32(750).u8(5).0;
    assert!(matches!(
        decode(&buf, false),
        Err(DecodeError::InvalidFlag { value: 5, .. })
    ));
    assert_eq!(ok(b"E", true), Message::StreamStop);
    assert_eq!(ok(b"E", false), Message::StreamStop);
}

#[test]
fn stream_commit() {
    let buf = W::tag(b'c').u32(750).u8(0).u64(1).u64(2).i64(3).0;
    assert_eq!(
        ok(&buf, false),
        Message::StreamCommit(StreamCommit {
            xid: 750,
            flags: 0,
            commit_lsn: 1,
            end_lsn: 2,
            commit_time: 3
        })
    );
}

#[test]
fn stream_abort_v15_and_v16_parallel() {
    let expected = Message::StreamAbort(StreamAbort {
        xid: 750,
        subxid: 751,
    });
    let buf = W::tag(b'A').u32(750).u32(751).0;
    assert_eq!(decode(&buf, false), Ok(expected.clone()));
    for len in 0..buf.len() {
        assert!(decode(buf.get(..len).expect("in range"), false).is_err());
    }
    let parallel = W::tag(b'A').u32(750).u32(751).u64(0x10).i64(99).0;
    assert_eq!(decode(&parallel, false), Ok(expected));
    // Anything but exactly 0 or 16 trailing bytes is an error.
    for extra in [1usize, 8, 15, 17, 24] {
        let mut buf = W::tag(b'A').u32(750).u32(751).0;
        buf.resize(buf.len() + extra, 0);
        assert!(
            matches!(decode(&buf, false), Err(DecodeError::TrailingBytes { .. })),
            "{extra} extra bytes accepted"
        );
    }
}

#[test]
fn empty_and_unknown_tags() {
    assert_eq!(decode(b"", false), Err(DecodeError::Empty));
    assert_eq!(decode(b"Z", false), Err(DecodeError::UnknownTag(b'Z')));
    // Protocol v3 two-phase messages are not supported.
    assert_eq!(decode(b"P", false), Err(DecodeError::UnknownTag(b'P')));
}

#[test]
fn invalid_utf8_is_an_error() {
    let buf = W::tag(b'O').u64(1).raw(b"\xc3\x28\0").0;
    assert_eq!(
        decode(&buf, false),
        Err(DecodeError::InvalidUtf8 { offset: 9 })
    );
    let buf = W::tag(b'Y').u32(1).s("public").raw(b"\xff\0").0;
    assert!(matches!(
        decode(&buf, false),
        Err(DecodeError::InvalidUtf8 { .. })
    ));
}

#[test]
fn stream_xid_changes_the_layout() {
    // Decoding an in-stream message as if outside a stream (or vice versa) must fail.
    let buf = W::tag(b'I').u32(5).u32(16384).u8(b'N').i16(0).0;
    assert!(decode(&buf, false).is_err());
    let buf = W::tag(b'I').u32(16384).u8(b'N').i16(0).0;
    assert!(decode(&buf, true).is_err());
}

#[test]
fn error_messages_are_lowercase_without_period() {
    let errors = [
        DecodeError::Empty,
        DecodeError::UnknownTag(b'Z'),
        DecodeError::Truncated {
            offset: 1,
            needed: 4,
            remaining: 2,
        },
        DecodeError::UnterminatedString { offset: 1 },
        DecodeError::InvalidUtf8 { offset: 1 },
        DecodeError::NegativeLength {
            offset: 1,
            value: -1,
        },
        DecodeError::UnexpectedTupleMarker {
            offset: 1,
            marker: b'X',
        },
        DecodeError::UnknownColumnKind {
            offset: 1,
            kind: b'x',
        },
        DecodeError::InvalidFlag {
            field: "first segment",
            offset: 1,
            value: 2,
        },
        DecodeError::TrailingBytes {
            offset: 1,
            count: 2,
        },
    ];
    for e in errors {
        let text = e.to_string();
        assert!(!text.ends_with('.'), "{text}");
        assert!(
            text.chars().next().is_some_and(|c| !c.is_uppercase()),
            "{text}"
        );
    }
}

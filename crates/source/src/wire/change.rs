//! The one decode of the stream: each XLogData's pgoutput payload becomes a [`Change`]
//! here, once, and here alone is tracked whether a message is inside a streamed block
//! (protocol 2, between Stream Start and Stream Stop), which its layout depends on.

use bytes::Bytes;
use walfold_pgoutput::{
    decode, decode_insert, decode_tuple, Begin, Commit, DecodeError, Message, Relation,
    StreamAbort, StreamCommit, StreamStart, Truncate, Tuple,
};

/// A decoded pgoutput message, owning what it needs of the XLogData's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Begin(Begin),
    Commit(Commit),
    Relation(Relation),
    /// `xid`: the (sub)transaction, inside a streamed block.
    Insert {
        xid: Option<u32>,
        relation_id: u32,
        row: Row,
    },
    Update {
        xid: Option<u32>,
        relation_id: u32,
    },
    Delete {
        xid: Option<u32>,
        relation_id: u32,
    },
    Truncate(Truncate),
    /// A logical decoding message (`pg_logical_emit_message`). Inside a streamed block it
    /// carries that transaction's xid.
    Message {
        transactional: bool,
        lsn: u64,
        prefix: String,
        content: Bytes,
        xid: Option<u32>,
        /// The content's length when it was not read (a prefix walfold ignores, or over
        /// `max_event_bytes`): `content` is then empty.
        left_out: Option<usize>,
    },
    StreamStart(StreamStart),
    StreamStop,
    StreamCommit(StreamCommit),
    StreamAbort(StreamAbort),
    /// Origin and Type messages: nothing walfold reads.
    Other,
}

impl Change {
    /// The position a transaction boundary reaches: a Begin's commit, a commit's end.
    pub fn boundary(&self) -> Option<u64> {
        match self {
            Change::Begin(b) => Some(b.final_lsn),
            Change::Commit(c) => Some(c.end_lsn),
            Change::StreamCommit(c) => Some(c.end_lsn),
            _ => None,
        }
    }
}

/// An inserted row: the message's bytes (checked whole when it was decoded) and where
/// its TupleData starts. Its columns are read where they are used ([`Row::tuple`]): the
/// socket task collects nothing per row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    data: Bytes,
    tuple_at: usize,
}

impl Row {
    /// The row's column values, borrowed from the message. The message was checked when
    /// it was decoded, so an error here is none that message had.
    pub fn tuple(&self) -> Result<Tuple<'_>, DecodeError> {
        decode_tuple(self.data.get(self.tuple_at..).unwrap_or_default())
    }
}

/// Decodes the stream's XLogData payloads in order.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    /// The top-level xid of the streamed block being read (between Stream Start and
    /// Stream Stop): its messages carry an xid.
    stream: Option<u32>,
}

impl Decoder {
    /// The top-level xid of the streamed block being read, if one is.
    pub(crate) fn stream(&self) -> Option<u32> {
        self.stream
    }

    /// One payload, decoded, with the top-level xid of the streamed block it belongs to.
    pub(crate) fn decode(&mut self, data: &Bytes) -> Result<(Change, Option<u32>), DecodeError> {
        let in_block = self.stream;
        // An insert, nearly every message: checked here, its row read by the reader.
        if data.first() == Some(&b'I') {
            let insert = decode_insert(data, in_block.is_some())?;
            let change = Change::Insert {
                xid: insert.xid,
                relation_id: insert.relation_id,
                row: Row {
                    data: data.clone(),
                    tuple_at: insert.tuple_at,
                },
            };
            return Ok((change, in_block));
        }
        let change = match decode(data, in_block.is_some())? {
            Message::Begin(b) => Change::Begin(b),
            Message::Commit(c) => Change::Commit(c),
            Message::Relation(r) => Change::Relation(r),
            // Not reached (inserts are read above); the same without it.
            Message::Insert(i) => Change::Insert {
                xid: i.xid,
                relation_id: i.relation_id,
                row: Row {
                    data: data.clone(),
                    tuple_at: decode_insert(data, in_block.is_some())?.tuple_at,
                },
            },
            Message::Update(u) => Change::Update {
                xid: u.xid,
                relation_id: u.relation_id,
            },
            Message::Delete(d) => Change::Delete {
                xid: d.xid,
                relation_id: d.relation_id,
            },
            Message::Truncate(t) => Change::Truncate(t),
            Message::LogicalMessage(m) => Change::Message {
                transactional: m.transactional,
                lsn: m.lsn,
                prefix: m.prefix.to_owned(),
                content: data.slice_ref(m.content),
                xid: m.xid,
                left_out: None,
            },
            Message::StreamStart(s) => {
                self.stream = Some(s.xid);
                Change::StreamStart(s)
            }
            Message::StreamStop => {
                self.stream = None;
                Change::StreamStop
            }
            Message::StreamCommit(c) => Change::StreamCommit(c),
            Message::StreamAbort(a) => Change::StreamAbort(a),
            Message::Origin(_) | Message::Type(_) => Change::Other,
        };
        Ok((change, in_block))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use walfold_pgoutput::Column;

    #[test]
    fn a_row_reads_its_columns_from_the_message() {
        // Insert into relation 7: null, unchanged, text "hi", binary [7].
        let data = Bytes::from_static(
            b"I\x00\x00\x00\x07N\x00\x04nut\x00\x00\x00\x02hib\x00\x00\x00\x01\x07",
        );
        let (change, stream) = Decoder::default().decode(&data).unwrap();
        assert_eq!(stream, None);
        let Change::Insert {
            xid: None,
            relation_id: 7,
            row,
        } = change
        else {
            panic!("an insert: {change:?}");
        };
        assert_eq!(
            row.tuple().unwrap().columns,
            vec![
                Column::Null,
                Column::Unchanged,
                Column::Text(b"hi"),
                Column::Binary(&[7]),
            ]
        );
    }

    #[test]
    fn messages_between_stream_start_and_stop_carry_the_xid() {
        let mut d = Decoder::default();
        let start = Bytes::from_static(b"S\x00\x00\x00\x2a\x01");
        assert!(matches!(
            d.decode(&start).unwrap(),
            (Change::StreamStart(StreamStart { xid: 42, .. }), None)
        ));
        // Inside the block an insert starts with its (sub)transaction's xid.
        let insert = Bytes::from_static(b"I\x00\x00\x00\x2b\x00\x00\x00\x07N\x00\x01n");
        assert!(matches!(
            d.decode(&insert).unwrap(),
            (
                Change::Insert {
                    xid: Some(43),
                    relation_id: 7,
                    ..
                },
                Some(42)
            )
        ));
        assert!(matches!(
            d.decode(&Bytes::from_static(b"E")).unwrap(),
            (Change::StreamStop, Some(42))
        ));
        let insert = Bytes::from_static(b"I\x00\x00\x00\x07N\x00\x01n");
        assert!(matches!(
            d.decode(&insert).unwrap(),
            (
                Change::Insert {
                    xid: None,
                    relation_id: 7,
                    ..
                },
                None
            )
        ));
    }
}

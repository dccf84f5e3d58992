//! Decoded pgoutput message types (protocol versions 1 and 2).

/// One decoded pgoutput message: the payload of one XLogData.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    /// `B`: start of a transaction.
    Begin(Begin),
    /// `C`: end of a transaction.
    Commit(Commit),
    /// `O`: the transaction was replayed from a replication origin.
    Origin(Origin<'a>),
    /// `R`: a relation's schema, sent before its first change in a session.
    Relation(Relation),
    /// `Y`: a non-built-in type used by a relation's column.
    Type(TypeMessage<'a>),
    /// `I`: a row was inserted.
    Insert(Insert<'a>),
    /// `U`: a row was updated.
    Update(Update<'a>),
    /// `D`: a row was deleted.
    Delete(Delete<'a>),
    /// `T`: one or more relations were truncated.
    Truncate(Truncate),
    /// `M`: a message from `pg_logical_emit_message`.
    LogicalMessage(LogicalMessage<'a>),
    /// `S`: start of a streamed block of an in-progress transaction (protocol v2).
    StreamStart(StreamStart),
    /// `E`: end of a streamed block (protocol v2).
    StreamStop,
    /// `c`: a streamed transaction committed (protocol v2).
    StreamCommit(StreamCommit),
    /// `A`: a streamed transaction or subtransaction aborted (protocol v2).
    StreamAbort(StreamAbort),
}

/// `B`: start of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begin {
    /// LSN of the transaction's commit record.
    pub final_lsn: u64,
    /// Commit time, microseconds since 2000-01-01 00:00:00 UTC.
    pub commit_time: i64,
    /// Transaction id.
    pub xid: u32,
}

/// `C`: end of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// Currently unused by PostgreSQL (always 0).
    pub flags: u8,
    /// LSN of the commit record.
    pub commit_lsn: u64,
    /// LSN just past the commit record.
    pub end_lsn: u64,
    /// Commit time, microseconds since 2000-01-01 00:00:00 UTC.
    pub commit_time: i64,
}

/// `O`: replication origin of the current transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin<'a> {
    /// LSN of the commit on the origin server.
    pub commit_lsn: u64,
    /// Origin name.
    pub name: &'a str,
}

/// `R`: a relation's schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// Transaction id, present only inside a streamed block.
    pub xid: Option<u32>,
    /// Relation OID.
    pub id: u32,
    /// Schema name (empty for `pg_catalog`).
    pub namespace: String,
    /// Relation name.
    pub name: String,
    /// `relreplident`: `d` default, `n` nothing, `f` full, `i` index.
    pub replica_identity: u8,
    /// Published columns, in order.
    pub columns: Vec<RelationColumn>,
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// 1 if the column is part of the replica identity key, else 0.
    pub flags: u8,
    /// Column name.
    pub name: String,
    /// Type OID.
    pub type_oid: u32,
    /// `atttypmod` (-1 if none).
    pub type_modifier: i32,
}

impl RelationColumn {
    /// Whether the column is part of the replica identity key.
    pub fn is_key(&self) -> bool {
        self.flags & 1 != 0
    }
}

/// `Y`: a type used by a relation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeMessage<'a> {
    /// Transaction id, present only inside a streamed block.
    pub xid: Option<u32>,
    /// Type OID.
    pub id: u32,
    /// Schema name (empty for `pg_catalog`).
    pub namespace: &'a str,
    /// Type name.
    pub name: &'a str,
}

/// `I`: a row was inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert<'a> {
    /// Transaction (or subtransaction) id, present only inside a streamed block.
    pub xid: Option<u32>,
    /// OID of the relation, as sent in a prior [`Relation`].
    pub relation_id: u32,
    /// The new row.
    pub new: Tuple<'a>,
}

/// `I` as [`decode_insert`](crate::decode_insert) reads it: checked, its row not collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsertAt {
    /// Transaction (or subtransaction) id, present only inside a streamed block.
    pub xid: Option<u32>,
    /// OID of the relation, as sent in a prior [`Relation`].
    pub relation_id: u32,
    /// Where the new row's TupleData starts in the message.
    pub tuple_at: usize,
}

/// `U`: a row was updated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update<'a> {
    /// Transaction (or subtransaction) id, present only inside a streamed block.
    pub xid: Option<u32>,
    /// OID of the relation.
    pub relation_id: u32,
    /// The old row (`O`, replica identity full) or old key (`K`), if sent.
    pub old: Option<Tuple<'a>>,
    /// True if `old` is a key-only tuple (`K`).
    pub key_only: bool,
    /// The new row; unchanged TOAST values are [`Column::Unchanged`].
    pub new: Tuple<'a>,
}

/// `D`: a row was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete<'a> {
    /// Transaction (or subtransaction) id, present only inside a streamed block.
    pub xid: Option<u32>,
    /// OID of the relation.
    pub relation_id: u32,
    /// The old row (`O`) or its key (`K`, non-key columns are null).
    pub old: Tuple<'a>,
    /// True if `old` is a key-only tuple (`K`).
    pub key_only: bool,
}

/// `T`: relations were truncated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    /// Transaction (or subtransaction) id, present only inside a streamed block.
    pub xid: Option<u32>,
    /// Bit 1: `CASCADE`, bit 2: `RESTART IDENTITY`.
    pub options: u8,
    /// OIDs of the truncated relations.
    pub relation_ids: Vec<u32>,
}

impl Truncate {
    /// `options` bit for `TRUNCATE ... CASCADE`.
    pub const CASCADE: u8 = 1;
    /// `options` bit for `TRUNCATE ... RESTART IDENTITY`.
    pub const RESTART_IDENTITY: u8 = 2;
}

/// `M`: a message from `pg_logical_emit_message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalMessage<'a> {
    /// Transaction id, present only inside a streamed block.
    pub xid: Option<u32>,
    /// Whether the message was emitted transactionally.
    pub transactional: bool,
    /// LSN of the message.
    pub lsn: u64,
    /// The message prefix.
    pub prefix: &'a str,
    /// The message content.
    pub content: &'a [u8],
}

/// A logical decoding message without its content (see [`crate::decode_message_head`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageHead<'a> {
    /// Transaction id, present only inside a streamed block.
    pub xid: Option<u32>,
    /// Whether the message was emitted transactionally.
    pub transactional: bool,
    /// LSN of the message.
    pub lsn: u64,
    /// The message prefix.
    pub prefix: &'a str,
    /// The content's length in bytes.
    pub content_len: usize,
}

/// `S`: start of a streamed block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStart {
    /// Top-level transaction id.
    pub xid: u32,
    /// True for the first block of this transaction.
    pub first_segment: bool,
}

/// `c`: a streamed transaction committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCommit {
    /// Top-level transaction id.
    pub xid: u32,
    /// Currently unused by PostgreSQL (always 0).
    pub flags: u8,
    /// LSN of the commit record.
    pub commit_lsn: u64,
    /// LSN just past the commit record.
    pub end_lsn: u64,
    /// Commit time, microseconds since 2000-01-01 00:00:00 UTC.
    pub commit_time: i64,
}

/// `A`: a streamed transaction or subtransaction aborted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamAbort {
    /// Top-level transaction id.
    pub xid: u32,
    /// Aborted subtransaction id; equal to `xid` when the whole transaction aborted.
    pub subxid: u32,
}

/// Column values of one row, in relation column order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuple<'a> {
    /// The columns.
    pub columns: Vec<Column<'a>>,
}

/// One column value of a [`Tuple`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column<'a> {
    /// `n`: SQL NULL.
    Null,
    /// `u`: an unchanged TOAST value whose data was not sent.
    Unchanged,
    /// `t`: the value in text output format.
    Text(&'a [u8]),
    /// `b`: the value in binary send format (`binary = true`).
    Binary(&'a [u8]),
}

//! Decoding of one pgoutput message from its wire bytes into a [`Message`].

use crate::cursor::Cursor;
use crate::error::DecodeError;
use crate::message::{
    Begin, Commit, Delete, Insert, InsertAt, LogicalMessage, Message, MessageHead, Origin,
    Relation, RelationColumn, StreamAbort, StreamCommit, StreamStart, Truncate, Tuple, TypeMessage,
    Update,
};
use crate::tuple::{read_tuple, skip_tuple};

/// Decode one pgoutput message (the payload of one XLogData).
///
/// `in_stream`: true between Stream Start and Stream Stop (protocol v2), where
/// Relation/Type/Insert/Update/Delete/Truncate/Message carry a leading xid.
///
/// The whole buffer must be exactly one message: trailing bytes are an error.
/// Never panics, whatever the input.
pub fn decode(buf: &[u8], in_stream: bool) -> Result<Message<'_>, DecodeError> {
    let mut c = Cursor::new(buf);
    let tag = c.u8().map_err(|_| DecodeError::Empty)?;
    let message = match tag {
        b'B' => Message::Begin(begin(&mut c)?),
        b'C' => Message::Commit(commit(&mut c)?),
        b'O' => Message::Origin(origin(&mut c)?),
        b'R' => Message::Relation(relation(&mut c, in_stream)?),
        b'Y' => Message::Type(type_message(&mut c, in_stream)?),
        b'I' => Message::Insert(insert(&mut c, in_stream)?),
        b'U' => Message::Update(update(&mut c, in_stream)?),
        b'D' => Message::Delete(delete(&mut c, in_stream)?),
        b'T' => Message::Truncate(truncate(&mut c, in_stream)?),
        b'M' => Message::LogicalMessage(logical_message(&mut c, in_stream)?),
        b'S' => Message::StreamStart(stream_start(&mut c)?),
        b'E' => Message::StreamStop,
        b'c' => Message::StreamCommit(stream_commit(&mut c)?),
        b'A' => Message::StreamAbort(stream_abort(&mut c)?),
        other => return Err(DecodeError::UnknownTag(other)),
    };
    c.finish()?;
    Ok(message)
}

/// The head of a logical decoding message (`M`) from the first bytes of its payload, for
/// a message too large to be read before deciding whether to read it: everything but the
/// content, and the content's length. `len`: the whole payload's length, which the head
/// must account for exactly. `None` when `start` does not hold the whole head yet, or is
/// not a message, or the lengths disagree (the whole message, read as usual, says why).
pub fn decode_message_head(start: &[u8], len: usize, in_stream: bool) -> Option<MessageHead<'_>> {
    let mut c = Cursor::new(start);
    if c.u8().ok()? != b'M' {
        return None;
    }
    let xid = stream_xid(&mut c, in_stream).ok()?;
    let transactional = bool_byte(&mut c, "message flags").ok()?;
    let lsn = c.u64().ok()?;
    let prefix = c.cstr().ok()?;
    let content_len = c.len32().ok()?;
    (c.position().checked_add(content_len)? == len).then_some(MessageHead {
        xid,
        transactional,
        lsn,
        prefix,
        content_len,
    })
}

/// [`decode`] of an Insert (`I`) without collecting its row: the same checks and the
/// same errors, and where the row's TupleData starts, to be read later with
/// [`decode_tuple`] (no allocation until then).
pub fn decode_insert(buf: &[u8], in_stream: bool) -> Result<InsertAt, DecodeError> {
    let mut c = Cursor::new(buf);
    let tag = c.u8().map_err(|_| DecodeError::Empty)?;
    if tag != b'I' {
        return Err(DecodeError::UnknownTag(tag));
    }
    let xid = stream_xid(&mut c, in_stream)?;
    let relation_id = c.u32()?;
    marker(&mut c, b"N")?;
    let tuple_at = c.position();
    skip_tuple(&mut c)?;
    c.finish()?;
    Ok(InsertAt {
        xid,
        relation_id,
        tuple_at,
    })
}

/// One TupleData filling `buf` (an Insert's row from [`InsertAt::tuple_at`] on).
pub fn decode_tuple(buf: &[u8]) -> Result<Tuple<'_>, DecodeError> {
    let mut c = Cursor::new(buf);
    let tuple = read_tuple(&mut c)?;
    c.finish()?;
    Ok(tuple)
}

fn stream_xid(c: &mut Cursor<'_>, in_stream: bool) -> Result<Option<u32>, DecodeError> {
    if in_stream {
        c.u32().map(Some)
    } else {
        Ok(None)
    }
}

/// Reads a byte that must be 0 (false) or 1 (true).
fn bool_byte(c: &mut Cursor<'_>, field: &'static str) -> Result<bool, DecodeError> {
    let offset = c.position();
    match c.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        value => Err(DecodeError::InvalidFlag {
            field,
            offset,
            value,
        }),
    }
}

fn begin(c: &mut Cursor<'_>) -> Result<Begin, DecodeError> {
    Ok(Begin {
        final_lsn: c.u64()?,
        commit_time: c.i64()?,
        xid: c.u32()?,
    })
}

fn commit(c: &mut Cursor<'_>) -> Result<Commit, DecodeError> {
    Ok(Commit {
        flags: c.u8()?,
        commit_lsn: c.u64()?,
        end_lsn: c.u64()?,
        commit_time: c.i64()?,
    })
}

fn origin<'a>(c: &mut Cursor<'a>) -> Result<Origin<'a>, DecodeError> {
    Ok(Origin {
        commit_lsn: c.u64()?,
        name: c.cstr()?,
    })
}

fn relation(c: &mut Cursor<'_>, in_stream: bool) -> Result<Relation, DecodeError> {
    let xid = stream_xid(c, in_stream)?;
    let id = c.u32()?;
    let namespace = c.cstr()?.to_owned();
    let name = c.cstr()?.to_owned();
    let replica_identity = c.u8()?;
    let count = c.count16()?;
    // Every column takes at least 10 bytes, so this bounds the allocation by the input.
    let mut columns = Vec::with_capacity(count.min(c.remaining() / 10));
    for _ in 0..count {
        columns.push(RelationColumn {
            flags: c.u8()?,
            name: c.cstr()?.to_owned(),
            type_oid: c.u32()?,
            type_modifier: c.i32()?,
        });
    }
    Ok(Relation {
        xid,
        id,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn type_message<'a>(c: &mut Cursor<'a>, in_stream: bool) -> Result<TypeMessage<'a>, DecodeError> {
    Ok(TypeMessage {
        xid: stream_xid(c, in_stream)?,
        id: c.u32()?,
        namespace: c.cstr()?,
        name: c.cstr()?,
    })
}

/// Reads a tuple marker byte and checks it is one of `allowed`.
fn marker(c: &mut Cursor<'_>, allowed: &[u8]) -> Result<u8, DecodeError> {
    let offset = c.position();
    let marker = c.u8()?;
    if allowed.contains(&marker) {
        Ok(marker)
    } else {
        Err(DecodeError::UnexpectedTupleMarker { offset, marker })
    }
}

fn insert<'a>(c: &mut Cursor<'a>, in_stream: bool) -> Result<Insert<'a>, DecodeError> {
    let xid = stream_xid(c, in_stream)?;
    let relation_id = c.u32()?;
    marker(c, b"N")?;
    Ok(Insert {
        xid,
        relation_id,
        new: read_tuple(c)?,
    })
}

fn update<'a>(c: &mut Cursor<'a>, in_stream: bool) -> Result<Update<'a>, DecodeError> {
    let xid = stream_xid(c, in_stream)?;
    let relation_id = c.u32()?;
    let (old, key_only) = match marker(c, b"KON")? {
        b'N' => (None, false),
        kind => {
            let old = read_tuple(c)?;
            marker(c, b"N")?;
            (Some(old), kind == b'K')
        }
    };
    Ok(Update {
        xid,
        relation_id,
        old,
        key_only,
        new: read_tuple(c)?,
    })
}

fn delete<'a>(c: &mut Cursor<'a>, in_stream: bool) -> Result<Delete<'a>, DecodeError> {
    let xid = stream_xid(c, in_stream)?;
    let relation_id = c.u32()?;
    let key_only = marker(c, b"KO")? == b'K';
    Ok(Delete {
        xid,
        relation_id,
        old: read_tuple(c)?,
        key_only,
    })
}

fn truncate(c: &mut Cursor<'_>, in_stream: bool) -> Result<Truncate, DecodeError> {
    let xid = stream_xid(c, in_stream)?;
    let count = c.len32()?;
    let options = c.u8()?;
    let mut relation_ids = Vec::with_capacity(count.min(c.remaining() / 4));
    for _ in 0..count {
        relation_ids.push(c.u32()?);
    }
    Ok(Truncate {
        xid,
        options,
        relation_ids,
    })
}

fn logical_message<'a>(
    c: &mut Cursor<'a>,
    in_stream: bool,
) -> Result<LogicalMessage<'a>, DecodeError> {
    let xid = stream_xid(c, in_stream)?;
    let transactional = bool_byte(c, "message flags")?;
    let lsn = c.u64()?;
    let prefix = c.cstr()?;
    let len = c.len32()?;
    Ok(LogicalMessage {
        xid,
        transactional,
        lsn,
        prefix,
        content: c.bytes(len)?,
    })
}

fn stream_start(c: &mut Cursor<'_>) -> Result<StreamStart, DecodeError> {
    Ok(StreamStart {
        xid: c.u32()?,
        first_segment: bool_byte(c, "first segment")?,
    })
}

fn stream_commit(c: &mut Cursor<'_>) -> Result<StreamCommit, DecodeError> {
    Ok(StreamCommit {
        xid: c.u32()?,
        flags: c.u8()?,
        commit_lsn: c.u64()?,
        end_lsn: c.u64()?,
        commit_time: c.i64()?,
    })
}

fn stream_abort(c: &mut Cursor<'_>) -> Result<StreamAbort, DecodeError> {
    let abort = StreamAbort {
        xid: c.u32()?,
        subxid: c.u32()?,
    };
    // PostgreSQL 16+ with streaming = parallel appends abort_lsn and abort_time.
    if c.remaining() == 16 {
        c.u64()?;
        c.i64()?;
    }
    Ok(abort)
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;

//! Large payloads go to the server by COPY, in chunks, not as bound parameters.
//! tokio-postgres encodes a statement's parameters into one message and then copies
//! that message into its connection's write buffer: a bound payload is held three times
//! (the event, the message, the buffer), and the buffers keep their size. A COPY holds
//! one chunk at a time. The batch's statement then reads such a payload from the
//! session's temporary table by its index in the batch (a null in the bound array).

use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{BufMut, Bytes, BytesMut};
use futures::SinkExt;
use tokio_postgres::Transaction;
use walfold_event::JsonText;

use crate::error::StoreError;
use walfold_pg::RowExt;

/// A payload at least this large is sent by COPY.
pub(crate) const LARGE: usize = 1 << 20;

/// Bytes of text per COPY message.
const CHUNK: usize = 256 * 1024;

/// The session's table of a batch's large payloads, by their index in the batch (from 1);
/// emptied by the commit (or rollback) of the transaction that fills it.
const CREATE: &str = "create temporary table if not exists walfold_large_payload \
     (n int8 primary key, payload jsonb not null) on commit delete rows";

const MAY_CREATE: &str = "select has_database_privilege(current_database(), 'temporary')";

const COPY: &str = "copy pg_temp.walfold_large_payload (n, payload) from stdin (format binary)";

/// The expression that reads the payload of the batch's `n`th row (`payload` its bound
/// value, null when it was sent by COPY).
pub(crate) const PAYLOAD: &str = "coalesce({payload}, (select l.payload from \
     pg_temp.walfold_large_payload l where l.n = {n}))";

/// Whether the target refused the temporary table (no TEMP right): large payloads are
/// then bound like any other, and this is said once.
static REFUSED: AtomicBool = AtomicBool::new(false);

/// Sends the large payloads of `payloads` by COPY inside `tx`. `Some(bound)`: the
/// payloads to bind instead, each sent one `None`, for the statement that reads them
/// back ([`PAYLOAD`]); `None`: none is large (or COPY is not possible), bind them all.
pub(crate) async fn upload<'a>(
    tx: &Transaction<'_>,
    payloads: &[Option<&'a JsonText>],
) -> Result<Option<Vec<Option<&'a JsonText>>>, StoreError> {
    let large = |p: &Option<&JsonText>| p.is_some_and(|p| p.len() >= LARGE);
    if !payloads.iter().any(large) || REFUSED.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let may: bool = tx
        .query_one(MAY_CREATE, &[])
        .await
        .map_err(StoreError::db("preparing to send large payloads"))?
        .of("has_database_privilege")
        .col(0)?;
    if !may {
        tracing::warn!("walfold's role may not create temporary tables on the target (grant temporary on database): large payloads are bound as parameters, each held three times while sent");
        REFUSED.store(true, Ordering::Relaxed);
        return Ok(None);
    }
    tx.batch_execute(CREATE)
        .await
        .map_err(StoreError::db("preparing to send large payloads"))?;
    let sink = tx
        .copy_in::<_, Bytes>(COPY)
        .await
        .map_err(StoreError::db("sending large payloads"))?;
    futures::pin_mut!(sink);
    let mut head = BytesMut::with_capacity(64);
    head.put_slice(b"PGCOPY\n\xff\r\n\0");
    head.put_i32(0);
    head.put_i32(0);
    let mut bound = Vec::with_capacity(payloads.len());
    for (i, p) in payloads.iter().enumerate() {
        let Some(text) = p.filter(|p| p.len() >= LARGE) else {
            bound.push(*p);
            continue;
        };
        bound.push(None);
        // A tuple of two fields: n (int8), then payload (jsonb: a version byte, the text).
        head.put_i16(2);
        head.put_i32(8);
        head.put_i64(i as i64 + 1);
        head.put_i32(i32::try_from(text.len() + 1).unwrap_or(i32::MAX));
        head.put_u8(1);
        sink.send(head.split().freeze())
            .await
            .map_err(StoreError::db("sending large payloads"))?;
        for chunk in text.as_str().as_bytes().chunks(CHUNK) {
            sink.send(Bytes::copy_from_slice(chunk))
                .await
                .map_err(StoreError::db("sending large payloads"))?;
        }
    }
    head.put_i16(-1);
    sink.send(head.split().freeze())
        .await
        .map_err(StoreError::db("sending large payloads"))?;
    sink.as_mut()
        .finish()
        .await
        .map_err(StoreError::db("sending large payloads"))?;
    Ok(Some(bound))
}

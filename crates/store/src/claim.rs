//! The one place that claims events for a subscriber. A claim is an insert into
//! `processed_message` in the same transaction as the projection change: never
//! check-then-act. What the insert did not return was claimed before: a duplicate.
//!
//! A claim is keyed by `(subscriber_id, seq)`: the event log maps each producer event ID
//! to exactly one seq while it holds the event, and checks the ID's uniqueness once, at
//! append. Claims of one subscriber are made in seq order, so each inserts at the right
//! edge of the index: its cost does not grow with history (a key of random UUIDs put
//! every claim on another leaf page once the index outgrew the buffers, and after each
//! checkpoint every such page went to the WAL whole).
//!
//! The dedup window stays what "Retention as replay policy" says: an ID is a duplicate
//! for a subscriber while it is in the log or while the subscriber's claim is kept.
//! - While the log holds an event, a redelivery of its ID is dropped at append.
//! - When pruning deletes an event, its ID and claim seq go to `retired_identity`,
//!   kept at least as long as any claim on it (its age bounds the claims' age: every
//!   claim on an event is made before the event is pruned). An ID appended again while
//!   it is there is recorded with that seq as its `claim_seq`, and its claims are made
//!   on it: they meet the first delivery's claims, in every target database, for every
//!   subscriber, a rebuild's included (a rebuild claims the seqs of what it replays).
//! - Claims made before the seq key (`seq` null) keep deduplicating by `message_id`,
//!   which stays on every claim: each claim first looks for one (an index that only
//!   shrinks as they are pruned; empty in a deployment that started with the seq key).
//!
//! A redelivery after both windows is new, as before.

use std::collections::HashSet;

use tokio_postgres::Transaction;
use uuid::Uuid;

use crate::error::StoreError;
use crate::schema::Schema;
use walfold_pg::RowExt;

/// Claims each of the events `$2` (their IDs) with claim seqs `$3` for subscriber `$1`;
/// returns the IDs not claimed before, by seq or (a claim made before seqs) by ID.
const CLAIM: &str =
    "insert into {schema}.processed_message (subscriber_id, seq, message_id, processed_at) \
     select $1, c.seq, c.id, now() from unnest($2::uuid[], $3::int8[]) as c(id, seq) \
     where not exists (select from {schema}.processed_message p \
       where p.subscriber_id = $1 and p.message_id = c.id and p.seq is null) \
     order by c.seq \
     on conflict (subscriber_id, seq) do nothing returning message_id";

/// Releases the claims of subscriber `$1` on the claim seqs `$2`.
const UNCLAIM: &str =
    "delete from {schema}.processed_message where subscriber_id = $1 and seq = any($2)";

/// The claim statement for `schema`; prepare it once per connection.
pub(crate) fn claim_sql(schema: &Schema) -> String {
    schema.sql(CLAIM)
}

/// Claims the events `ids` (with their claim seqs, `Event::claim_seq`) for `subscriber`
/// inside `tx`; returns the IDs this transaction claimed. The rest were already
/// processed by this subscriber and must be skipped.
pub(crate) async fn claim(
    tx: &Transaction<'_>,
    statement: &tokio_postgres::Statement,
    subscriber: &str,
    ids: &[(Uuid, i64)],
) -> Result<HashSet<Uuid>, StoreError> {
    if ids.is_empty() {
        return Ok(HashSet::new());
    }
    let (uuids, seqs): (Vec<Uuid>, Vec<i64>) = ids.iter().copied().unzip();
    let rows = tx
        .query(statement, &[&subscriber, &uuids, &seqs])
        .await
        .map_err(StoreError::db("claiming events"))?;
    rows.iter()
        .map(|r| Ok(r.of("processed_message").col("message_id")?))
        .collect()
}

/// Takes back claims made earlier in `tx` (by their claim seqs) for events that were not
/// applied after all (a strict projection's events that wait for a missing version):
/// they are claimed again in the transaction that applies them. Only ever in the
/// claiming transaction, so they are always claims by seq.
pub(crate) async fn unclaim(
    tx: &Transaction<'_>,
    schema: &Schema,
    subscriber: &str,
    seqs: &[i64],
) -> Result<(), StoreError> {
    if seqs.is_empty() {
        return Ok(());
    }
    tx.execute(&schema.sql(UNCLAIM), &[&subscriber, &seqs])
        .await
        .map_err(StoreError::db("releasing claims"))?;
    Ok(())
}

//! The one place that claims events for a subscriber. A claim is an insert into
//! `processed_message` in the same transaction as the projection change: never
//! check-then-act. What the insert did not return was claimed before: a duplicate.

use std::collections::HashSet;

use tokio_postgres::Transaction;
use uuid::Uuid;

use crate::error::StoreError;
use crate::row::RowExt;
use crate::schema::Schema;

/// Claims each of `$2` for subscriber `$1`; returns the IDs not claimed before.
const CLAIM: &str =
    "insert into {schema}.processed_message (subscriber_id, message_id, processed_at) \
     select $1, id, now() from unnest($2::uuid[]) as claim(id) \
     on conflict do nothing returning message_id";

/// Releases the claims of subscriber `$1` on the IDs `$2`.
const UNCLAIM: &str =
    "delete from {schema}.processed_message where subscriber_id = $1 and message_id = any($2)";

/// The claim statement for `schema`; prepare it once per connection.
pub(crate) fn claim_sql(schema: &Schema) -> String {
    schema.sql(CLAIM)
}

/// Claims `ids` for `subscriber` inside `tx`; returns the IDs this transaction claimed.
/// The rest were already processed by this subscriber and must be skipped.
pub(crate) async fn claim(
    tx: &Transaction<'_>,
    statement: &tokio_postgres::Statement,
    subscriber: &str,
    ids: &[Uuid],
) -> Result<HashSet<Uuid>, StoreError> {
    if ids.is_empty() {
        return Ok(HashSet::new());
    }
    let rows = tx
        .query(statement, &[&subscriber, &ids])
        .await
        .map_err(StoreError::db("claiming events"))?;
    rows.iter()
        .map(|r| r.of("processed_message").col("message_id"))
        .collect()
}

/// Takes back claims made earlier in `tx` for events that were not applied after all
/// (a strict projection's events that wait for a missing version): they are claimed
/// again in the transaction that applies them. Only ever in the claiming transaction.
pub(crate) async fn unclaim(
    tx: &Transaction<'_>,
    schema: &Schema,
    subscriber: &str,
    ids: &[Uuid],
) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    tx.execute(&schema.sql(UNCLAIM), &[&subscriber, &ids])
        .await
        .map_err(StoreError::db("releasing claims"))?;
    Ok(())
}

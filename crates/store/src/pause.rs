//! Paused projector partitions and ingest, recorded for `walfold status` (and cleared on
//! resume: a partition's by the partition, ingest's by its next append).
//! Best effort by nature: the error that paused a partition may keep these writes from
//! landing too, so logs and metrics say it as well.

use tokio_postgres::Client;

use crate::error::StoreError;
use crate::leader::Fence;
use crate::schema::Schema;

/// Records why partition `$2` of subscriber `$1` is paused, replacing an earlier reason.
const RECORD: &str =
    "insert into {schema}.projection_pause as p (subscriber_id, partition, sqlstate, error) \
     values ($1, $2, $3, $4) on conflict (subscriber_id, partition) do update \
     set sqlstate = excluded.sqlstate, error = excluded.error, updated_at = now()";

/// Forgets every pause.
const CLEAR_ALL: &str = "delete from {schema}.projection_pause";

/// Forgets the pause of partition `$2` of subscriber `$1`.
const CLEAR: &str =
    "delete from {schema}.projection_pause where subscriber_id = $1 and partition = $2";

/// Records (or updates) why `partition` of `subscriber` is paused; fenced, so a deposed
/// leader cannot leave a pause behind that nothing would clear.
pub async fn record_pause(
    client: &mut Client,
    fence: &Fence,
    schema: &Schema,
    subscriber: &str,
    partition: u32,
    sqlstate: Option<&str>,
    error: &str,
) -> Result<(), StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("recording a pause"))?;
    fence.check(&tx).await?;
    tx.execute(
        &schema.sql(RECORD),
        &[&subscriber, &(partition as i32), &sqlstate, &error],
    )
    .await
    .map_err(StoreError::db("recording a pause"))?;
    tx.commit()
        .await
        .map_err(StoreError::db("recording a pause"))?;
    Ok(())
}

/// Forgets every recorded pause: a new leader's partitions record their own.
pub async fn clear_pauses(
    client: &mut Client,
    fence: &Fence,
    schema: &Schema,
) -> Result<(), StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("clearing pauses"))?;
    fence.check(&tx).await?;
    tx.execute(&schema.sql(CLEAR_ALL), &[])
        .await
        .map_err(StoreError::db("clearing pauses"))?;
    tx.commit()
        .await
        .map_err(StoreError::db("clearing pauses"))?;
    Ok(())
}

/// Clears the pause of `partition` of `subscriber`.
pub async fn clear_pause(
    client: &Client,
    schema: &Schema,
    subscriber: &str,
    partition: u32,
) -> Result<(), StoreError> {
    client
        .execute(&schema.sql(CLEAR), &[&subscriber, &(partition as i32)])
        .await
        .map_err(StoreError::db("clearing a pause"))?;
    Ok(())
}

/// Records why slot `$1`'s ingest is paused (`$2`), keeping when it started.
const RECORD_INGEST: &str = "update {schema}.ingest_position \
     set paused_since = coalesce(paused_since, now()), pause_error = $2 where slot = $1";

/// Records that slot `$1`'s ingest stopped on a definite error (`$2`).
const RECORD_INGEST_STOP: &str = "update {schema}.ingest_position \
     set paused_since = coalesce(paused_since, now()), pause_error = $2, stopped = true \
     where slot = $1";

/// Records that ingest through `slot` stopped for good (a definite error, `error`) while
/// the other sources go on; fenced like [`record_pause`]. The next append clears it.
pub async fn record_ingest_stop(
    client: &mut Client,
    fence: &Fence,
    schema: &Schema,
    slot: &str,
    error: &str,
) -> Result<(), StoreError> {
    let sql = schema.sql(RECORD_INGEST_STOP);
    fenced_ingest_write(
        client,
        fence,
        &sql,
        slot,
        error,
        "recording that ingest stopped",
    )
    .await
}

/// Records why ingest through `slot` is paused; fenced like [`record_pause`]. The next
/// append that commits clears it.
pub async fn record_ingest_pause(
    client: &mut Client,
    fence: &Fence,
    schema: &Schema,
    slot: &str,
    error: &str,
) -> Result<(), StoreError> {
    let sql = schema.sql(RECORD_INGEST);
    fenced_ingest_write(
        client,
        fence,
        &sql,
        slot,
        error,
        "recording an ingest pause",
    )
    .await
}

/// Runs `sql` (`$1` the slot, `$2` the error) in a transaction the fence checks.
async fn fenced_ingest_write(
    client: &mut Client,
    fence: &Fence,
    sql: &str,
    slot: &str,
    error: &str,
    doing: &'static str,
) -> Result<(), StoreError> {
    let tx = client.transaction().await.map_err(StoreError::db(doing))?;
    fence.check(&tx).await?;
    tx.execute(sql, &[&slot, &error])
        .await
        .map_err(StoreError::db(doing))?;
    tx.commit().await.map_err(StoreError::db(doing))?;
    Ok(())
}

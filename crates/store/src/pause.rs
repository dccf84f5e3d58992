//! Paused projector partitions, recorded for `walfold status` (and cleared on resume).
//! Best effort by nature: the error that paused a partition may keep these writes from
//! landing too, so logs and metrics say it as well.

use tokio_postgres::Client;

use crate::error::StoreError;
use crate::leader::Fence;
use walfold_config::quote_ident;

/// Records (or updates) why `partition` of `subscriber` is paused; fenced, so a deposed
/// leader cannot leave a pause behind that nothing would clear.
pub async fn record_pause(
    client: &mut Client,
    fence: &Fence,
    schema: &str,
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
        &format!(
            "insert into {}.projection_pause as p (subscriber_id, partition, sqlstate, error) \
                 values ($1, $2, $3, $4) on conflict (subscriber_id, partition) do update \
                 set sqlstate = excluded.sqlstate, error = excluded.error, updated_at = now()",
            quote_ident(schema)
        ),
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
    schema: &str,
) -> Result<(), StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("clearing pauses"))?;
    fence.check(&tx).await?;
    tx.execute(
        &format!("delete from {}.projection_pause", quote_ident(schema)),
        &[],
    )
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
    schema: &str,
    subscriber: &str,
    partition: u32,
) -> Result<(), StoreError> {
    client
        .execute(
            &format!(
                "delete from {}.projection_pause where subscriber_id = $1 and partition = $2",
                quote_ident(schema)
            ),
            &[&subscriber, &(partition as i32)],
        )
        .await
        .map_err(StoreError::db("clearing a pause"))?;
    Ok(())
}

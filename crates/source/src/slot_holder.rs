//! A slot still held by a walsender of a leader that is gone: a killed leader's ends
//! with its connection, but a frozen or cut-off one's walsender stays `active` until
//! `wal_sender_timeout` (a minute by default), and the new leader could not stream
//! meanwhile. So the leader, after proving inside a transaction on the target that it
//! still leads (a deposed one that has not noticed yet must not end its successor's),
//! ends the walsender that holds its slot, and streams.

use std::time::Duration;

use tokio_postgres::Client;
use walfold_config::SourceView;
use walfold_store::Fence;

use crate::error::SourceError;

/// The backend holding `$1`, if another one does.
const HOLDER: &str = "select active_pid from pg_replication_slots \
     where slot_name = $1 and active_pid is not null and active_pid <> pg_backend_pid()";

/// Ends the walsender holding this source's slot, if one does (see the module docs), and
/// waits up to a few seconds for the slot to be free.
pub(crate) async fn end_stale_holder(
    source: &Client,
    config: &SourceView<'_>,
    fence: &Fence,
) -> Result<(), SourceError> {
    let slot = &config.source().slot;
    let Some(row) = source
        .query_opt(HOLDER, &[slot])
        .await
        .map_err(walfold_store::StoreError::db("reading who holds the slot"))?
    else {
        return Ok(());
    };
    let pid: i32 = row
        .try_get(0)
        .map_err(walfold_store::StoreError::db("reading who holds the slot"))?;
    let mut target = walfold_pg::connect(config.target_url()).await?;
    let tx = target
        .transaction()
        .await
        .map_err(walfold_store::StoreError::db("proving leadership"))?;
    fence.check(&tx).await?;
    drop(tx);
    match source
        .query_one("select pg_terminate_backend($1)", &[&pid])
        .await
    {
        Ok(_) => {
            tracing::info!(slot = %slot, pid, "ended the walsender that held the slot: a previous leader's, gone")
        }
        Err(e) if walfold_event::is_insufficient_privilege(walfold_pg::sqlstate(&e)) => {
            tracing::warn!(slot = %slot, pid, "the slot is held by a walsender this role may not end (another role's): streaming waits for wal_sender_timeout; run every instance as one role, or grant pg_signal_backend to walfold's role");
            return Ok(());
        }
        Err(e) => {
            return Err(walfold_store::StoreError::db("ending the slot's walsender")(e).into())
        }
    }
    for _ in 0..50 {
        let held = source
            .query_opt(HOLDER, &[slot])
            .await
            .map_err(walfold_store::StoreError::db("reading who holds the slot"))?;
        if held.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

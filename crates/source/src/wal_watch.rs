//! The source's WAL position, read on the source every second and recorded in the
//! target (`source_wal`), so `wait_for` can tell a position the source has not written
//! yet (an error) from one walfold has not read yet (a wait). The target's clock is read
//! before the source's position: a record made at or after a wait began was read on the
//! source after the caller took its position. Two statements on the source and two on the
//! target a second; a failure is only logged (the check is then skipped, never wrong).

use std::time::Duration;

use tokio_postgres::types::PgLsn;
use walfold_config::SourceConfig;
use walfold_event::Lsn;
use walfold_pg::{connect, RowExt};
use walfold_store::{wait, Schema, StoreError};

use crate::ingest::AbortOnDrop;

/// How often the source's position is read.
const PERIOD: Duration = Duration::from_secs(1);

/// Reads and records `source`'s WAL position every [`PERIOD`] until dropped.
pub(crate) fn watch(source: SourceConfig, target_url: String, schema: Schema) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut clients = None;
        loop {
            tick.tick().await;
            if clients.as_ref().is_none_or(
                |(s, t): &(tokio_postgres::Client, tokio_postgres::Client)| {
                    s.is_closed() || t.is_closed()
                },
            ) {
                clients = match (connect(&source.url).await, connect(&target_url).await) {
                    (Ok(s), Ok(t)) => Some((s, t)),
                    _ => None,
                };
            }
            let Some((s, t)) = &clients else { continue };
            if let Err(e) = once(s, t, &schema, &source.name).await {
                tracing::debug!(error = %e, "cannot record the source's WAL position");
                clients = None;
            }
        }
    }))
}

async fn once(
    source: &tokio_postgres::Client,
    target: &tokio_postgres::Client,
    schema: &Schema,
    name: &str,
) -> Result<(), StoreError> {
    let before = wait::target_now(target).await?;
    let lsn: Option<PgLsn> = source
        .query_one(wait::SOURCE_WAL, &[])
        .await
        .map_err(StoreError::db("reading the source's WAL position"))?
        .of("pg_current_wal_lsn")
        .col("lsn")?;
    if let Some(lsn) = lsn {
        wait::record_source_wal(target, schema, name, Lsn::from(lsn), before).await?;
    }
    Ok(())
}

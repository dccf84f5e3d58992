//! Source preparation, idempotent: checks `wal_level` and the outbox tables, then
//! creates the publication (on the outbox tables only) and the pgoutput slot if missing.
//!
//! The publication publishes inserts (and truncates) only. Publishing updates or deletes
//! would make PostgreSQL refuse the application's `delete from outbox` on a table without
//! a replica identity, breaking the common insert-then-delete outbox; and only inserts
//! are events anyway.

use tokio_postgres::Client;
use walfold_config::{Config, OnSlotLost};
use walfold_store::{EventLog, Lsn};

use crate::error::SourceError;

/// Checks the source and creates what is missing. `ingested_through` is the ingest
/// position recorded for this slot in the target: a slot is created only when nothing
/// was ingested through it yet, never silently re-created (that would hide lost events).
/// A lost slot is recreated only with `on_slot_lost = "recreate"`, and then the skipped
/// WAL range is recorded in `log` (opened before the slot is created, closed after).
pub async fn prepare_source(
    source: &Client,
    config: &Config,
    log: &mut EventLog,
) -> Result<(), SourceError> {
    let ingested_through = log
        .durable_lsn()
        .await
        .map_err(SourceError::store("reading the ingest position"))?;
    let db = |ctx: &str| {
        let ctx = ctx.to_owned();
        move |e| SourceError::Store {
            context: ctx,
            source: walfold_store::StoreError::Db {
                context: "source".into(),
                source: e,
            },
        }
    };
    let wal_level: String = source
        .query_one("select current_setting('wal_level')", &[])
        .await
        .map_err(db("reading wal_level"))?
        .get(0);
    if wal_level != "logical" {
        return Err(SourceError::WalLevel(wal_level));
    }
    let mut tables = Vec::new();
    for outbox in &config.outbox {
        let name = outbox.table_name();
        let exists: bool = source
            .query_one(
                "select exists (select 1 from pg_tables where schemaname = $1 and tablename = $2)",
                &[&name.schema, &name.name],
            )
            .await
            .map_err(db("looking up an outbox table"))?
            .get(0);
        if !exists {
            return Err(SourceError::MissingTable(name.to_string()));
        }
        tables.push(name);
    }
    let publication = &config.source.publication;
    let published: Option<Vec<String>> = source
        .query_opt(
            "select coalesce(array_agg(schemaname || '.' || tablename) \
             filter (where tablename is not null), '{}') \
             from pg_publication p left join pg_publication_tables t on t.pubname = p.pubname \
             where p.pubname = $1 group by p.pubname",
            &[publication],
        )
        .await
        .map_err(db("reading the publication"))?
        .map(|r| r.get(0));
    let list = tables
        .iter()
        .map(|t| t.quoted())
        .collect::<Vec<_>>()
        .join(", ");
    let quoted_pub = walfold_config::quote_ident(publication);
    match published {
        None => {
            source
                .batch_execute(&format!(
                    "create publication {quoted_pub} for table {list} with (publish = 'insert, truncate')"
                ))
                .await
                .map_err(db("creating the publication"))?;
            tracing::info!(publication = %publication, tables = %list, "created publication");
        }
        Some(current) => {
            let missing: Vec<_> = tables
                .iter()
                .filter(|t| !current.contains(&t.to_string()))
                .map(|t| t.quoted())
                .collect();
            if !missing.is_empty() {
                source
                    .batch_execute(&format!(
                        "alter publication {quoted_pub} add table {}",
                        missing.join(", ")
                    ))
                    .await
                    .map_err(db("adding tables to the publication"))?;
                tracing::info!(publication = %publication, added = %missing.join(", "), "added outbox tables to publication");
            }
        }
    }
    let slot = &config.source.slot;
    let existing = source
        .query_opt(
            "select plugin, slot_type, database = current_database(), wal_status, \
             confirmed_flush_lsn::text from pg_replication_slots where slot_name = $1",
            &[slot],
        )
        .await
        .map_err(db("reading the slot"))?;
    let recreate = config.source.on_slot_lost == OnSlotLost::Recreate;
    let create = || async {
        let lsn: String = source
            .query_one(
                "select lsn::text from pg_create_logical_replication_slot($1, 'pgoutput')",
                &[slot],
            )
            .await
            .map_err(db("creating the replication slot"))?
            .get(0);
        tracing::info!(slot = %slot, lsn = %lsn, "created replication slot");
        lsn.parse::<Lsn>()
            .map_err(|_| SourceError::Decode(format!("the server returned LSN {lsn}")))
    };
    match existing {
        None if ingested_through > Lsn::ZERO && recreate => {
            open_gap(log, slot, ingested_through, "missing").await?;
            let to = create().await?;
            // Crash window: the slot exists, the gap is open; the next start closes it.
            walfold_store::failpoint::hit("after_slot_recreated");
            close_gap(log, slot, to).await?;
            return Ok(());
        }
        None if ingested_through > Lsn::ZERO => {
            return Err(SourceError::Slot {
                slot: slot.clone(),
                problem: format!(
                    "is missing, but walfold had ingested through it up to {ingested_through}: \
                     events committed since then may be lost (logical slots do not survive a \
                     failover, or the slot was dropped). Create the slot with \
                     select pg_create_logical_replication_slot('{slot}', 'pgoutput'), run \
                     `walfold backfill --outbox <table>` for each outbox (events already in the \
                     log are recognised) if the outbox still holds the rows, and restart"
                ),
            });
        }
        None => {
            create().await?;
        }
        Some(row) => {
            let plugin: Option<String> = row.get(0);
            let same_db: Option<bool> = row.get(2);
            let wal_status: Option<String> = row.get(3);
            let confirmed: Option<String> = row.get(4);
            if plugin.as_deref() != Some("pgoutput") || same_db != Some(true) {
                return Err(SourceError::Slot {
                    slot: slot.clone(),
                    problem: "exists but is not a pgoutput slot of this database; choose another source.slot or drop it".into(),
                });
            }
            if wal_status.as_deref() == Some("lost") && recreate {
                open_gap(log, slot, ingested_through, "invalidated").await?;
                source
                    .execute("select pg_drop_replication_slot($1)", &[slot])
                    .await
                    .map_err(db("dropping the invalidated slot"))?;
                let to = create().await?;
                close_gap(log, slot, to).await?;
                return Ok(());
            }
            if wal_status.as_deref() == Some("lost") {
                return Err(SourceError::Slot {
                    slot: slot.clone(),
                    problem: "was invalidated (wal_status=lost): WAL it needed was removed, so events may be missing; investigate, then drop the slot and backfill".into(),
                });
            }
            // A gap opened by a run that died before closing it: the slot was created
            // and nothing has been read from it, so its position is its start.
            if let Some(start) = confirmed.and_then(|l| l.parse::<Lsn>().ok()) {
                close_gap(log, slot, start).await?;
            }
        }
    }
    Ok(())
}

fn log_gap<T>(r: Result<T, walfold_store::StoreError>) -> Result<T, SourceError> {
    r.map_err(SourceError::store("recording a slot gap"))
}

/// Records the start of a slot gap before the new slot is created.
async fn open_gap(log: &EventLog, slot: &str, from: Lsn, reason: &str) -> Result<(), SourceError> {
    tracing::error!(slot, from = %from, reason, "the slot was lost; recreating it (on_slot_lost = recreate): outbox rows committed after this LSN, until the new slot's start, may be missing; recorded in slot_gap");
    log_gap(log.open_gap(from, reason).await)
}

/// Closes an open slot gap at the new slot's start, saying what it covers.
async fn close_gap(log: &mut EventLog, slot: &str, to: Lsn) -> Result<(), SourceError> {
    if let Some(from) = log_gap(log.close_gap(to).await)? {
        if to < from {
            tracing::error!(slot, from = %from, to = %to, "the new slot starts before walfold's ingest position (a failover to a server that was behind?): the ingest position moved back; events after it are streamed again and recognised as duplicates");
        } else {
            tracing::error!(slot, from = %from, to = %to, "slot gap recorded: outbox rows committed in this WAL range may be missing from the event log");
        }
    }
    Ok(())
}

//! Source preparation, idempotent: checks `wal_level` and the outbox tables, then
//! creates the publication (on the outbox tables only) and the pgoutput slot if missing.
//!
//! The publication publishes inserts (and truncates) only. Publishing updates or deletes
//! would make PostgreSQL refuse the application's `delete from outbox` on a table without
//! a replica identity, breaking the common insert-then-delete outbox; and only inserts
//! are events anyway.
//!
//! A message outbox that any role can write to is refused too (see `writers`), unless
//! the config accepts that.
//!
//! A publication walfold would read wrongly is refused with the fix, never worked around:
//! one that sends other tables' changes (each would stop ingest), one that filters rows
//! or columns, one that names a partitioned outbox's rows by partition.

use tokio_postgres::{Client, Row};
use walfold_config::{quote_ident, OnSlotLost, OutboxConfig, QualifiedName, SourceView};
use walfold_event::Lsn;
use walfold_pg::{FromRow, RowExt};
use walfold_store::{EventLog, IngestCounts, StoreError};

use crate::error::{Refusal, SourceError};

/// For a slot walfold has read from, whether `source.publication` can go on reading it.
/// A slot decodes each change with the catalog as of that change, so a publication
/// created (or renamed) after the changes the slot holds is not there for them and the
/// stream would stop at the first. A stranger renamed `source.publication`, created the
/// new one as walfold's error suggested, and was then told to drop the slot (losing
/// events); the fix that loses nothing is the publication the slot was read through.
/// So: the configured publication goes on if it is the one recorded (or none is), or
/// provably older than anything the slot still decodes (its row older than the slot's
/// `catalog_xmin`); otherwise walfold refuses, naming the recorded publication (or, as
/// before walfold recorded it, those that publish the outbox tables) when it still
/// exists, else the lost-slot procedure.
async fn check_publication(
    source: &Client,
    config: &SourceView<'_>,
    recorded: Option<&str>,
    exists: bool,
    publishes_every_outbox: bool,
) -> Result<(), SourceError> {
    let slot = &config.source().slot;
    let publication = &config.source().publication;
    let db = |e| SourceError::from(StoreError::db("reading the slot and the publications")(e));
    if exists && recorded.is_none_or(|r| r == publication) {
        return Ok(());
    }
    // `older`: the publication's row, and the rows that put each outbox table in it, are
    // older than every catalog snapshot the slot still decodes with (pgoutput reads the
    // membership as of each change too), so every change the slot holds sees them. An
    // xid more than 2^31 old has a negative age: older still. Null when a row is missing.
    let (schemas, names): (Vec<String>, Vec<String>) = config
        .table_outboxes()
        .map(|(_, t)| (t.schema, t.name))
        .unzip();
    let slot_row = source
        .query_opt(
            "select s.wal_status, \
               (select (age(p.xmin) < 0 or age(p.xmin) > age(s.catalog_xmin)) \
                  and coalesce((select bool_and(age(r.xmin) < 0 or age(r.xmin) > age(s.catalog_xmin)) \
                                from pg_publication_rel r \
                                join pg_class c on c.oid = r.prrelid \
                                join pg_namespace n on n.oid = c.relnamespace \
                                join unnest($3::text[], $4::text[]) as o(nspname, relname) \
                                  using (nspname, relname) \
                                where r.prpubid = p.oid), true) \
                from pg_publication p where p.pubname = $2) as older \
             from pg_replication_slots s where s.slot_name = $1 and s.database = current_database()",
            &[slot, publication, &schemas, &names],
        )
        .await
        .map_err(db)?;
    let Some(slot_row) = slot_row else {
        // No slot (any more): the lost-slot checks decide.
        return Ok(());
    };
    let slot_row = slot_row.of("pg_replication_slots");
    let lost = slot_row.col::<Option<String>>("wal_status")?.as_deref() == Some("lost");
    if lost && config.source().on_slot_lost == OnSlotLost::Recreate {
        // Recreated below: its new changes are read through the configured publication.
        return Ok(());
    }
    if publishes_every_outbox && slot_row.col::<Option<bool>>("older")? == Some(true) {
        return Ok(());
    }
    let usable: Vec<String> = match recorded {
        // It was read through the configured one, which is gone: nothing else can.
        Some(r) if r == publication => Vec::new(),
        Some(r) => source
            .query(
                "select pubname::text as publication from pg_publication where pubname = $1",
                &[&r],
            )
            .await
            .map_err(db)?
            .iter()
            .map(|r| {
                r.of("pg_publication")
                    .col("publication")
                    .map_err(SourceError::from)
            })
            .collect::<Result<_, _>>()?,
        None => source
            .query(
                "select distinct p.pubname::text as publication from pg_publication_tables p \
                     join unnest($1::text[], $2::text[]) as o(schemaname, tablename) \
                       using (schemaname, tablename) where p.pubname <> $3 order by 1",
                &[&schemas, &names, publication],
            )
            .await
            .map_err(db)?
            .iter()
            .map(|r| {
                r.of("pg_publication")
                    .col("publication")
                    .map_err(SourceError::from)
            })
            .collect::<Result<_, _>>()?,
    };
    let what = if exists {
        format!("publication {publication} is not the one it was read through ({}) and may be newer than the changes it holds", recorded.unwrap_or("unknown"))
    } else {
        format!("publication {publication} does not exist")
    };
    let fix = match usable.as_slice() {
        [] => format!(
            "if the publication it was read through is gone, drop the slot (select \
             pg_drop_replication_slot('{slot}')) and start with on_slot_lost = \"recreate\" \
             (the skipped range is recorded in slot_gap; backfill the outbox for its rows)"
        ),
        [one] => format!("set source.publication back to {one}"),
        several => format!(
            "set source.publication back to the one it was read through: one of {}",
            several.join(", ")
        ),
    };
    Err(SourceError::Slot {
        slot: slot.clone(),
        problem: format!(
            "was read by walfold, but {what}: a publication created after the changes a slot \
             holds is not there for them (it reads the catalog as of each change), so walfold \
             does not use or create it; {fix}"
        ),
    })
}

/// How walfold creates its publication. Through the partition root: a partitioned
/// outbox's rows then arrive under the outbox's name (otherwise under each partition's),
/// including partitions attached later.
const PUBLISH: &str = "publish = 'insert, truncate', publish_via_partition_root = true";

/// The statement that creates `source.publication` over the table outboxes (message
/// outboxes need no table: the publication then starts empty).
pub fn create_publication(config: &SourceView<'_>) -> String {
    let tables: Vec<String> = config.table_outboxes().map(|(_, t)| t.quoted()).collect();
    let for_tables = if tables.is_empty() {
        String::new()
    } else {
        format!(" for table {}", tables.join(", "))
    };
    format!(
        "create publication {}{for_tables} with ({PUBLISH})",
        quote_ident(&config.source().publication)
    )
}

/// Checks the source and creates what is missing. `ingested_through` is the ingest
/// position recorded for this slot in the target (the slot's start once walfold created
/// it): a slot is created only when none was ever used, never silently re-created (that
/// would hide lost events).
/// A lost slot is recreated only with `on_slot_lost = "recreate"`, and then the skipped
/// WAL range is recorded in `log` (opened before the slot is created, closed after).
pub async fn prepare_source(
    source: &Client,
    config: &SourceView<'_>,
    log: &mut EventLog,
) -> Result<(), SourceError> {
    let ingested_through = log.durable_lsn().await?;
    let db = |context: &'static str| move |e| SourceError::from(StoreError::db(context)(e));
    let wal_level: String = source
        .query_one("select current_setting('wal_level')", &[])
        .await
        .map_err(db("reading wal_level"))?
        .of("pg_settings")
        .col(0)?;
    if wal_level != "logical" {
        return Err(SourceError::WalLevel(wal_level));
    }
    let shape = inspect(source, config).await?;
    for warning in &shape.warnings {
        tracing::warn!("{warning}");
    }
    if let Some(refusal) = shape.refusals.into_iter().chain(shape.public_emit).next() {
        return Err(SourceError::Refused(refusal));
    }
    if ingested_through == Lsn::ZERO {
        if let Some(refusal) = shape.missing_columns.into_iter().next() {
            return Err(SourceError::Refused(refusal));
        }
    } else {
        for m in &shape.missing_columns {
            tracing::warn!(problem = %m.problem, fix = %m.fix, "rows still in the slot may have the column; ingest stops at the first row without it");
        }
    }
    let publication = &config.source().publication;
    let quoted_pub = walfold_config::quote_ident(publication);
    let list = |tables: &[QualifiedName]| {
        tables
            .iter()
            .map(QualifiedName::quoted)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let recorded = log.publication().await?;
    if ingested_through != Lsn::ZERO {
        check_publication(
            source,
            config,
            recorded.as_deref(),
            shape.publication_exists,
            shape.unpublished.is_empty(),
        )
        .await?;
    }
    if !shape.publication_exists {
        let tables: Vec<QualifiedName> = config.table_outboxes().map(|(_, t)| t).collect();
        source
            .batch_execute(&create_publication(config))
            .await
            .map_err(db("creating the publication"))?;
        tracing::info!(publication = %publication, tables = %list(&tables), "created publication");
    } else if !shape.unpublished.is_empty() {
        let missing = list(&shape.unpublished);
        source
            .batch_execute(&format!(
                "alter publication {quoted_pub} add table {missing}"
            ))
            .await
            .map_err(db("adding tables to the publication"))?;
        tracing::info!(publication = %publication, added = %missing, "added outbox tables to publication");
    }
    let slot = &config.source().slot;
    let existing = source
        .query_opt(
            "select plugin, slot_type, database = current_database() as same_database, \
             wal_status, confirmed_flush_lsn::text as confirmed_flush_lsn \
             from pg_replication_slots where slot_name = $1",
            &[slot],
        )
        .await
        .map_err(db("reading the slot"))?;
    let recreate = config.source().on_slot_lost == OnSlotLost::Recreate;
    let create = || async {
        // A failover slot on PostgreSQL 17 and later (see `ha`).
        let version = crate::ha::server_version(source)
            .await
            .map_err(db("reading server_version_num"))?;
        let lsn: String = source
            .query_one(crate::ha::create_slot_sql(version), &[slot])
            .await
            .map_err(db("creating the replication slot"))?
            .of("pg_create_logical_replication_slot")
            .col(0)?;
        tracing::info!(slot = %slot, lsn = %lsn, "created replication slot");
        lsn.parse::<Lsn>()
            .map_err(|_| SourceError::Decode(format!("the server returned LSN {lsn}")))
    };
    match existing {
        None if ingested_through > Lsn::ZERO && recreate => {
            let reason = match log.last_failover().await {
                Ok(Some(f)) if ingested_through <= f.fork => "failover",
                _ => "missing",
            };
            open_gap(log, slot, ingested_through, reason).await?;
            let to = create().await?;
            // Crash window: the slot exists, the gap is open; the next start closes it.
            walfold_telemetry::failpoint::hit("after_slot_recreated");
            close_gap(log, slot, to).await?;
            log.failover_slot_checked().await?;
            return record_publication(log, publication).await;
        }
        None if ingested_through > Lsn::ZERO => {
            // After a failover the position is the fork (or before it): say so.
            let failover = log
                .last_failover()
                .await?
                .filter(|f| ingested_through <= f.fork);
            let since = match &failover {
                Some(f) if f.ingested > f.fork => format!(
                    "the source failed over from timeline {} to {}, forking at {}: events \
                     committed on the new primary since the fork may be lost, and walfold read \
                     events from the old primary up to {} that the new one may not have \
                     (phantoms)",
                    f.from_timeline, f.to_timeline, f.fork, f.ingested
                ),
                Some(f) => format!(
                    "the source failed over from timeline {} to {}, forking at {}: events \
                     committed on the new primary since {ingested_through} may be lost",
                    f.from_timeline, f.to_timeline, f.fork
                ),
                None => "events committed since then may be lost (logical slots do not \
                         survive a failover, or the slot was dropped)"
                    .into(),
            };
            return Err(SourceError::Slot {
                slot: slot.clone(),
                problem: format!(
                    "is missing, but walfold had ingested through it up to {ingested_through} \
                     (source `{name}`): {since}. Create the slot with \
                     select pg_create_logical_replication_slot('{slot}', 'pgoutput'), run \
                     `walfold backfill --outbox <table>` for each table outbox (events already \
                     in the log are recognised) if the outbox still holds the rows, and \
                     restart{messages}",
                    name = config.source().name,
                    messages = if config.outboxes().any(|o| o.message_prefix.is_some()) {
                        ". Message outboxes cannot be backfilled: their events in the gap are \
                         lost; on_slot_lost = \"recreate\" records the gap in slot_gap"
                    } else {
                        ""
                    }
                ),
            });
        }
        None => {
            // A new slot name for a source that ingested through another slot, which
            // still exists: the events written since wait there, and a new slot would
            // start after them.
            let others = log.other_slots().await?;
            for (old, through) in others {
                let waiting: bool = source
                    .query_one(
                        "select exists (select from pg_replication_slots \
                         where slot_name = $1 and database = current_database())",
                        &[&old],
                    )
                    .await
                    .map_err(db("reading the slot"))?
                    .of("pg_replication_slots")
                    .col(0)?;
                if waiting {
                    return Err(SourceError::Slot {
                        slot: slot.clone(),
                        problem: format!(
                            "does not exist, but source `{name}` ingested through slot {old} \
                             (up to {through}), which still exists: the events written since \
                             wait in it, and a new slot would start after them. Set the \
                             source's slot back to `{old}`. To move to a new slot on purpose, \
                             drop the old one first (select pg_drop_replication_slot('{old}')) \
                             and backfill what it held",
                            name = config.source().name
                        ),
                    });
                }
            }
            let start = create().await?;
            record_start(log, start).await?;
        }
        Some(row) => {
            let ExistingSlot {
                plugin,
                same_db,
                wal_status,
                confirmed,
            } = ExistingSlot::from_row(&row)?;
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
                log.failover_slot_checked().await?;
                return record_publication(log, publication).await;
            }
            if wal_status.as_deref() == Some("lost") {
                return Err(SourceError::Slot {
                    slot: slot.clone(),
                    problem: "was invalidated (wal_status=lost): WAL it needed was removed, so events may be missing; investigate, then drop the slot and backfill".into(),
                });
            }
            // After a failover: a slot on the new primary past the fork is a gap (see
            // `ha`); checked before a gap left open below is closed.
            let at = confirmed.as_deref().and_then(|l| l.parse::<Lsn>().ok());
            crate::ha::slot_after_failover(log, slot, ingested_through, at).await?;
            // A gap opened by a run that died before closing it: the slot was created
            // and nothing has been read from it, so its position is its start.
            if let Some(start) = confirmed.and_then(|l| l.parse::<Lsn>().ok()) {
                let closed = close_gap(log, slot, start).await?;
                // Created by a run that died before recording it, or by a version that
                // did not record it.
                if ingested_through == Lsn::ZERO {
                    record_start(log, start).await?;
                } else if !closed {
                    // Read again: a failover's gap (above) moved it to the slot's start.
                    let recorded = log.durable_lsn().await?;
                    if start > recorded && log.acks_recorded().await? {
                        advanced(log, slot, recorded, start).await?;
                    }
                }
            }
        }
    }
    record_publication(log, publication).await
}

/// The slot as [`prepare_source`] finds it.
struct ExistingSlot {
    plugin: Option<String>,
    /// Whether it is a slot of this database.
    same_db: Option<bool>,
    wal_status: Option<String>,
    /// As PostgreSQL writes a `pg_lsn`.
    confirmed: Option<String>,
}

impl FromRow for ExistingSlot {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("pg_replication_slots");
        Ok(ExistingSlot {
            plugin: r.col("plugin")?,
            same_db: r.col("same_database")?,
            wal_status: r.col("wal_status")?,
            confirmed: r.col("confirmed_flush_lsn")?,
        })
    }
}

/// Records the publication the slot is read through, once the checks above passed.
async fn record_publication(log: &EventLog, publication: &str) -> Result<(), SourceError> {
    Ok(log.record_publication(publication).await?)
}

/// Records a slot's start as the ingest position when walfold created the slot. Until
/// then the position is 0/0, which means "no slot was ever used": a slot lost after a
/// backfill, or before the first event, would be recreated silently and the WAL
/// committed in between skipped. From here on its loss is detected like any other.
async fn record_start(log: &mut EventLog, start: Lsn) -> Result<(), SourceError> {
    log.append(&[], &[], Some(start), IngestCounts::default())
        .await?;
    Ok(())
}

/// Records the start of a slot gap before the new slot is created.
async fn open_gap(log: &EventLog, slot: &str, from: Lsn, reason: &str) -> Result<(), SourceError> {
    tracing::error!(slot, from = %from, reason, "the slot was lost; recreating it (on_slot_lost = recreate): outbox rows committed after this LSN, until the new slot's start, may be missing; recorded in slot_gap");
    Ok(log.open_gap(from, reason).await?)
}

/// Closes an open slot gap at the new slot's start, saying what it covers; whether one
/// was open.
async fn close_gap(log: &mut EventLog, slot: &str, to: Lsn) -> Result<bool, SourceError> {
    let Some(from) = log.close_gap(to).await? else {
        return Ok(false);
    };
    if to < from {
        tracing::error!(slot, from = %from, to = %to, "the new slot starts before walfold's ingest position (a failover to a server that was behind?): the ingest position moved back; events after it are streamed again and recognised as duplicates");
    } else {
        tracing::error!(slot, from = %from, to = %to, "slot gap recorded: outbox rows committed in this WAL range may be missing from the event log");
    }
    Ok(true)
}

/// The slot was moved past the recorded ingest position by something other than walfold
/// (which acknowledges only what it recorded): `pg_replication_slot_advance`, or another
/// client reading the slot. The rows committed in between were never streamed: the range
/// is recorded as a gap, which `fill_gaps` backfills from the table outboxes next.
async fn advanced(log: &mut EventLog, slot: &str, from: Lsn, to: Lsn) -> Result<(), SourceError> {
    tracing::error!(slot, from = %from, to = %to, "the slot was moved past walfold's ingest position by something other than walfold (pg_replication_slot_advance, or another client reading the slot): outbox rows committed in between were not streamed; recorded in slot_gap and backfilled from the table outboxes now (a message outbox's events there are lost)");
    record_gap(log, "advanced", from, to).await
}

/// Records the WAL range `from`..`to` as a closed slot gap for `fill_gaps` to backfill.
/// A crash between its two writes leaves the gap open, and the next start closes it at
/// the slot's position: a wider backfill, nothing lost.
async fn record_gap(
    log: &mut EventLog,
    reason: &str,
    from: Lsn,
    to: Lsn,
) -> Result<(), SourceError> {
    log.open_gap(from, reason).await?;
    log.close_gap(to).await?;
    Ok(())
}

/// What identifies the database `client` is connected to, whatever URL reached it: its
/// name and oid, the server's start time and port. Two sources with the same identity
/// would read one outbox twice.
pub async fn database_identity(client: &Client) -> Result<String, StoreError> {
    Ok(client
        .query_one(
            "select current_database() || '/' || d.oid::text || '/' || \
             pg_postmaster_start_time()::text || '/' || current_setting('port') \
             from pg_database d where d.datname = current_database()",
            &[],
        )
        .await
        .map_err(|source| StoreError::Db {
            context: "reading the database's identity".into(),
            source,
        })?
        .of("pg_database")
        .col(0)?)
}

/// The configured outboxes and publication as the source's catalog has them.
#[derive(Debug, Default)]
pub struct SourceShape {
    /// Everything that stops walfold, in config order.
    pub refusals: Vec<Refusal>,
    /// Worth a look, not wrong (a column that differs from the config only in case).
    pub warnings: Vec<String>,
    /// Required columns the outbox tables lack now. Refused on a first start; once
    /// walfold has ingested, rows in the slot may still have them (a column renamed
    /// since), so the stream decides per transaction ([`SourceError::OutboxChanged`]).
    pub missing_columns: Vec<Refusal>,
    pub publication_exists: bool,
    /// Message outboxes any role can write to (`pg_logical_emit_message` executable by
    /// PUBLIC) without `allow_public_emit`: refused like [`SourceShape::refusals`].
    pub public_emit: Option<Refusal>,
    /// Outboxes not yet in the existing publication (walfold adds them).
    pub unpublished: Vec<QualifiedName>,
    /// Whether the publication publishes through partition roots.
    pub via_root: bool,
    /// Outboxes that are partitioned tables.
    pub partitioned: Vec<QualifiedName>,
}

/// The publication's signature: the xmins of its `pg_publication` row and of its
/// `pg_publication_rel` rows (with their oids), which any rewrite of it changes, and the
/// slot's confirmed position.
pub(crate) async fn publication_signature(
    source: &Client,
    config: &SourceView<'_>,
) -> Result<Option<(String, Option<Lsn>)>, StoreError> {
    let row = source
        .query_opt(
            "select p.xmin::text || '/' || coalesce((select string_agg(r.oid::text || ':' || \
               r.xmin::text, ',' order by r.oid) from pg_publication_rel r \
               where r.prpubid = p.oid), '') as signature, \
             (select s.confirmed_flush_lsn from pg_replication_slots s \
               where s.slot_name = $2) as confirmed \
             from pg_publication p where p.pubname = $1",
            &[&config.source().publication, &config.source().slot],
        )
        .await
        .map_err(StoreError::db("reading the publication's signature"))?;
    row.map(|r| {
        let r = r.of("pg_publication");
        let confirmed: Option<tokio_postgres::types::PgLsn> = r.col("confirmed")?;
        Ok((r.col("signature")?, confirmed.map(Lsn::from)))
    })
    .transpose()
}

/// Compares the publication with what walfold recorded of it: rewritten since (even if
/// undone: an outbox out of it for a while, a row filter added and removed), the rows
/// committed meanwhile may never have been streamed, so the range from the recorded
/// position is recorded as a slot gap, which `fill_gaps` backfills next. Then records
/// what it is now.
pub(crate) async fn publication_rewritten(
    source: &Client,
    config: &SourceView<'_>,
    log: &mut EventLog,
) -> Result<Option<String>, SourceError> {
    let Some((now, confirmed)) = publication_signature(source, config).await? else {
        return Ok(None);
    };
    let ingested = log.durable_lsn().await?;
    if let Some((before, at)) = log.publication_signature().await? {
        if before != now && ingested > Lsn::ZERO {
            let from = at.min(ingested);
            tracing::error!(publication = %config.source().publication, from = %from, "the publication was rewritten since walfold last looked (an outbox taken out and put back, a row filter added and removed, …): rows committed meanwhile may not have been streamed; recorded as a slot gap and backfilled from the table outboxes now");
            record_gap(log, "publication", from, ingested).await?;
        }
    }
    if let Some(at) = confirmed {
        log.record_publication_signature(&now, at).await?;
    }
    Ok(Some(now))
}

/// What changed on the source since [`prepare_source`] passed that makes the stream
/// leave events out, checked while walfold runs: the publication dropped, an outbox
/// table taken out of it (or replaced by a new table of its name), a row filter added,
/// or anything else [`prepare_source`] refuses. pgoutput never says so: the outbox's
/// changes just stop coming. The fix says how to get back what was left out.
pub(crate) async fn changed_while_running(
    source: &Client,
    config: &SourceView<'_>,
) -> Result<Option<Refusal>, StoreError> {
    let shape = inspect(source, config).await?;
    let publication = &config.source().publication;
    // (what changed, whether it certainly left rows out)
    let found = if !shape.publication_exists {
        Some((
            Refusal {
                problem: format!("publication {publication} was dropped"),
                fix: format!("create it again: {}", create_publication(config).trim()),
            },
            true,
        ))
    } else if let Some(table) = shape.unpublished.first() {
        Some((
            Refusal {
                problem: format!(
                    "outbox table {table} is no longer in publication {publication} (taken out, \
                 or replaced by a new table of its name)"
                ),
                fix: format!(
                    "alter publication {} add table {}",
                    walfold_config::quote_ident(publication),
                    table.quoted()
                ),
            },
            true,
        ))
    } else {
        shape.refusals.into_iter().next().map(|r| (r, false))
    };
    let Some((r, lossy)) = found else {
        return Ok(None);
    };
    let tables: Vec<String> = config
        .table_outboxes()
        .map(|(_, t)| format!("`walfold backfill --outbox {t}`"))
        .collect();
    Ok(Some(Refusal {
        problem: format!(
            "while walfold ran, {}: {}",
            r.problem,
            if lossy {
                "the outbox rows written since were not streamed"
            } else {
                "walfold stops before it reads the stream through it (if the change left \
                 outbox rows out meanwhile, they were not streamed)"
            }
        ),
        fix: format!(
            "{}; then, with walfold stopped, {} reads any rows the stream left out (events \
             already in the log are recognised), and start walfold again",
            r.fix,
            if tables.is_empty() {
                "nothing can be backfilled for a message outbox".to_owned()
            } else {
                tables.join(", ")
            }
        ),
    }))
}

/// Reads what [`prepare_source`] and `walfold doctor` check: each outbox (a table, not
/// a partition, with the required columns) and the publication (membership compared
/// with what was added to it, `pg_publication_rel`, not with `pg_publication_tables`,
/// which lists the partitions of a partitioned table).
pub async fn inspect(source: &Client, config: &SourceView<'_>) -> Result<SourceShape, StoreError> {
    let db = |source| StoreError::Db {
        context: "source".into(),
        source,
    };
    let mut shape = SourceShape::default();
    let version: i32 = source
        .query_one("select current_setting('server_version_num')::int", &[])
        .await
        .map_err(db)?
        .of("pg_settings")
        .col(0)?;
    let mut outboxes = Vec::new();
    for (i, outbox) in config.outboxes().enumerate() {
        let Some(name) = outbox.table_name() else {
            continue;
        };
        let row = source
            .query_opt(
                "select c.relkind::text as kind, c.relispartition as is_partition, \
                 rn.nspname::text as root_schema, rc.relname::text as root_name, \
                 array(select a.attname::text from pg_attribute a where a.attrelid = c.oid \
                       and a.attnum > 0 and not a.attisdropped order by a.attnum) as columns, \
                 array(select a.atttypid::int8 from pg_attribute a where a.attrelid = c.oid \
                       and a.attnum > 0 and not a.attisdropped order by a.attnum) as types \
                 from pg_class c join pg_namespace n on n.oid = c.relnamespace \
                 left join pg_class rc on c.relispartition and rc.oid = pg_partition_root(c.oid) \
                 left join pg_namespace rn on rn.oid = rc.relnamespace \
                 where n.nspname = $1 and c.relname = $2",
                &[&name.schema, &name.name],
            )
            .await
            .map_err(db)?;
        let Some(row) = row else {
            let similar: Option<(String, String)> = source
                .query_opt(
                    "select n.nspname::text, c.relname::text from pg_class c \
                     join pg_namespace n on n.oid = c.relnamespace \
                     where lower(n.nspname) = lower($1) and lower(c.relname) = lower($2) \
                     and c.relkind in ('r', 'p') limit 1",
                    &[&name.schema, &name.name],
                )
                .await
                .map_err(db)?
                .map(|r| {
                    let r = r.of("pg_class");
                    Ok::<_, StoreError>((r.col(0)?, r.col(1)?))
                })
                .transpose()?;
            let fix = match similar {
                Some((schema, table)) => format!(
                    "names are case-sensitive: set outbox[{i}].table = \"{schema}.{table}\""
                ),
                None => "create it or fix [[outbox]] table in the config".into(),
            };
            shape.refusals.push(Refusal {
                problem: format!("outbox table {name} does not exist in the source database"),
                fix,
            });
            continue;
        };
        let row = row.of("pg_class");
        let (kind, is_partition): (String, bool) = (row.col("kind")?, row.col("is_partition")?);
        let columns: Vec<String> = row.col("columns")?;
        let types: Vec<i64> = row.col("types")?;
        if is_partition {
            let root = format!(
                "{}.{}",
                row.col::<String>("root_schema")?,
                row.col::<String>("root_name")?
            );
            shape.refusals.push(Refusal {
                problem: format!("outbox table {name} is a partition of {root}"),
                fix: format!(
                    "set outbox[{i}].table = \"{root}\": walfold follows a partitioned outbox \
                     through its root, every partition included"
                ),
            });
            continue;
        }
        if kind != "r" && kind != "p" {
            shape.refusals.push(Refusal {
                problem: format!("outbox {name} is not a table (relkind {kind})"),
                fix: "logical replication publishes tables only: point [[outbox]] table at the table the application writes".into(),
            });
            continue;
        }
        if kind == "p" {
            shape.partitioned.push(name.clone());
        }
        let expanding = outbox.set("expand").is_some();
        if expanding && columns.iter().any(|c| c == crate::outbox::ELEMENT) {
            shape.refusals.push(Refusal {
                problem: format!(
                    "outbox table {name} has a column `element`, and outbox[{i}].expand names \
                     each element `element` in the other fields' expressions"
                ),
                fix: "rename the column (or leave expand out): the pseudo-column would hide it"
                    .into(),
            });
        }
        for f in outbox.fields() {
            let key = f.name();
            let Some(read) = crate::outbox::columns_read(f.value, f.is_column()) else {
                continue;
            };
            for column in &read {
                if expanding && f.key != "expand" && column == crate::outbox::ELEMENT {
                    continue;
                }
                if let Some(at) = columns.iter().position(|c| c == column) {
                    let type_oid = types.get(at).map_or(0, |t| *t as u32);
                    // A column as the row filter is a boolean one; any other would make
                    // every row a dead letter ("not a boolean"), as PostgreSQL refuses
                    // `where <text column>` before running it.
                    if f.key == "where" && f.is_column() && type_oid != walfold_pgoutput::oid::BOOL
                    {
                        let name_in_expr = if column.chars().any(|c| c.is_ascii_uppercase()) {
                            format!("\\\"{column}\\\"")
                        } else {
                            column.clone()
                        };
                        shape.refusals.push(Refusal {
                            problem: format!(
                                "outbox table {name} column `{column}` (outbox[{i}].where) is \
                                 not boolean: every row would be a dead letter"
                            ),
                            fix: format!(
                                "set outbox[{i}].where to a boolean column or a condition on \
                                 this one, e.g. where = \"{name_in_expr} = '…'\""
                            ),
                        });
                    }
                    if let Some(why) = crate::outbox::unreadable_type(type_oid) {
                        shape.refusals.push(Refusal {
                            problem: format!(
                                "outbox table {name} column `{column}` (outbox[{i}].{key}) {why}"
                            ),
                            fix: crate::outbox::unreadable_fix(&format!("outbox[{i}].{key}")),
                        });
                    }
                    continue;
                }
                // Left out, and the table has no such column: the table's name.
                if f.key == "aggregate_type" && !f.set {
                    continue;
                }
                let similar = columns.iter().find(|c| c.eq_ignore_ascii_case(column));
                let required = OutboxConfig::REQUIRED.contains(&f.key)
                    || matches!(f.key, "where" | "expand")
                    || !f.is_column();
                if required {
                    let (problem, fix) = if f.is_column() {
                        (
                            format!(
                                "outbox table {name} has no column `{column}` (outbox[{i}].{key})"
                            ),
                            match similar {
                                Some(c) => format!(
                                    "names are case-sensitive: set outbox[{i}].{key} = \"{c}\""
                                ),
                                None => {
                                    format!("set outbox[{i}].{key} to the column that holds it")
                                }
                            },
                        )
                    } else {
                        (
                            format!(
                                "outbox table {name} has no column `{column}`, which \
                                 outbox[{i}].{key} (`{}`) reads",
                                f.value
                            ),
                            match similar {
                                Some(c) => format!(
                                    "in an expression, unquoted names fold to lower case as in \
                                     PostgreSQL: quote it, \"{c}\""
                                ),
                                None => format!("fix outbox[{i}].{key}"),
                            },
                        )
                    };
                    shape.missing_columns.push(Refusal { problem, fix });
                } else if let Some(c) = similar {
                    shape.warnings.push(format!(
                        "outbox table {name} has no column `{column}` but has `{c}`: names are \
                         case-sensitive; set outbox[{i}].{key} = \"{c}\" to map it"
                    ));
                }
            }
        }
        outboxes.push(name);
    }

    let emit = crate::writers::public_emit(
        source,
        config.outboxes(),
        config.source().heartbeat_interval_s > 0,
    )
    .await?;
    shape.public_emit = emit.refusal;
    shape.warnings.extend(emit.warnings);

    let publication = &config.source().publication;
    let quoted_pub = quote_ident(publication);
    let Some(row) = source
        .query_opt(
            "select puballtables, pubinsert, pubviaroot from pg_publication where pubname = $1",
            &[publication],
        )
        .await
        .map_err(db)?
    else {
        return Ok(shape);
    };
    shape.publication_exists = true;
    let row = row.of("pg_publication");
    let (all_tables, inserts, via_root): (bool, bool, bool) = (
        row.col("puballtables")?,
        row.col("pubinsert")?,
        row.col("pubviaroot")?,
    );
    shape.via_root = via_root;
    let create = format!(
        "create a publication of the outbox tables only (create publication ... for table ... \
         with ({PUBLISH})) and set source.publication to it, or drop {quoted_pub} and let \
         walfold create it"
    );
    if all_tables {
        shape.refusals.push(Refusal {
            problem: format!("publication {publication} is FOR ALL TABLES: every other table's changes would stop ingest"),
            fix: create,
        });
        return Ok(shape);
    }
    // PostgreSQL 15 added schema publications, row filters and column lists.
    let pg15 = version >= 150_000;
    if pg15 {
        let schemas: Vec<String> = source
            .query(
                "select n.nspname::text from pg_publication_namespace pn \
                 join pg_namespace n on n.oid = pn.pnnspid \
                 join pg_publication p on p.oid = pn.pnpubid where p.pubname = $1 order by 1",
                &[publication],
            )
            .await
            .map_err(db)?
            .iter()
            .map(|r| r.of("pg_publication_namespace").col(0))
            .collect::<Result<_, _>>()?;
        if !schemas.is_empty() {
            shape.refusals.push(Refusal {
                problem: format!(
                    "publication {publication} is FOR TABLES IN SCHEMA {}: other tables' changes would stop ingest",
                    schemas.join(", ")
                ),
                fix: create,
            });
            return Ok(shape);
        }
    }
    if !inserts {
        shape.refusals.push(Refusal {
            problem: format!("publication {publication} does not publish inserts: no outbox row would reach walfold"),
            fix: format!("alter publication {quoted_pub} set (publish = 'insert, truncate')"),
        });
    }
    let filtered = if pg15 {
        "r.prqual is not null or r.prattrs is not null"
    } else {
        "false"
    };
    let members: Vec<(QualifiedName, bool)> = source
        .query(
            &format!(
                "select n.nspname::text as schema, c.relname::text as name, \
                 {filtered} as filtered from pg_publication_rel r \
                 join pg_class c on c.oid = r.prrelid join pg_namespace n on n.oid = c.relnamespace \
                 join pg_publication p on p.oid = r.prpubid where p.pubname = $1 order by 1, 2"
            ),
            &[publication],
        )
        .await
        .map_err(db)?
        .iter()
        .map(|r| {
            let r = r.of("pg_publication_rel");
            let name = QualifiedName {
                schema: r.col("schema")?,
                name: r.col("name")?,
            };
            Ok((name, r.col("filtered")?))
        })
        .collect::<Result<_, StoreError>>()?;
    let extra: Vec<&QualifiedName> = members
        .iter()
        .map(|(m, _)| m)
        .filter(|m| !config.table_outboxes().any(|(_, t)| t == **m))
        .collect();
    if !extra.is_empty() {
        let names = extra.iter().map(ToString::to_string).collect::<Vec<_>>();
        let quoted = extra.iter().map(|m| m.quoted()).collect::<Vec<_>>();
        shape.refusals.push(Refusal {
            problem: format!(
                "publication {publication} also publishes {}, which {} no [[outbox]]: each of their changes would stop ingest",
                names.join(", "),
                if extra.len() == 1 { "is" } else { "are" }
            ),
            fix: format!(
                "remove {} from it (alter publication {quoted_pub} drop table {}) or add {} as [[outbox]]",
                if extra.len() == 1 { "it" } else { "them" },
                quoted.join(", "),
                if extra.len() == 1 { "it" } else { "them" },
            ),
        });
    }
    for (member, filter) in &members {
        if *filter && outboxes.contains(member) {
            shape.refusals.push(Refusal {
                problem: format!("publication {publication} publishes {member} with a row filter or column list: rows or columns it leaves out would never reach walfold"),
                fix: format!("alter publication {quoted_pub} set table {} (add the other tables back in the same statement)", member.quoted()),
            });
        }
    }
    if !via_root && !shape.partitioned.is_empty() {
        let names = shape
            .partitioned
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>();
        shape.refusals.push(Refusal {
            problem: format!(
                "publication {publication} publishes the partitioned outbox {} under its partitions' names",
                names.join(", ")
            ),
            fix: format!("alter publication {quoted_pub} set (publish_via_partition_root = true)"),
        });
    }
    shape.unpublished = outboxes
        .into_iter()
        .filter(|o| !members.iter().any(|(m, _)| m == o))
        .collect();
    Ok(shape)
}

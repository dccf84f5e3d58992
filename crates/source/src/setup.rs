//! Source preparation, idempotent: checks `wal_level` and the outbox tables, then
//! creates the publication (on the outbox tables only) and the pgoutput slot if missing.
//!
//! The publication publishes inserts (and truncates) only. Publishing updates or deletes
//! would make PostgreSQL refuse the application's `delete from outbox` on a table without
//! a replica identity, breaking the common insert-then-delete outbox; and only inserts
//! are events anyway.
//!
//! A message outbox that any role can write to is refused too (see `writers`), unless
//! the config accepts that. What else is refused is the `verdict` on the catalog's
//! `shape`.

use tokio_postgres::Client;
use walfold_config::{OnSlotLost, QualifiedName, SourceView};
use walfold_event::{GapReason, Lsn};
use walfold_store::{EventLog, Failover, IngestCounts, StoreError};

use crate::error::{Refusal, SourceError};
use crate::shape::{self, create_publication, Outboxes, Slot};
use crate::verdict::Verdict;

pub(crate) use crate::shape::{database_identity, publication_signature};

/// Reads what [`prepare_source`] and `walfold doctor` check (each outbox: a table, not
/// a partition, with the required columns; the publication) and judges it.
pub async fn inspect(source: &Client, config: &SourceView<'_>) -> Result<Verdict, StoreError> {
    let outboxes = Outboxes::read(source, config).await?;
    judge(source, &outboxes, config).await
}

/// Judges `outboxes` (read from `source`) for `config`, with what the grants of
/// `pg_logical_emit_message` mean for its message outboxes.
pub async fn judge(
    source: &Client,
    outboxes: &Outboxes,
    config: &SourceView<'_>,
) -> Result<Verdict, StoreError> {
    let emit = crate::writers::public_emit(
        source,
        config.outboxes(),
        config.source().heartbeat_interval_s > 0,
    )
    .await?;
    Ok(Verdict::of(outboxes, config, emit))
}

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
    let publication = &config.source().publication;
    if exists && recorded.is_none_or(|r| r == publication) {
        return Ok(());
    }
    let Some(seen) = shape::seen_by_slot(source, config).await? else {
        // No slot (any more): the lost-slot checks decide.
        return Ok(());
    };
    let lost = seen.wal_status.as_deref() == Some("lost");
    if lost && config.source().on_slot_lost == OnSlotLost::Recreate {
        // Recreated below: its new changes are read through the configured publication.
        return Ok(());
    }
    if publishes_every_outbox && seen.older == Some(true) {
        return Ok(());
    }
    let usable: Vec<String> = match recorded {
        // It was read through the configured one, which is gone: nothing else can.
        Some(r) if r == publication => Vec::new(),
        Some(r) => shape::publication_named(source, r).await?,
        None => shape::publishing_outboxes(source, config).await?,
    };
    Err(publication_refused(config, recorded, exists, &usable))
}

/// Why the slot cannot go on through the configured publication, naming those it can
/// (`usable`).
fn publication_refused(
    config: &SourceView<'_>,
    recorded: Option<&str>,
    exists: bool,
    usable: &[String],
) -> SourceError {
    let slot = &config.source().slot;
    let publication = &config.source().publication;
    let what = if exists {
        format!("publication {publication} is not the one it was read through ({}) and may be newer than the changes it holds", recorded.unwrap_or("unknown"))
    } else {
        format!("publication {publication} does not exist")
    };
    let fix = match usable {
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
    SourceError::Slot {
        slot: slot.clone(),
        problem: format!(
            "was read by walfold, but {what}: a publication created after the changes a slot \
             holds is not there for them (it reads the catalog as of each change), so walfold \
             does not use or create it; {fix}"
        ),
    }
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
    let wal_level = shape::wal_level(source).await?;
    if wal_level != "logical" {
        return Err(SourceError::WalLevel(wal_level));
    }
    let outboxes = Outboxes::read(source, config).await?;
    let verdict = judge(source, &outboxes, config).await?;
    refuse(&verdict, ingested_through)?;
    let publication = &config.source().publication;
    let recorded = log.publication().await?;
    if ingested_through != Lsn::ZERO {
        check_publication(
            source,
            config,
            recorded.as_deref(),
            verdict.publication_exists,
            verdict.unpublished.is_empty(),
        )
        .await?;
    }
    publish(source, config, &verdict).await?;
    let slot = Slot::read(source, &config.source().slot, outboxes.version).await?;
    let at = SlotAt {
        source,
        config,
        version: outboxes.version,
        ingested_through,
    };
    match slot {
        None if ingested_through > Lsn::ZERO => {
            if config.source().on_slot_lost == OnSlotLost::Recreate {
                at.recreate_missing(log).await?;
            } else {
                let failover = log
                    .last_failover()
                    .await?
                    .filter(|f| ingested_through <= f.fork);
                return Err(missing_slot(config, ingested_through, failover.as_ref()));
            }
        }
        None => at.create_first(log).await?,
        Some(existing) => at.existing(log, existing).await?,
    }
    record_publication(log, publication).await
}

/// What stops [`prepare_source`] in the verdict, logging its warnings. A required column
/// the table lacks stops only a first start: once walfold has ingested, rows in the
/// slot may still have it, and the stream decides.
fn refuse(verdict: &Verdict, ingested_through: Lsn) -> Result<(), SourceError> {
    for warning in &verdict.warnings {
        tracing::warn!("{warning}");
    }
    if let Some(refusal) = verdict.refusals.iter().chain(&verdict.public_emit).next() {
        return Err(SourceError::Refused(refusal.clone()));
    }
    if ingested_through == Lsn::ZERO {
        if let Some(refusal) = verdict.missing_columns.first() {
            return Err(SourceError::MissingColumn(refusal.clone()));
        }
    } else {
        for m in &verdict.missing_columns {
            tracing::warn!(problem = %m.problem, fix = %m.fix, "rows still in the slot may have the column; ingest stops at the first row without it");
        }
    }
    Ok(())
}

/// Creates the publication, or adds the outbox tables it lacks.
async fn publish(
    source: &Client,
    config: &SourceView<'_>,
    verdict: &Verdict,
) -> Result<(), SourceError> {
    let publication = &config.source().publication;
    let list = |tables: &[QualifiedName]| {
        tables
            .iter()
            .map(QualifiedName::quoted)
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !verdict.publication_exists {
        let tables: Vec<QualifiedName> = config.table_outboxes().map(|(_, t)| t).collect();
        shape::create_publication_now(source, config).await?;
        tracing::info!(publication = %publication, tables = %list(&tables), "created publication");
    } else if !verdict.unpublished.is_empty() {
        shape::add_tables(source, publication, &verdict.unpublished).await?;
        tracing::info!(publication = %publication, added = %list(&verdict.unpublished), "added outbox tables to publication");
    }
    Ok(())
}

/// Why a slot walfold had ingested through cannot simply be created again. After a
/// failover the position is the fork (or before it): said so.
fn missing_slot(
    config: &SourceView<'_>,
    ingested_through: Lsn,
    failover: Option<&Failover>,
) -> SourceError {
    let since = match failover {
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
    let slot = &config.source().slot;
    SourceError::Slot {
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
    }
}

/// The source's slot as [`prepare_source`] finds it, and what it does about it.
struct SlotAt<'a> {
    source: &'a Client,
    config: &'a SourceView<'a>,
    /// The server's `server_version_num`.
    version: i32,
    ingested_through: Lsn,
}

impl SlotAt<'_> {
    fn slot(&self) -> &str {
        &self.config.source().slot
    }

    /// Creates the slot (a failover slot on PostgreSQL 17 and later, see `ha`): its start.
    async fn create(&self) -> Result<Lsn, SourceError> {
        let slot = self.slot();
        let lsn = shape::create_slot(self.source, slot, self.version).await?;
        tracing::info!(slot = %slot, lsn = %lsn, "created replication slot");
        lsn.parse::<Lsn>()
            .map_err(|_| SourceError::Decode(format!("the server returned LSN {lsn}")))
    }

    /// The slot walfold ingested through is gone and `on_slot_lost = "recreate"`: a new
    /// one, with the range between recorded as a gap.
    async fn recreate_missing(&self, log: &mut EventLog) -> Result<(), SourceError> {
        let reason = match log.last_failover().await {
            Ok(Some(f)) if self.ingested_through <= f.fork => GapReason::Failover,
            _ => GapReason::Missing,
        };
        open_gap(log, self.slot(), self.ingested_through, reason).await?;
        let to = self.create().await?;
        // Crash window: the slot exists, the gap is open; the next start closes it.
        walfold_telemetry::failpoint::hit("after_slot_recreated");
        close_gap(log, self.slot(), to).await?;
        log.failover_slot_checked().await?;
        Ok(())
    }

    /// No slot was ever used: creates it, unless the source ingested through another
    /// slot, which still exists: the events written since wait there, and a new slot
    /// would start after them.
    async fn create_first(&self, log: &mut EventLog) -> Result<(), SourceError> {
        for (old, through) in log.other_slots().await? {
            if shape::slot_exists(self.source, &old).await? {
                return Err(SourceError::Slot {
                    slot: self.slot().to_owned(),
                    problem: format!(
                        "does not exist, but source `{name}` ingested through slot {old} \
                         (up to {through}), which still exists: the events written since \
                         wait in it, and a new slot would start after them. Set the \
                         source's slot back to `{old}`. To move to a new slot on purpose, \
                         drop the old one first (select pg_drop_replication_slot('{old}')) \
                         and backfill what it held",
                        name = self.config.source().name
                    ),
                });
            }
        }
        let start = self.create().await?;
        record_start(log, start).await
    }

    /// The slot exists: refused when it is not walfold's kind, recreated when lost (with
    /// `on_slot_lost = "recreate"`), else checked against the ingest position.
    async fn existing(&self, log: &mut EventLog, existing: Slot) -> Result<(), SourceError> {
        let slot = self.slot();
        if existing.plugin.as_deref() != Some("pgoutput") || existing.same_database != Some(true) {
            return Err(SourceError::Slot {
                slot: slot.to_owned(),
                problem: "exists but is not a pgoutput slot of this database; choose another source.slot or drop it".into(),
            });
        }
        if existing.wal_status.as_deref() == Some("lost") {
            if self.config.source().on_slot_lost != OnSlotLost::Recreate {
                return Err(SourceError::Slot {
                    slot: slot.to_owned(),
                    problem: "was invalidated (wal_status=lost): WAL it needed was removed, so events may be missing; investigate, then drop the slot and backfill".into(),
                });
            }
            open_gap(log, slot, self.ingested_through, GapReason::Invalidated).await?;
            shape::drop_slot(self.source, slot).await?;
            let to = self.create().await?;
            close_gap(log, slot, to).await?;
            log.failover_slot_checked().await?;
            return Ok(());
        }
        let confirmed = existing
            .confirmed
            .as_deref()
            .and_then(|l| l.parse::<Lsn>().ok());
        // After a failover: a slot on the new primary past the fork is a gap (see
        // `ha`); checked before a gap left open below is closed.
        crate::ha::slot_after_failover(log, slot, self.ingested_through, confirmed).await?;
        // A gap opened by a run that died before closing it: the slot was created
        // and nothing has been read from it, so its position is its start.
        let Some(start) = confirmed else {
            return Ok(());
        };
        let closed = close_gap(log, slot, start).await?;
        // Created by a run that died before recording it, or by a version that
        // did not record it.
        if self.ingested_through == Lsn::ZERO {
            record_start(log, start).await?;
        } else if !closed {
            // Read again: a failover's gap (above) moved it to the slot's start.
            let recorded = log.durable_lsn().await?;
            if start > recorded && log.acks_recorded().await? {
                advanced(log, slot, recorded, start).await?;
            }
        }
        Ok(())
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
async fn open_gap(
    log: &EventLog,
    slot: &str,
    from: Lsn,
    reason: GapReason,
) -> Result<(), SourceError> {
    tracing::error!(slot, from = %from, reason = %reason, "the slot was lost; recreating it (on_slot_lost = recreate): outbox rows committed after this LSN, until the new slot's start, may be missing; recorded in slot_gap");
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
    record_gap(log, GapReason::Advanced, from, to).await
}

/// Records the WAL range `from`..`to` as a closed slot gap for `fill_gaps` to backfill.
/// A crash between its two writes leaves the gap open, and the next start closes it at
/// the slot's position: a wider backfill, nothing lost.
async fn record_gap(
    log: &mut EventLog,
    reason: GapReason,
    from: Lsn,
    to: Lsn,
) -> Result<(), SourceError> {
    log.open_gap(from, reason).await?;
    log.close_gap(to).await?;
    Ok(())
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
            record_gap(log, GapReason::Publication, from, ingested).await?;
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
    let verdict = inspect(source, config).await?;
    Ok(changed(verdict, config).map(|(r, lossy)| while_running(r, lossy, config)))
}

/// What [`changed_while_running`] found, and whether it certainly left rows out.
fn changed(verdict: Verdict, config: &SourceView<'_>) -> Option<(Refusal, bool)> {
    let publication = &config.source().publication;
    if !verdict.publication_exists {
        return Some((
            Refusal {
                problem: format!("publication {publication} was dropped"),
                fix: format!("create it again: {}", create_publication(config).trim()),
            },
            true,
        ));
    }
    if let Some(table) = verdict.unpublished.first() {
        return Some((
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
        ));
    }
    verdict.refusals.into_iter().next().map(|r| (r, false))
}

/// A change found while walfold ran, with how to get back what it left out.
fn while_running(r: Refusal, lossy: bool, config: &SourceView<'_>) -> Refusal {
    let tables: Vec<String> = config
        .table_outboxes()
        .map(|(_, t)| format!("`walfold backfill --outbox {t}`"))
        .collect();
    Refusal {
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
    }
}

//! A slot's source history: the system identifier and timeline its ingest position
//! belongs to, each failover walfold saw (`source_failover`), and slot gaps filled by a
//! backfill.
//!
//! On a failover the ingest position moves back to the fork in the same transaction
//! that records it: the new primary's WAL past the fork is not the WAL walfold read, so
//! nothing of it may count as ingested, and a slot lost with the old primary then opens
//! its gap at the fork.

use tokio_postgres::types::PgLsn;
use tokio_postgres::Row;
use uuid::Uuid;

use walfold_event::Lsn;

use crate::error::StoreError;
use crate::event_log::EventLog;
use walfold_pg::{FromRow, RowExt};

/// Slot `$1`'s recorded system identifier and timeline.
const IDENTITY: &str = "select system_id, timeline from {schema}.ingest_position where slot = $1";

/// Records slot `$1`'s system identifier `$2` and timeline `$3`.
const RECORD_IDENTITY: &str =
    "update {schema}.ingest_position set system_id = $2, timeline = $3 where slot = $1";

/// Records a failover of slot `$1` (source `$2`, system `$3`) from timeline `$4` to `$5`
/// forking at `$6`, with the ingest position and log head then; moves the position back
/// to the fork and records the new timeline. Returns the position before.
const RECORD_FAILOVER: &str =
    "with pos as (select lsn from {schema}.ingest_position where slot = $1 for update), \
     ins as (insert into {schema}.source_failover (slot, source, system_id, from_timeline, \
       to_timeline, fork_lsn, ingested_lsn, head_seq) \
       select $1, $2, $3, $4, $5, $6, pos.lsn, \
       (select coalesce(max(seq), 0) from {schema}.event_log) from pos), \
     upd as (update {schema}.ingest_position set lsn = least(lsn, $6), system_id = $3, \
       timeline = $5 where slot = $1), \
     gone as (delete from {schema}.source_horizon where slot = $1 and lsn > $6) \
     select lsn from pos";

/// Records slot `$1`'s horizon: position `$2`, xid `$3`; forgets those older than six
/// hours but the newest.
const RECORD_HORIZON: &str = "with ins as (insert into {schema}.source_horizon (slot, lsn, xid) \
       values ($1, $2, $3)) \
     delete from {schema}.source_horizon where slot = $1 \
       and recorded_at < now() - interval '6 hours'";

/// Slot `$1`'s last horizon at or before position `$2`.
const HORIZON_BEFORE: &str = "select lsn, xid from {schema}.source_horizon \
     where slot = $1 and lsn <= $2 order by lsn desc, xid desc limit 1";

/// Reports the backfill of slot `$1`'s unfilled gaps: `$2` rows scanned, xid bound `$3`.
const GAP_PROGRESS: &str = "update {schema}.slot_gap set scanned = $2, since_xid = $3, \
     progress_at = now() where slot = $1 and to_lsn is not null and backfilled is null";

/// Slot `$1`'s last failover whose slot was not checked yet: its fork.
const UNCHECKED_SLOT: &str = "select fork_lsn from {schema}.source_failover \
     where slot = $1 and slot_checked_at is null order by id desc limit 1";

/// Marks slot `$1`'s failovers' slots checked.
const SLOT_CHECKED: &str = "update {schema}.source_failover set slot_checked_at = now() \
     where slot = $1 and slot_checked_at is null";

/// Slot `$1`'s last failover.
const LAST_FAILOVER: &str = "select from_timeline, to_timeline, fork_lsn, ingested_lsn, head_seq \
     from {schema}.source_failover where slot = $1 order by id desc limit 1";

/// Records that slot `$1`'s closed gaps were backfilled (`$2` events appended); filled
/// when `$3`.
const FILL_GAPS: &str = "update {schema}.slot_gap set backfilled = $2, \
     filled_at = case when $3 then now() end \
     where slot = $1 and to_lsn is not null and backfilled is null";

/// Slot `$1`'s closed gaps no backfill has covered yet: (from, to).
const UNFILLED_GAPS: &str = "select from_lsn, to_lsn from {schema}.slot_gap \
     where slot = $1 and to_lsn is not null and backfilled is null order by id";

/// Slot `$1`'s last failover whose events past the fork are unchecked, if walfold read
/// past the fork: its id and those events (source `$2`, appended by then, committed
/// after the fork).
const PHANTOM_CANDIDATES: &str =
    "with f as (select id, fork_lsn, head_seq from {schema}.source_failover \
       where slot = $1 and phantoms_checked_at is null and ingested_lsn > fork_lsn \
       order by id desc limit 1) \
     select f.id, e.event_id, e.seq from f left join {schema}.event_log e \
       on e.source = $2 and e.seq <= f.head_seq and e.source_lsn > f.fork_lsn";

/// Records phantoms (`$2` IDs, `$3` seqs) of slot `$1`'s failover `$4` and marks its
/// check done.
const RECORD_PHANTOMS: &str = "with ins as (insert into {schema}.phantom_event \
       (event_id, seq, slot, failover_id) \
       select u.id, u.seq, $1, $4 from unnest($2::uuid[], $3::int8[]) as u(id, seq) \
       on conflict do nothing) \
     update {schema}.source_failover set phantoms_checked_at = now() where id = $4";

/// A failover walfold saw on a slot's source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failover {
    pub from_timeline: i64,
    pub to_timeline: i64,
    /// Where the new timeline forks from the one walfold read.
    pub fork: Lsn,
    /// The ingest position when walfold saw it (past `fork`: events read from the old
    /// timeline that the new primary may not have).
    pub ingested: Lsn,
    /// The event log's head then.
    pub head_seq: i64,
}

impl FromRow for Failover {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("source_failover");
        Ok(Failover {
            from_timeline: r.col("from_timeline")?,
            to_timeline: r.col("to_timeline")?,
            fork: r.col::<PgLsn>("fork_lsn")?.into(),
            ingested: r.col::<PgLsn>("ingested_lsn")?.into(),
            head_seq: r.col("head_seq")?,
        })
    }
}

impl EventLog {
    /// The system identifier and timeline this slot's ingest position belongs to
    /// (`None`: not recorded yet).
    pub async fn source_identity(&self) -> Result<Option<(String, i64)>, StoreError> {
        let row = self
            .client()
            .query_opt(&self.schema().sql(IDENTITY), &[&self.slot()])
            .await
            .map_err(StoreError::db("reading the source's timeline"))?;
        let Some(row) = row else { return Ok(None) };
        let r = row.of("ingest_position");
        let system: Option<String> = r.col("system_id")?;
        let timeline: Option<i64> = r.col("timeline")?;
        Ok(system.zip(timeline))
    }

    /// Records the source's system identifier and timeline (same history).
    pub async fn record_source_identity(
        &self,
        system_id: &str,
        timeline: i64,
    ) -> Result<(), StoreError> {
        self.client()
            .execute(
                &self.schema().sql(RECORD_IDENTITY),
                &[&self.slot(), &system_id, &timeline],
            )
            .await
            .map_err(StoreError::db("recording the source's timeline"))?;
        Ok(())
    }

    /// Records a failover to `to_timeline` forking at `fork` and moves the ingest
    /// position back to the fork; returns the position before.
    pub async fn record_failover(
        &self,
        system_id: &str,
        from_timeline: i64,
        to_timeline: i64,
        fork: Lsn,
    ) -> Result<Lsn, StoreError> {
        let fork: PgLsn = fork.into();
        let row = self
            .client()
            .query_one(
                &self.schema().sql(RECORD_FAILOVER),
                &[
                    &self.slot(),
                    &self.source(),
                    &system_id,
                    &from_timeline,
                    &to_timeline,
                    &fork,
                ],
            )
            .await
            .map_err(StoreError::db("recording a failover"))?;
        Ok(row.of("ingest_position").col::<PgLsn>("lsn")?.into())
    }

    /// This slot's last recorded failover.
    pub async fn last_failover(&self) -> Result<Option<Failover>, StoreError> {
        Ok(self
            .client()
            .query_opt(&self.schema().sql(LAST_FAILOVER), &[&self.slot()])
            .await
            .map_err(StoreError::db("reading the last failover"))?
            .as_ref()
            .map(Failover::from_row)
            .transpose()?)
    }

    /// The events to check against the new primary after this slot's last failover,
    /// `(failover id, [(event ID, seq)])`; `None` when none is left to check.
    pub async fn phantom_candidates(&self) -> Result<Option<(i64, Vec<(Uuid, i64)>)>, StoreError> {
        let rows = self
            .client()
            .query(
                &self.schema().sql(PHANTOM_CANDIDATES),
                &[&self.slot(), &self.source()],
            )
            .await
            .map_err(StoreError::db("reading the events past a failover's fork"))?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let id: i64 = first.of("source_failover").col("id")?;
        let mut events = Vec::new();
        for row in &rows {
            let r = row.of("event_log");
            if let (Some(event), Some(seq)) = (r.col("event_id")?, r.col("seq")?) {
                events.push((event, seq));
            }
        }
        Ok(Some((id, events)))
    }

    /// Records `phantoms` of failover `failover` and marks its check done.
    pub async fn record_phantoms(
        &self,
        failover: i64,
        phantoms: &[(Uuid, i64)],
    ) -> Result<(), StoreError> {
        let (ids, seqs): (Vec<Uuid>, Vec<i64>) = phantoms.iter().copied().unzip();
        self.client()
            .execute(
                &self.schema().sql(RECORD_PHANTOMS),
                &[&self.slot(), &ids, &seqs, &failover],
            )
            .await
            .map_err(StoreError::db("recording phantoms"))?;
        if !phantoms.is_empty() {
            self.note_phantoms();
        }
        Ok(())
    }

    /// The fork of this slot's last failover whose slot has not been checked against it.
    pub async fn unchecked_failover_slot(&self) -> Result<Option<Lsn>, StoreError> {
        let row = self
            .client()
            .query_opt(&self.schema().sql(UNCHECKED_SLOT), &[&self.slot()])
            .await
            .map_err(StoreError::db("reading the last failover"))?;
        row.map(|r| Ok(r.of("source_failover").col::<PgLsn>("fork_lsn")?.into()))
            .transpose()
    }

    /// Marks this slot's failovers' slots checked.
    pub async fn failover_slot_checked(&self) -> Result<(), StoreError> {
        self.client()
            .execute(&self.schema().sql(SLOT_CHECKED), &[&self.slot()])
            .await
            .map_err(StoreError::db("recording the slot's check"))?;
        Ok(())
    }

    /// Records the slot's horizon read from the source: its confirmed position `lsn`
    /// and its catalog_xmin as a 64-bit `xid` (fenced, on the appender's connection).
    pub async fn record_horizon(&mut self, lsn: Lsn, xid: i64) -> Result<(), StoreError> {
        let lsn: PgLsn = lsn.into();
        let sql = self.schema().sql(RECORD_HORIZON);
        let slot = self.slot().to_owned();
        self.fenced_execute(&sql, &[&slot, &lsn, &xid], "recording the source's horizon")
            .await?;
        Ok(())
    }

    /// The last horizon recorded at or before `lsn`: (position, 64-bit xid).
    pub async fn horizon_before(&self, lsn: Lsn) -> Result<Option<(Lsn, i64)>, StoreError> {
        let lsn: PgLsn = lsn.into();
        let row = self
            .client()
            .query_opt(&self.schema().sql(HORIZON_BEFORE), &[&self.slot(), &lsn])
            .await
            .map_err(StoreError::db("reading the source's horizon"))?;
        row.map(|row| {
            let r = row.of("source_horizon");
            Ok((r.col::<PgLsn>("lsn")?.into(), r.col("xid")?))
        })
        .transpose()
    }

    /// Reports a gap backfill's progress: `scanned` rows read, bounded by `since_xid`.
    pub async fn gap_progress(
        &self,
        scanned: i64,
        since_xid: Option<i64>,
    ) -> Result<(), StoreError> {
        self.client()
            .execute(
                &self.schema().sql(GAP_PROGRESS),
                &[&self.slot(), &scanned, &since_xid],
            )
            .await
            .map_err(StoreError::db("reporting a gap backfill's progress"))?;
        Ok(())
    }

    /// This slot's gaps that a backfill has not filled yet: (from, to).
    pub async fn unfilled_gaps(&self) -> Result<Vec<(Lsn, Lsn)>, StoreError> {
        let rows = self
            .client()
            .query(&self.schema().sql(UNFILLED_GAPS), &[&self.slot()])
            .await
            .map_err(StoreError::db("reading slot gaps"))?;
        rows.iter()
            .map(|r| {
                let r = r.of("slot_gap");
                Ok((
                    r.col::<PgLsn>("from_lsn")?.into(),
                    r.col::<PgLsn>("to_lsn")?.into(),
                ))
            })
            .collect()
    }

    /// Records that a backfill that added `backfilled` events covered this slot's
    /// closed gaps; `filled`: nothing in them can be missing any more.
    pub async fn fill_gaps(&self, backfilled: i64, filled: bool) -> Result<u64, StoreError> {
        self.client()
            .execute(
                &self.schema().sql(FILL_GAPS),
                &[&self.slot(), &backfilled, &filled],
            )
            .await
            .map_err(StoreError::db("marking slot gaps filled"))
    }
}

/// Slot `$1`'s open phantoms (with their first seq) and unfilled gaps.
const SUMMARY: &str = "select \
     (select count(*) from {schema}.phantom_event where slot = $1 and accepted_at is null) as phantoms, \
     (select min(seq) from {schema}.phantom_event where slot = $1 and accepted_at is null) as first_seq, \
     (select count(*) from {schema}.slot_gap where slot = $1 and filled_at is null) as open_gaps";

/// What a failover or a lost slot left open on a slot: for `walfold doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailoverSummary {
    /// Open (not accepted) phantoms.
    pub phantoms: i64,
    /// The first open phantom's seq.
    pub first_seq: Option<i64>,
    /// Gaps no backfill filled.
    pub open_gaps: i64,
}

/// What a failover or a lost slot left open on `slot`.
pub async fn failover_summary(
    client: &tokio_postgres::Client,
    schema: &crate::schema::Schema,
    slot: &str,
) -> Result<FailoverSummary, StoreError> {
    let row = client
        .query_one(&schema.sql(SUMMARY), &[&slot])
        .await
        .map_err(StoreError::db("reading phantoms and slot gaps"))?;
    let r = row.of("phantom_event");
    Ok(FailoverSummary {
        phantoms: r.col("phantoms")?,
        first_seq: r.col("first_seq")?,
        open_gaps: r.col("open_gaps")?,
    })
}

//! The source's horizon: how far back a gap's backfill must look.
//!
//! A gap runs from an LSN walfold had ingested through (`from`) to the new slot's start.
//! The rows committed in it are what the backfill must find; rows committed before it
//! are in the event log already. LSNs are not on rows, but transaction IDs are (`xmin`),
//! and a slot's `catalog_xmin` is the oldest transaction running at a point at or before
//! its confirmed position (the last `xl_running_xacts` record the slot passed). So for a
//! pair read from one row of `pg_replication_slots`, (confirmed position P, catalog_xmin
//! X): every transaction that commits after P is one that ran at that point (xid ≥ X) or
//! began later (xid above it). Prepared transactions count among the running ones.
//!
//! ```text
//!  xl_running_xacts   P (confirmed)      from (gap)           new slot
//!  ───────●──────────────●──────────────────●─────────────────────●──►
//!         oldest running = X              every commit in here has xid ≥ X
//! ```
//!
//! The heartbeat reads such a pair each period and the appender records it on its own
//! connection, fenced (`source_horizon`); a gap's
//! backfill takes the last pair at or before `from` and reads only rows with `xmin` at
//! or after X (by `age()`, so xid wraparound is respected) plus rows whose `xmin` a
//! vacuum froze (they no longer tell). Across a failover it holds too: the pair is from
//! the shared history before the fork, and the new primary assigns every xid after its
//! promotion above all xids before the fork; pairs read past the fork are deleted when
//! the failover is recorded. Without a pair, or one older than 2^30 transactions, the
//! whole table is read, as before.

use tokio_postgres::types::PgLsn;
use walfold_event::Lsn;
use walfold_pg::RowExt;
use walfold_store::StoreError;

/// The slot's confirmed position and catalog_xmin, with the next xid for its epoch.
const READ: &str = "select confirmed_flush_lsn, catalog_xmin::text::int8 as catalog_xmin, \
     pg_snapshot_xmax(pg_current_snapshot())::text::int8 as next_xid \
     from pg_replication_slots where slot_name = $1 and database = current_database()";

/// A bound older than this many transactions is not used: `age()` is a 32-bit count.
const MAX_AGE: i64 = 1 << 30;

/// The 64-bit form of 32-bit `xid`, given the 64-bit next xid (`xid` is not after it).
pub(crate) fn widen(xid: u32, next: i64) -> Option<i64> {
    let full = (next & !0xffff_ffff) | i64::from(xid);
    if full > next {
        full.checked_sub(1 << 32).filter(|f| *f >= 0)
    } else {
        Some(full)
    }
}

/// The slot's horizon on the source: (confirmed position, catalog_xmin as 64 bits);
/// `None` while the slot has none (not created, or never confirmed).
pub(crate) async fn read(
    source: &tokio_postgres::Client,
    slot: &str,
) -> Result<Option<(Lsn, i64)>, StoreError> {
    let Some(row) = source
        .query_opt(READ, &[&slot])
        .await
        .map_err(StoreError::db("reading the slot's horizon"))?
    else {
        return Ok(None);
    };
    let r = row.of("pg_replication_slots");
    let lsn: Option<PgLsn> = r.col("confirmed_flush_lsn")?;
    let xmin: Option<i64> = r.col("catalog_xmin")?;
    let next: i64 = r.col("next_xid")?;
    Ok(match (lsn, xmin) {
        (Some(lsn), Some(xmin)) => widen(xmin as u32, next).map(|x| (Lsn::from(lsn), x)),
        _ => None,
    })
}

/// The xid bound for a gap from `from` (64 bits), if a recorded horizon gives one that
/// `age()` can still compare on the source.
pub(crate) async fn bound(
    log: &walfold_store::EventLog,
    source: &tokio_postgres::Client,
    from: Lsn,
) -> Result<Option<(Lsn, i64)>, StoreError> {
    let Some((at, xid)) = log.horizon_before(from).await? else {
        return Ok(None);
    };
    let next: i64 = source
        .query_one(
            "select pg_snapshot_xmax(pg_current_snapshot())::text::int8",
            &[],
        )
        .await
        .map_err(StoreError::db("reading the source's next xid"))?
        .of("pg_current_snapshot")
        .col(0)?;
    Ok((next - xid < MAX_AGE && xid <= next).then_some((at, xid)))
}

#[cfg(test)]
mod tests {
    use super::widen;

    #[test]
    fn a_32_bit_xid_takes_the_epoch_of_the_next_one() {
        assert_eq!(widen(100, 200), Some(100));
        assert_eq!(widen(200, 200), Some(200));
        // After a wraparound: 0xffff_fff0 is from the epoch before.
        let next = (3_i64 << 32) | 5;
        assert_eq!(widen(0xffff_fff0, next), Some((2_i64 << 32) | 0xffff_fff0));
        assert_eq!(widen(4, next), Some((3_i64 << 32) | 4));
        // Not before the first epoch.
        assert_eq!(widen(300, 200), None);
    }
}

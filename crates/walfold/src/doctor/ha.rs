//! Doctor's checks of the HA helpers a source runs with: whether walfold's slot can
//! survive a failover (PostgreSQL 17 failover slots and the settings that sync them),
//! and a slot that is behind walfold's ingest position (one that survived a failover at
//! an older position, e.g. Patroni's permanent slot). See docs/OPERATIONS.md, After a
//! failover.

use tokio_postgres::Client;
use walfold_config::{OnSlotLost, SourceView};
use walfold_event::Lsn;
use walfold_pg::RowExt;

use super::{setting, CheckError, Level, Report};

/// Checks `slot` (existing on `source`) for what happens to it at a failover.
pub(super) async fn slot_checks(
    r: &mut Report,
    config: &SourceView<'_>,
    source: &Client,
    ingested: Option<&str>,
) -> Result<(), CheckError> {
    let slot = &config.source().slot;
    let version: i32 = setting(source, "server_version_num").await?.parse()?;
    let after = match config.source().on_slot_lost {
        OnSlotLost::Recreate => "walfold creates a new one, backfills the table outboxes over the gap from the fork and flags phantoms",
        OnSlotLost::Stop => "walfold stops with the fix (on_slot_lost = \"recreate\" follows by itself)",
    };
    if version < 170_000 {
        r.check(
            Level::Ok,
            format!("slot {slot} is no failover slot (PostgreSQL {} has none; they came with 17): it survives a failover only where a manager keeps a copy on the standby (Patroni's permanent slots); otherwise after one, {after}; see docs/OPERATIONS.md, After a failover", version / 10_000),
            "",
        );
    } else {
        let row = source
            .query_one(
                "select failover, synced from pg_replication_slots where slot_name = $1",
                &[slot],
            )
            .await?;
        let row = row.of("pg_replication_slots");
        let (failover, synced): (Option<bool>, Option<bool>) = (row.col(0)?, row.col(1)?);
        if failover == Some(true) {
            r.check(
                Level::Ok,
                format!(
                    "slot {slot} is a failover slot{}",
                    if synced == Some(true) {
                        " (a synced copy: this server is a standby)"
                    } else {
                        ""
                    }
                ),
                "",
            );
        } else {
            r.check(
                Level::Warn,
                format!("slot {slot} is not a failover slot: it will not survive a failover (after one, {after})"),
                format!("recreate it as one while walfold is stopped: select pg_drop_replication_slot('{slot}'), then select pg_create_logical_replication_slot('{slot}', 'pgoutput', false, false, true) (walfold creates new slots so on PostgreSQL 17), and backfill the table outboxes; or leave it: walfold recovers from a failover without it"),
            );
        }
        // Where the primary names the standbys a failover slot waits for: without it
        // walfold may confirm what no standby has, and the synced copy is dropped.
        let standbys = setting(source, "synchronized_standby_slots")
            .await
            .unwrap_or_default();
        let sync = setting(source, "sync_replication_slots")
            .await
            .unwrap_or_default();
        if failover == Some(true) {
            r.check(
                if standbys.is_empty() { Level::Warn } else { Level::Ok },
                format!("synchronized_standby_slots = '{standbys}'"),
                "name the standbys' physical slots in synchronized_standby_slots on the primary, so walfold's slot never passes what they have; and set sync_replication_slots = on (with hot_standby_feedback = on and a primary_slot_name) on each standby",
            );
            r.check(
                Level::Ok,
                format!("sync_replication_slots = {} on this server (it matters on the standbys: set it on there)", if sync.is_empty() { "-" } else { &sync }),
                "",
            );
        }
    }
    // A slot behind the ingest position while nobody streams it: one that survived a
    // failover at an older position, or was moved back.
    let row = source
        .query_one(
            "select active, confirmed_flush_lsn::text from pg_replication_slots where slot_name = $1",
            &[slot],
        )
        .await?;
    let row = row.of("pg_replication_slots");
    let (active, confirmed): (bool, Option<String>) = (row.col(0)?, row.col(1)?);
    let parse = |s: Option<&str>| s.and_then(|s| s.parse::<Lsn>().ok());
    if let (false, Some(at), Some(ingested)) =
        (active, parse(confirmed.as_deref()), parse(ingested))
    {
        if at < ingested {
            r.check(
                Level::Ok,
                format!("slot {slot} is at {at}, behind walfold's ingest position {ingested} (a slot that survived a failover at an older position, e.g. Patroni's permanent slot, or one moved back): walfold streams from {at} again, recognises what it has as duplicates, and checks phantoms after a failover all the same"),
                "",
            );
        }
    }
    Ok(())
}

/// With several hosts in the source's URL, asks each one what it is: the primary, or a
/// standby, and whether that standby keeps a copy of the slot (a synced failover slot
/// on 17, a manager's permanent slot) so the slot survives its promotion.
pub(super) async fn hosts(r: &mut Report, config: &SourceView<'_>) -> Result<(), CheckError> {
    let Some(hosts) = walfold_config::conninfo::per_host(&config.source().url) else {
        return Ok(());
    };
    let slot = &config.source().slot;
    for (label, conninfo) in hosts {
        let what = format!("source host {label}");
        let client = match walfold_pg::connect_for_command(&conninfo, &what).await {
            Ok(c) => c,
            Err(e) => {
                r.check(
                    Level::Warn,
                    format!("{what} does not answer: {e}"),
                    "a server the URL names that is down cannot take over; if it is gone for good, remove it from the URL",
                );
                continue;
            }
        };
        let row = client
            .query_one(
                "select pg_is_in_recovery(), current_setting('server_version_num')::int, \
                 current_setting('hot_standby_feedback'), current_setting('primary_slot_name'), \
                 coalesce(current_setting('sync_replication_slots', true), ''), \
                 exists (select from pg_replication_slots where slot_name = $1) as has_slot",
                &[slot],
            )
            .await?;
        let row = row.of("pg_settings");
        let (standby, version, feedback, primary_slot, sync, has_slot): (
            bool,
            i32,
            String,
            String,
            String,
            bool,
        ) = (
            row.col(0)?,
            row.col(1)?,
            row.col(2)?,
            row.col(3)?,
            row.col(4)?,
            row.col(5)?,
        );
        if !standby {
            r.check(Level::Ok, format!("{what} is the primary"), "");
            continue;
        }
        if has_slot {
            r.check(
                Level::Ok,
                format!("{what} is a standby that keeps a copy of slot {slot} (a synced failover slot or a manager's permanent slot): it survives this standby's promotion"),
                "",
            );
        } else if version >= 170_000 {
            let ready = sync == "on" && feedback == "on" && !primary_slot.is_empty();
            r.check(
                Level::Warn,
                format!("{what} is a standby without a copy of slot {slot} (sync_replication_slots = {sync}, hot_standby_feedback = {feedback}, primary_slot_name = '{primary_slot}')"),
                if ready {
                    "the slot is synced once it is a failover slot and this standby's physical slot is in synchronized_standby_slots on the primary"
                } else {
                    "set sync_replication_slots = on, hot_standby_feedback = on and a primary_slot_name on this standby, so a failover slot is synced to it"
                },
            );
        } else {
            r.check(
                Level::Ok,
                format!("{what} is a standby; PostgreSQL {} keeps no copy of slot {slot} on it (failover slots came with 17; a manager such as Patroni can keep one as a permanent slot): after its promotion walfold goes on as docs/OPERATIONS.md, After a failover says", version / 10_000),
                "",
            );
        }
    }
    Ok(())
}

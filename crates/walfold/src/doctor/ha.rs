//! Doctor's checks of the HA helpers a source runs with: whether walfold's slot can
//! survive a failover (PostgreSQL 17 failover slots and the settings that sync them),
//! a slot that is behind walfold's ingest position (one that survived a failover at an
//! older position, e.g. Patroni's permanent slot), and what each host of a several-host
//! URL is. See docs/OPERATIONS.md, After a failover.

use walfold_config::{OnSlotLost, SourceView};
use walfold_event::Lsn;
use walfold_source::shape::Host;
use walfold_store::StoreError;

use super::finding::{Finding, Report};
use super::source::Source;

/// What happens to the slot (when it exists) at a failover.
pub(super) fn failover_slot(s: &Source<'_>) -> Vec<Finding> {
    let Some(existing) = &s.shape.slot else {
        return Vec::new();
    };
    let slot = s.slot();
    let version = s.shape.server.version;
    let after = match s.view.source().on_slot_lost {
        OnSlotLost::Recreate => "walfold creates a new one, backfills the table outboxes over the gap from the fork and flags phantoms",
        OnSlotLost::Stop => "walfold stops with the fix (on_slot_lost = \"recreate\" follows by itself)",
    };
    if version < 170_000 {
        return vec![Finding::ok(format!("slot {slot} is no failover slot (PostgreSQL {} has none; they came with 17): it survives a failover only where a manager keeps a copy on the standby (Patroni's permanent slots); otherwise after one, {after}; see docs/OPERATIONS.md, After a failover", version / 10_000))];
    }
    let failover = existing.failover == Some(true);
    let mut found = vec![if failover {
        Finding::ok(format!(
            "slot {slot} is a failover slot{}",
            if existing.synced == Some(true) {
                " (a synced copy: this server is a standby)"
            } else {
                ""
            }
        ))
    } else {
        Finding::warn(
            format!("slot {slot} is not a failover slot: it will not survive a failover (after one, {after})"),
            format!("recreate it as one while walfold is stopped: select pg_drop_replication_slot('{slot}'), then select pg_create_logical_replication_slot('{slot}', 'pgoutput', false, false, true) (walfold creates new slots so on PostgreSQL 17), and backfill the table outboxes; or leave it: walfold recovers from a failover without it"),
        )
    }];
    if failover {
        // Where the primary names the standbys a failover slot waits for: without it
        // walfold may confirm what no standby has, and the synced copy is dropped.
        let sync = &s.shape.server.sync_replication_slots;
        found.push(super::standby_slots::synchronized_standby_slots(
            &s.shape.server,
        ));
        found.push(Finding::ok(format!(
            "sync_replication_slots = {} on this server (it matters on the standbys: set it on there)",
            if sync.is_empty() { "-" } else { sync }
        )));
    }
    found
}

/// A slot behind the ingest position while nobody streams it: one that survived a
/// failover at an older position, or was moved back.
pub(super) fn behind_the_ingest_position(s: &Source<'_>) -> Vec<Finding> {
    let Some(existing) = &s.shape.slot else {
        return Vec::new();
    };
    let slot = s.slot();
    let parse = |s: Option<&str>| s.and_then(|s| s.parse::<Lsn>().ok());
    match (
        existing.active,
        parse(existing.confirmed.as_deref()),
        parse(s.ingested.as_deref()),
    ) {
        (false, Some(at), Some(ingested)) if at < ingested => vec![Finding::ok(format!("slot {slot} is at {at}, behind walfold's ingest position {ingested} (a slot that survived a failover at an older position, e.g. Patroni's permanent slot, or one moved back): walfold streams from {at} again, recognises what it has as duplicates, and checks phantoms after a failover all the same"))],
        _ => Vec::new(),
    }
}

/// With several hosts in the source's URL, asks each one what it is: the primary, or a
/// standby, and whether that standby keeps a copy of the slot (a synced failover slot
/// on 17, a manager's permanent slot) so the slot survives its promotion.
pub(super) async fn hosts(r: &mut Report, config: &SourceView<'_>) -> Result<(), StoreError> {
    let Some(hosts) = walfold_config::conninfo::per_host(&config.source().url) else {
        return Ok(());
    };
    let slot = &config.source().slot;
    for (label, conninfo) in hosts {
        let what = format!("source host {label}");
        match walfold_pg::connect_for_command(&conninfo, &what).await {
            Ok(client) => {
                let host = walfold_source::shape::host(&client, slot).await?;
                r.add(host_finding(&what, slot, &host));
            }
            Err(e) => r.add(Finding::warn(
                format!("{what} does not answer: {e}"),
                "a server the URL names that is down cannot take over; if it is gone for good, remove it from the URL",
            )),
        }
    }
    Ok(())
}

fn host_finding(what: &str, slot: &str, host: &Host) -> Finding {
    if !host.standby {
        return Finding::ok(format!("{what} is the primary"));
    }
    let (sync, feedback, primary_slot) = (
        &host.sync_replication_slots,
        &host.hot_standby_feedback,
        &host.primary_slot_name,
    );
    if host.has_slot {
        Finding::ok(format!("{what} is a standby that keeps a copy of slot {slot} (a synced failover slot or a manager's permanent slot): it survives this standby's promotion"))
    } else if host.version >= 170_000 {
        let ready = sync == "on" && feedback == "on" && !primary_slot.is_empty();
        Finding::warn(
            format!("{what} is a standby without a copy of slot {slot} (sync_replication_slots = {sync}, hot_standby_feedback = {feedback}, primary_slot_name = '{primary_slot}')"),
            if ready {
                "the slot is synced once it is a failover slot and this standby's physical slot is in synchronized_standby_slots on the primary"
            } else {
                "set sync_replication_slots = on, hot_standby_feedback = on and a primary_slot_name on this standby, so a failover slot is synced to it"
            },
        )
    } else {
        Finding::ok(format!("{what} is a standby; PostgreSQL {} keeps no copy of slot {slot} on it (failover slots came with 17; a manager such as Patroni can keep one as a permanent slot): after its promotion walfold goes on as docs/OPERATIONS.md, After a failover says", host.version / 10_000))
    }
}

//! `walfold status [--json]`.

use std::path::Path;

use crate::{run::load, Failure};

pub async fn status(path: &Path, json: bool) -> Result<(), Failure> {
    let config = load(path)?;
    let source = walfold_store::connect(&config.source.url)
        .await
        .map_err(Failure::runtime)?;
    let target = walfold_store::connect(config.target_url())
        .await
        .map_err(Failure::runtime)?;
    let s = walfold_store::status(&source, &target, &config.target.schema, &config.source.slot)
        .await
        .map_err(Failure::runtime)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&s).map_err(Failure::runtime)?
        );
        return Ok(());
    }
    match &s.slot {
        Some(slot) => println!(
            "slot {}: active={} confirmed_flush={} lag_bytes={} retained_bytes={} wal_status={}",
            slot.name,
            slot.active,
            slot.confirmed_flush_lsn.as_deref().unwrap_or("-"),
            opt(slot.lag_bytes),
            opt(slot.retained_bytes),
            slot.wal_status.as_deref().unwrap_or("-"),
        ),
        None => println!("slot {}: missing", config.source.slot),
    }
    if let Some(i) = &s.ingest {
        println!(
            "ingest: lsn={} appended={} duplicates={} id_conflicts={} malformed={} ignored={}",
            i.lsn, i.appended, i.duplicates, i.id_conflicts, i.malformed, i.ignored_changes
        );
    }
    println!("event log head: {}", s.event_log_head);
    println!(
        "{:<28} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>6}",
        "subscriber", "position", "lag", "applied", "dupes", "stale", "dead", "parked"
    );
    for sub in &s.subscribers {
        println!(
            "{:<28} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>6}",
            sub.subscriber,
            sub.position,
            sub.lag_events,
            sub.applied,
            sub.duplicates,
            sub.stale,
            sub.dead_lettered,
            sub.parked_aggregates
        );
    }
    for sub in &s.subscribers {
        if let Some(p) = &sub.paused {
            println!(
                "PAUSED {}: {} partition(s) since {}s ago, {}{} (an error of the target or the config: nothing is dead-lettered for it; it resumes by itself once fixed)",
                sub.subscriber,
                p.partitions,
                (unix_now() - p.since_unix).max(0.0).round(),
                p.sqlstate.as_deref().map_or_else(String::new, |c| format!("SQLSTATE {c}: ")),
                p.error
            );
        }
    }
    for r in &s.rebuilds {
        println!(
            "rebuild {} → {}: {} replayed={} remaining={} rate={:.0}/s eta={} retired_table={}",
            r.projection,
            r.subscriber,
            r.state,
            r.replayed,
            r.remaining,
            r.rate_per_s,
            r.eta_s.map_or_else(|| "-".into(), |s| format!("{s:.0}s")),
            r.retired_table
        );
    }
    if s.slot_gaps > 0 {
        println!(
            "slot gaps: {} (WAL ranges skipped by recreating a lost slot; see {}.slot_gap)",
            s.slot_gaps, config.target.schema
        );
    }
    println!("dead letters open: {}", s.dead_letters_open);
    println!(
        "processed_message rows (estimate): {}",
        s.processed_message_rows
    );
    Ok(())
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn opt(v: Option<i64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

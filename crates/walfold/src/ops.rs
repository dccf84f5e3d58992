//! `walfold rebuild`, `walfold backfill`, `walfold prune`.

use std::path::Path;
use std::time::Duration;

use walfold_engine::ops;

use crate::run::load;
use crate::{engine_failure, Failure};

pub async fn rebuild(
    path: &Path,
    projection: &str,
    subscriber: Option<&str>,
    finish: bool,
    abort: bool,
) -> Result<(), Failure> {
    let config = load(path)?;
    if finish {
        let r = ops::finish_rebuild(&config, projection)
            .await
            .map_err(engine_failure)?;
        println!(
            "rebuild of {projection} finished: dropped {}; {} serves it",
            r.retired, r.subscriber
        );
        if config
            .projection
            .iter()
            .any(|p| p.name == projection && p.subscriber != r.subscriber)
        {
            println!(
                "set `subscriber = \"{}\"` for {projection} in the config",
                r.subscriber
            );
        }
        return Ok(());
    }
    if abort {
        let r = ops::abort_rebuild(&config, projection, Duration::from_secs(60))
            .await
            .map_err(engine_failure)?;
        println!(
            "rebuild of {projection} ({}) aborted: {} dropped; the live table is unchanged",
            r.subscriber, r.shadow
        );
        return Ok(());
    }
    let subscriber = subscriber.ok_or_else(|| Failure::config("--subscriber is required"))?;
    let r = ops::start_rebuild(&config, projection, subscriber)
        .await
        .map_err(engine_failure)?;
    println!(
        "rebuild of {projection} started: {} replays the event log into {} (live: {}, served by {}).\n\
         The leading daemon switches over when it has caught up; `walfold status` shows progress.",
        r.subscriber, r.shadow, r.live, r.previous
    );
    Ok(())
}

pub async fn backfill(
    path: &Path,
    outbox: &str,
    order_by: Option<&str>,
    batch: i64,
) -> Result<(), Failure> {
    let config = load(path)?;
    if !(1..=100_000).contains(&batch) {
        return Err(Failure::config("--batch must be between 1 and 100000"));
    }
    walfold_store::migrate(config.target_url(), &config.target.schema)
        .await
        .map_err(Failure::runtime)?;
    let r = ops::backfill(&config, outbox, order_by, batch)
        .await
        .map_err(|e| match e {
            ops::SourceError::Store { source, .. } => crate::store_failure(source),
            other => Failure::runtime(other),
        })?;
    if order_by.is_none() {
        eprintln!("walfold: paging in ID order, so each aggregate's events enter the log in ID order; pass --order-by <column> (e.g. created_at) to keep their order");
    }
    println!(
        "backfill of {outbox}: {} rows in {} pages; {} appended, {} already in the log, {} ID conflicts, {} malformed (dead letters), {} skipped (null ID or order value)",
        r.rows, r.pages, r.appended, r.duplicates, r.id_conflicts, r.malformed, r.skipped
    );
    Ok(())
}

pub async fn prune(path: &Path) -> Result<(), Failure> {
    let config = load(path)?;
    let p = ops::prune(&config, &config.projection)
        .await
        .map_err(engine_failure)?;
    println!("pruned {} claims and {} events", p.claims, p.events);
    Ok(())
}

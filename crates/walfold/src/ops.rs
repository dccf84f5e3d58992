//! `walfold rebuild` (and following one to its switch-over), `walfold backfill` (with
//! progress), `walfold prune`.

use std::path::Path;
use std::time::{Duration, Instant};

use tokio_postgres::Client;
use walfold_config::{Config, QualifiedName, SourceView};
use walfold_engine::ops;
use walfold_store::{Operator, RebuildState, Schema};

use crate::progress::{Progress, Snapshot, POLL};
use crate::run::load;
use crate::{engine_failure, Failure};

/// What `walfold rebuild` was asked to do besides starting one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebuildAction {
    Start,
    /// Start (when a subscriber is given) and follow it to its switch-over.
    Wait,
    Finish,
    Abort,
}

impl RebuildAction {
    pub fn from_flags(finish: bool, abort: bool, wait: bool) -> RebuildAction {
        match (finish, abort, wait) {
            (true, _, _) => RebuildAction::Finish,
            (_, true, _) => RebuildAction::Abort,
            (_, _, true) => RebuildAction::Wait,
            _ => RebuildAction::Start,
        }
    }
}

pub async fn rebuild(
    path: &Path,
    projection: &str,
    subscriber: Option<&str>,
    action: RebuildAction,
    history: ops::History,
) -> Result<(), Failure> {
    let config = load(path)?;
    if action == RebuildAction::Wait && subscriber.is_none() {
        return follow_rebuild(&config, projection, None).await;
    }
    if action == RebuildAction::Finish {
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
    if action == RebuildAction::Abort {
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
    let r = ops::start_rebuild(&config, projection, subscriber, history)
        .await
        .map_err(engine_failure)?;
    println!(
        "rebuild of {projection} started: {} replays the event log into {} (live: {}, served by {}).\n\
         The leading daemon switches over when it has caught up; `walfold status` shows progress.",
        r.subscriber, r.shadow, r.live, r.previous
    );
    if action == RebuildAction::Wait {
        return follow_rebuild(&config, projection, Some(&r.subscriber)).await;
    }
    Ok(())
}

/// The config's `[[source]]` names, for messages.
pub(crate) fn source_names(config: &walfold_config::Config) -> String {
    config
        .sources()
        .iter()
        .map(|s| s.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// How long a rebuild may make no progress before `--wait` says why it might not.
const STALL: Duration = Duration::from_secs(15);
/// Positions of the log a rebuild may be short of the head and count as caught up (the
/// daemon switches one over from that close).
const CAUGHT_UP: i64 = 100;

/// Follows the open rebuild of `projection` (under `subscriber`, when given) until it
/// switches over, showing its progress; Ctrl-C stops following, never the rebuild.
async fn follow_rebuild(
    config: &Config,
    projection: &str,
    subscriber: Option<&str>,
) -> Result<(), Failure> {
    let mut connections = crate::status::connect(config).await?;
    // The projection's own target holds its rebuilds.
    let home = config
        .projection
        .iter()
        .find(|p| p.name == projection)
        .map_or_else(
            || walfold_engine::Target::main(config),
            |p| walfold_engine::Target::of(config, p),
        );
    // Read once the rebuild has left the open ones; connected then, so a restart of
    // the database while following does not matter.
    let ended = |s: String| {
        let home = &home;
        async move {
            let server = format!("target {}", home.label());
            let op = Operator::for_command(&home.url, &server, &home.schema).await?;
            op.rebuild_state(&s).await
        }
    };
    // The read error last shown: a restart of the database is ridden out, said once.
    let mut unreadable: Option<String> = None;
    let mut progress: Option<Progress> = None;
    let mut last = Snapshot::default();
    let mut moved = Instant::now();
    let mut warned = false;
    // The switch-over error last shown (said again when it changes).
    let mut told: Option<String> = None;
    let mut following: Option<String> = subscriber.map(str::to_owned);
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = &mut interrupt => {
                if let Some(p) = progress.as_mut() {
                    p.finish(last, "stopped following");
                }
                eprintln!(
                    "walfold: stopped following; the rebuild of {projection} goes on in the daemon \
                     (`walfold status` or `walfold rebuild {projection} --wait` shows it)"
                );
                return Ok(());
            }
            _ = tick.tick() => {}
        }
        connections.refresh(config).await;
        let status = match crate::status::read(config, &connections).await {
            Ok(status) => status,
            Err(e) => {
                unreadable_now(&mut unreadable, &e.message);
                continue;
            }
        };
        if unreadable.take().is_some() {
            eprintln!("walfold: reading the rebuild's progress again");
        }
        let open = status.rebuilds.iter().find(|r| {
            r.projection == projection && following.as_ref().is_none_or(|s| *s == r.subscriber)
        });
        let Some(r) = open else {
            // Gone from the open rebuilds: finished (switched, then its retired table
            // dropped) or aborted.
            let Some(s) = &following else {
                return Err(Failure::config(format!(
                    "no rebuild of {projection} is running (start one with --subscriber NEW_ID)"
                )));
            };
            let state = match ended(s.clone()).await {
                Ok(state) => state,
                Err(e) => {
                    unreadable_now(&mut unreadable, &e.to_string());
                    continue;
                }
            };
            if let Some(p) = progress.as_mut() {
                p.finish(last, state.map_or("gone", RebuildState::as_str));
            }
            return match state {
                Some(RebuildState::Finished) => {
                    println!("rebuild of {projection} switched over and finished: {s} serves it");
                    Ok(())
                }
                other => Err(Failure::runtime(format!(
                    "the rebuild of {projection} under {s} ended without switching over (state {})",
                    other.map_or("unknown", RebuildState::as_str)
                ))),
            };
        };
        following.get_or_insert_with(|| r.subscriber.clone());
        let p = progress.get_or_insert_with(|| {
            Progress::new(
                format!("rebuild of {projection} → {}", r.subscriber),
                "log events",
            )
        });
        // Both in positions of the log: a filtered projection replays (claims) a few of
        // the events it reads past, so claims against positions never add up.
        let snapshot = Snapshot {
            done: r.read.max(0) as u64,
            remaining: Some(r.remaining.max(0) as u64),
            // The status computes a rate while replaying only: keep the last one.
            rate: Some(r.rate_per_s)
                .filter(|_| r.state == RebuildState::Running)
                .or(last.rate),
        };
        if snapshot.done != last.done {
            moved = Instant::now();
        }
        last = snapshot;
        if r.state == RebuildState::Switched {
            p.finish(snapshot, RebuildState::Switched.as_str());
            println!(
                "rebuild of {projection} switched over: {} serves it; the retired table {} stays \
                 until `walfold rebuild {projection} --finish` (or drop_retired_after)",
                r.subscriber, r.retired_table
            );
            return Ok(());
        }
        p.update(
            snapshot,
            &format!("{} replayed, {}", r.replayed, r.state.as_str()),
        );
        if let Some(e) = r
            .switch_error
            .as_ref()
            .filter(|e| told.as_ref() != Some(*e))
        {
            eprintln!(
                "walfold: the switch-over of {} failed (the leading daemon tries again): {e}",
                r.subscriber
            );
            told = Some(e.clone());
        }
        if !warned && moved.elapsed() >= STALL {
            warned = true;
            if r.remaining <= CAUGHT_UP && r.open_dead_letters > 0 {
                eprintln!(
                    "walfold: {} has caught up but has not switched over for {}s: {} open dead letters of \
                     the new subscriber hold the switch (`walfold dead-letters list --subscriber {}`)",
                    r.subscriber,
                    STALL.as_secs(),
                    r.open_dead_letters,
                    r.subscriber
                );
            } else if r.switch_error.is_some() {
                // Said above.
            } else if r.remaining <= CAUGHT_UP {
                eprintln!(
                    "walfold: {} has caught up but has not switched over for {}s: the leading \
                     `walfold run` switches it; is one running (`walfold status`)?",
                    r.subscriber,
                    STALL.as_secs()
                );
            } else {
                eprintln!(
                    "walfold: no replay progress for {}s: the leading `walfold run` replays rebuilds; \
                     is one running (`walfold status`)?",
                    STALL.as_secs()
                );
            }
        }
    }
}

/// Says once per distinct error that following goes on through it.
fn unreadable_now(last: &mut Option<String>, error: &str) {
    if last.as_deref() != Some(error) {
        eprintln!(
            "walfold: cannot read the rebuild's progress ({error}); trying again every second \
             (the rebuild goes on in the daemon; Ctrl-C stops following)"
        );
        *last = Some(error.to_owned());
    }
}

pub async fn backfill(
    path: &Path,
    outbox: &str,
    source: Option<&str>,
    order_by: Option<&str>,
    batch: i64,
) -> Result<(), Failure> {
    let whole = load(path)?;
    if !(1..=100_000).contains(&batch) {
        return Err(Failure::config("--batch must be between 1 and 100000"));
    }
    // The backfill reads the database of the source that holds the outbox.
    let views = whole.source_views();
    let config = match source {
        Some(name) => whole.for_source(name).ok_or_else(|| {
            Failure::config(format!(
                "--source: no [[source]] is named `{name}` (sources: {})",
                source_names(&whole)
            ))
        })?,
        None => {
            let owners: Vec<SourceView<'_>> = views
                .iter()
                .filter(|v| v.table_outbox(outbox).is_some())
                .copied()
                .collect();
            match owners.as_slice() {
                [one] => *one,
                // No source has it as a table: the backfill says so, of the source whose
                // message outbox it may name, else of the first.
                [] => views
                    .iter()
                    .find(|v| {
                        v.outboxes()
                            .any(|o| o.message_prefix.as_deref() == Some(outbox))
                    })
                    .or(views.first())
                    .copied()
                    .ok_or_else(|| Failure::config("the config has no [source]"))?,
                several => {
                    let names: Vec<&str> =
                        several.iter().map(|v| v.source().name.as_str()).collect();
                    return Err(Failure::config(format!(
                        "--outbox {outbox} is an outbox of the sources {}: name one with --source",
                        names.join(", ")
                    )));
                }
            }
        }
    };
    walfold_store::migrate(
        config.target_url(),
        &walfold_engine::Target::main(&whole).schema,
    )
    .await
    .map_err(Failure::runtime)?;
    let watcher = BackfillWatcher::open(&config, outbox).await;
    let mut progress = Progress::new(format!("backfill of {outbox}"), "rows");
    let work = ops::backfill(&config, outbox, order_by, batch);
    tokio::pin!(work);
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let outcome = loop {
        tokio::select! {
            biased;
            outcome = &mut work => break outcome,
            _ = tick.tick() => {
                if let Some(s) = watcher.as_ref() {
                    if let Some(snapshot) = s.snapshot().await {
                        progress.update(snapshot, "");
                    }
                }
            }
        }
    };
    let r = outcome.map_err(|e| match e.is_usage() {
        true => Failure::config(e),
        false => Failure::runtime(e),
    })?;
    progress.finish(
        Snapshot {
            done: r.rows,
            remaining: Some(0),
            rate: None,
        },
        "done",
    );
    let keyed = config.table_outbox(outbox).is_some_and(|(o, _)| {
        o.set("expand").is_none()
            && o.fields()
                .iter()
                .filter(|f| f.key == "id")
                .all(|f| f.is_column())
    });
    if order_by.is_none() && !keyed {
        eprintln!("walfold: paging in the table's own order (its ID is no columns), so each aggregate's events enter the log in the order of the rows' places; pass --order-by <column> (e.g. created_at) to keep their order");
    } else if order_by.is_none() {
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
    for (_, why) in &p.held_by {
        eprintln!("walfold: {why}");
    }
    Ok(())
}

/// Reads a running backfill's progress from the outside: each page's rows are counted
/// in the ingest position (appended, duplicates, ID conflicts, malformed) in the page's
/// own transaction, and no daemon appends meanwhile (the backfill refuses to run beside
/// one). The total is the planner's row estimate of the outbox (its partitions summed).
struct BackfillWatcher {
    target: Client,
    schema: Schema,
    slot: String,
    baseline: i64,
    estimate: Option<u64>,
}

impl BackfillWatcher {
    /// `None` when progress cannot be read (the backfill itself then says what is wrong).
    async fn open(config: &SourceView<'_>, outbox: &str) -> Option<BackfillWatcher> {
        let target = walfold_pg::connect_for_command(config.target_url(), "target main")
            .await
            .ok()?;
        let schema = Schema::new(&config.target.schema);
        let slot = config.source().slot.clone();
        let baseline = walfold_store::ingested_rows(&target, &schema, &slot)
            .await
            .ok()?;
        let estimate = match config.table_outbox(outbox) {
            Some((_, table)) => row_estimate(config, &table).await,
            None => None,
        };
        Some(BackfillWatcher {
            target,
            schema,
            slot,
            baseline,
            estimate,
        })
    }

    async fn snapshot(&self) -> Option<Snapshot> {
        let now = walfold_store::ingested_rows(&self.target, &self.schema, &self.slot)
            .await
            .ok()?;
        let done = (now - self.baseline).max(0) as u64;
        Some(Snapshot {
            done,
            // An estimate that the rows have passed is no estimate any more.
            remaining: self
                .estimate
                .and_then(|e| e.checked_sub(done))
                .filter(|r| *r > 0 || self.estimate == Some(done)),
            rate: None,
        })
    }
}

/// The planner's estimate of a table's rows (a partitioned table's partitions summed);
/// `None` while it was never analyzed.
async fn row_estimate(config: &SourceView<'_>, table: &QualifiedName) -> Option<u64> {
    let source = walfold_pg::connect_for_command(&config.source().url, "source")
        .await
        .ok()?;
    walfold_source::shape::row_estimate(&source, table)
        .await
        .ok()
        .flatten()
}

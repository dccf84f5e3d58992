//! Ingest supervisor: runs reader + appender for one streaming attempt, and restarts a
//! failed attempt from the last durable point with capped exponential backoff and
//! jitter. Environment errors (a revoked right, a full disk on the target) are retried
//! the same way, loudly; definite errors (wal_level, missing table, lost slot) stop that
//! source only (the daemon, once no source is left).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use walfold_config::{Config, SourceConfig, SourceView};
use walfold_event::ErrorKind;
use walfold_pg::connect;
use walfold_store::{Backoff, Fence, LogOrder};
use walfold_telemetry::signal::Signal;

use crate::appender::{Appender, Reopen, Repeats};
use crate::budget::Budget;
use crate::error::SourceError;
use crate::feedback;
use crate::reader::{replication_config, Reader};
use crate::setup::prepare_source;

/// Follows every source's slot into the event log until `cancel`, publishing the log
/// head on `head`. Each source has its own reader, appender, ingest position and
/// backoff, so one that is down or slow never holds up the others; their appends take
/// turns in one [`LogOrder`], so the log stays one sequence. A definite error of one
/// source (its slot lost, its publication dropped) stops that source's ingest only,
/// loudly (`walfold_ingest_stopped`, `/readyz`, `walfold status`); the others go on.
/// Once no source is left, the first such error is returned: the daemon stops.
pub async fn run_ingest(
    config: Arc<Config>,
    cancel: CancellationToken,
    head: watch::Sender<i64>,
    fence: Fence,
) -> Result<(), SourceError> {
    same_database(&config).await?;
    let order = Arc::new(LogOrder::new(
        config.target_url(),
        &walfold_store::Schema::new(config.target.schema.as_str()),
    ));
    let head = Arc::new(head);
    let stop = cancel.child_token();
    let mut sources = JoinSet::new();
    for source in config.sources() {
        let (stop, head, fence, order) = (stop.clone(), head.clone(), fence.clone(), order.clone());
        let (config, name) = (config.clone(), source.name.clone());
        sources.spawn(async move {
            match config.for_source(&name) {
                Some(view) => follow(&view, stop, head, fence, order).await,
                None => Ok(()),
            }
        });
    }
    let mut first_error = None;
    while let Some(done) = sources.join_next().await {
        let result = done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        if let Err(e) = result {
            first_error.get_or_insert(e);
        }
    }
    // A source ends by itself only on a definite error: all of them ended before
    // `cancel`, so no source is left, and the daemon stops.
    match first_error {
        Some(e) if !cancel.is_cancelled() => Err(e),
        _ => Ok(()),
    }
}

/// Refuses two sources on one database (whatever their URLs): its outbox would be read
/// twice. Sources that do not answer within a few seconds are not compared.
async fn same_database(config: &Config) -> Result<(), SourceError> {
    if config.sources().len() < 2 {
        return Ok(());
    }
    let mut seen: Vec<(&str, String)> = Vec::new();
    for source in config.sources() {
        let identity = tokio::time::timeout(Duration::from_secs(5), async {
            let client = connect(&source.url).await.ok()?;
            crate::setup::database_identity(&client).await.ok()
        })
        .await
        .ok()
        .flatten();
        let Some(identity) = identity else { continue };
        if let Some((other, _)) = seen.iter().find(|(_, i)| *i == identity) {
            return Err(SourceError::Refused(crate::error::Refusal {
                problem: format!("sources {other} and {} are the same database", source.name),
                fix: "point each [[source]] at its own database: one outbox read by two sources \
                      is attributed to whichever appends first"
                    .into(),
            }));
        }
        seen.push((&source.name, identity));
    }
    Ok(())
}

/// Follows one source.
async fn follow(
    config: &SourceView<'_>,
    cancel: CancellationToken,
    head: Arc<watch::Sender<i64>>,
    fence: Fence,
    order: Arc<LogOrder>,
) -> Result<(), SourceError> {
    let max = Duration::from_millis(config.pipeline.max_backoff_ms);
    let mut backoff = Backoff::new(Duration::from_millis(100), max);
    let name = config.source().name.clone();
    let mut reported: Option<String> = None;
    loop {
        let started = tokio::time::Instant::now();
        let result = attempt(config, &cancel, &head, &fence, &order).await;
        match result {
            Ok(()) => return Ok(()),
            Err(e) if e.kind().retries() && !cancel.is_cancelled() => {
                if started.elapsed() > Duration::from_secs(30) {
                    backoff.reset();
                }
                let slot = &config.source().slot;
                if e.kind() == ErrorKind::Environment {
                    Signal::IngestPaused { source: &name }.report();
                    // Once per change of cause, not once per retry.
                    let message = e.to_string();
                    if reported.as_deref() != Some(message.as_str()) {
                        Signal::IngestPauseCause {
                            source: &name,
                            slot,
                            error: &e,
                        }
                        .report();
                        record_pause(config, &fence, &message).await;
                        reported = Some(message);
                    }
                } else {
                    tracing::warn!(error = %e, source = %name, slot = %slot, "ingest failed, reconnecting");
                }
                if !backoff.sleep(&cancel).await {
                    return Ok(());
                }
            }
            Err(e) if cancel.is_cancelled() => {
                tracing::warn!(error = %e, source = %name, "ingest error during shutdown");
                return Ok(());
            }
            Err(e) => {
                let e = explain(e, config);
                let slot = &config.source().slot;
                Signal::IngestStopped {
                    source: &name,
                    slot,
                    error: &e,
                }
                .report();
                record_stop(config, &fence, &e.to_string()).await;
                return Err(e);
            }
        }
    }
}

/// Records that ingest of this source stopped, and why, for `walfold status`; best
/// effort, as [`record_pause`].
async fn record_stop(config: &SourceView<'_>, fence: &Fence, error: &str) {
    let schema = walfold_store::Schema::new(config.target.schema.as_str());
    let record = async {
        let mut client = connect(config.target_url()).await?;
        walfold_store::record_ingest_stop(&mut client, fence, &schema, &config.source().slot, error)
            .await
    };
    match tokio::time::timeout(Duration::from_secs(5), record).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "cannot record that ingest stopped"),
        Err(_) => tracing::debug!("cannot record that ingest stopped: the target did not answer"),
    }
}

/// Records why ingest is paused for `walfold status`; best effort (the error that paused
/// ingest may keep this write from landing too: the log and the gauge say it as well).
async fn record_pause(config: &SourceView<'_>, fence: &Fence, error: &str) {
    let schema = walfold_store::Schema::new(config.target.schema.as_str());
    let record = async {
        let mut client = connect(config.target_url()).await?;
        walfold_store::record_ingest_pause(
            &mut client,
            fence,
            &schema,
            &config.source().slot,
            error,
        )
        .await
    };
    match tokio::time::timeout(Duration::from_secs(5), record).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "cannot record the ingest pause"),
        Err(_) => tracing::debug!("cannot record the ingest pause: the target did not answer"),
    }
}

/// A definite error, with what the operator can do about it where the server's message
/// does not say.
fn explain(e: SourceError, config: &SourceView<'_>) -> SourceError {
    use crate::wire::WireError;
    let source = config.source();
    match &e {
        // Once streaming, the one object looked up by name is the publication.
        SourceError::Replication(WireError::Streaming { code, message })
            if walfold_event::is_undefined_object(code.as_deref()) =>
        {
            SourceError::Slot {
                slot: source.slot.clone(),
                problem: format!(
                    "of source `{}` cannot go on: {message}. The slot reads the catalog as of \
                     its position, so a publication dropped and created again is not there for \
                     it. Drop the slot (select pg_drop_replication_slot('{}')) and start with \
                     on_slot_lost = \"recreate\" (the skipped range is recorded in slot_gap; \
                     backfill the outbox for its rows), or restore the database's publication \
                     from before",
                    source.name, source.slot
                ),
            }
        }
        _ => e,
    }
}

async fn attempt(
    config: &SourceView<'_>,
    cancel: &CancellationToken,
    head: &Arc<watch::Sender<i64>>,
    fence: &Fence,
    order: &Arc<LogOrder>,
) -> Result<(), SourceError> {
    // Its statements are prepared, and heartbeats and slot checks follow on their own
    // connections: a pooler that shares sessions is refused before any of it.
    walfold_pg::refuse_pooling(
        &config.source().url,
        &format!("the url of source {}", config.source().name),
    )
    .await?;
    let reopen = Reopen {
        url: config.target_url().to_owned(),
        schema: walfold_store::Schema::new(config.target.schema.as_str()),
        slot: config.source().slot.clone(),
        source: config.source().name.clone(),
        order: order.clone(),
        fence: fence.clone(),
    };
    let mut log = reopen.open().await?;
    let mut cfg = replication_config(config)?;
    let (identity, _) = crate::timeline::check(config, &cfg, &log).await?;
    // The stream must come from the server checked here (not one promoted meanwhile).
    cfg.expect = Some((identity.system_id, identity.timeline));
    let source = connect(&config.source().url).await?;
    prepare_source(&source, config, &mut log).await?;
    crate::slot_holder::end_stale_holder(&source, config, fence).await?;
    let signature = crate::setup::publication_rewritten(&source, config, &mut log).await?;
    drop(source);
    crate::backfill::fill_gaps(config, &mut log).await?;
    crate::phantoms::check(config, &log).await?;
    let ingested = log.durable_lsn().await?;
    // The server sends every unfinished transaction again from its first segment.
    let cleared = log.clear_staged().await?;
    if cleared > 0 {
        tracing::info!(
            rows = cleared,
            "cleared changes staged by an earlier session"
        );
    }
    head.send_modify(|h| *h = (*h).max(log.head()));
    let (durable, ack) = feedback::channel();
    let (horizon_tx, horizon) = watch::channel(None);
    let (items_tx, items_rx) = mpsc::channel(config.pipeline.channel_capacity);
    let budget = Budget::new(config.pipeline.ingest_bytes);
    // Everything the appender writes comes from the stream, once it has started.
    log.streams();
    let appender = Appender {
        reopen,
        budget: budget.clone(),
        log,
        durable,
        head: head.clone(),
        batch_size: config.pipeline.append_batch_size,
        linger: Duration::from_millis(config.pipeline.append_linger_ms),
        position_written: tokio::time::Instant::now(),
        source: config.source().name.clone(),
        horizon,
        repeats: Repeats::default(),
    };
    let reader = Reader::new(config, items_tx, ingested);
    cfg.budget = Some(budget);
    let _heartbeat = heartbeat(config.source().clone(), horizon_tx);
    let _wal_watch = crate::wal_watch::watch(
        config.source().clone(),
        config.target_url().to_owned(),
        walfold_store::Schema::new(config.target.schema.as_str()),
    );
    let stream = async { tokio::join!(reader.run(cfg, ack, cancel), appender.run(items_rx)) };
    // A publication changed under the stream stops it, as if walfold had crashed: the
    // slot holds everything not yet in the log, and the start refuses until it is fixed.
    let (read, append) = tokio::select! {
        done = stream => done,
        changed = publication_watch(config, signature) => return Err(changed),
    };
    // The appender's error explains a reader that stopped because the channel closed.
    append?;
    read
}

/// How often a running ingest checks that its publication still publishes every outbox.
const PUBLICATION_CHECK: Duration = Duration::from_secs(5);

/// Returns when the source's publication no longer streams what it did at the start
/// (see `setup::changed_while_running`: a refusal), or was rewritten since (`signature`
/// differs: the next attempt backfills over the change); never while neither. A check
/// that cannot run (the source unreachable) is tried again at the next period.
async fn publication_watch(config: &SourceView<'_>, signature: Option<String>) -> SourceError {
    let mut tick = tokio::time::interval(PUBLICATION_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut client: Option<tokio_postgres::Client> = None;
    loop {
        tick.tick().await;
        if client
            .as_ref()
            .is_none_or(tokio_postgres::Client::is_closed)
        {
            client = connect(&config.source().url).await.ok();
        }
        let Some(c) = &client else { continue };
        match crate::setup::changed_while_running(c, config).await {
            Ok(Some(refusal)) => return SourceError::Refused(refusal),
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(error = %e, "cannot check the publication");
                continue;
            }
        }
        match crate::setup::publication_signature(c, config).await {
            Ok(Some((now, _))) if signature.as_ref().is_some_and(|s| *s != now) => {
                return SourceError::PublicationRewritten(config.source().publication.clone())
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "cannot check the publication"),
        }
        public_emit_watch(c, config).await;
    }
}

/// The start refuses a message outbox that any role may write to; a grant to PUBLIC
/// made while running is said here (a warning and `walfold_public_emit`), each period,
/// rather than found at the next restart. Ingest goes on: what was read so far is the
/// producers', and stopping would hold WAL for a grant the operator may have meant.
async fn public_emit_watch(source: &tokio_postgres::Client, config: &SourceView<'_>) {
    if !config.outboxes().any(|o| o.message_prefix.is_some()) {
        return;
    }
    let heartbeats = config.source().heartbeat_interval_s > 0;
    match crate::writers::public_emit(source, config.outboxes(), heartbeats).await {
        Ok(found) => {
            let problem = found
                .refusal
                .map(|r| format!("{}; fix: {}", r.problem, r.fix));
            // Accepted (`allow_public_emit`): said at the start already.
            Signal::PublicEmit {
                source: &config.source().name,
                public: problem.as_ref().map(|p| p as &dyn std::fmt::Display),
            }
            .report();
        }
        Err(e) => tracing::debug!(error = %e, "cannot check who may emit messages"),
    }
}

/// Writes a non-transactional logical message every `heartbeat_interval_s` seconds. It
/// reaches the reader even when the publication filters out every change, so the slot
/// keeps moving and the server can release WAL on an idle or busy-but-filtered database.
/// Each period (10 s when heartbeats are off) it also reads the slot's horizon, which
/// bounds a later gap's backfill (see `horizon`), for the appender to record. The task
/// ends with the streaming attempt that owns the guard.
fn heartbeat(
    source: SourceConfig,
    horizon: watch::Sender<Option<(walfold_event::Lsn, i64)>>,
) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        let interval_s = source.heartbeat_interval_s;
        let period = Duration::from_secs(if interval_s == 0 { 10 } else { interval_s });
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut client = None;
        loop {
            tick.tick().await;
            if client
                .as_ref()
                .is_none_or(tokio_postgres::Client::is_closed)
            {
                client = match connect(&source.url).await {
                    Ok(c) => Some(c),
                    Err(e) => {
                        tracing::warn!(error = %e, "heartbeat cannot connect to the source");
                        None
                    }
                };
            }
            let Some(c) = &client else { continue };
            if interval_s > 0 {
                if let Err(e) = c
                    .execute(
                        "select pg_logical_emit_message(false, $1, '')",
                        &[&walfold_config::HEARTBEAT_PREFIX],
                    )
                    .await
                {
                    tracing::warn!(error = %walfold_pg::describe(&e), "heartbeat failed");
                }
            }
            match crate::horizon::read(c, &source.slot).await {
                Ok(Some(pair)) => {
                    horizon.send_replace(Some(pair));
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "cannot read the slot's horizon"),
            }
        }
    }))
}

/// Aborts its task when dropped, however the owner ends.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

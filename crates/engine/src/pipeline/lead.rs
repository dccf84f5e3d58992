//! What the leader runs beside its share of the units: ingest (every source's slot into
//! the event log), the head's news for the other instances' projectors, the prune pass,
//! and one planner per target (`plan.rs`). All of it writes under the leader's fence; it
//! stops when leadership is lost, when the instance stops, or when a part fails for good
//! (ingest once no source is left: a definite error of one source stops only that one;
//! an extra target that cannot be used pauses only its projections).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use walfold_config::ProjectionConfig;
use walfold_store::Fence;

use super::instance::Shared;
use super::plan::Planner;
use crate::error::EngineError;

/// The leader's running duties.
pub(crate) struct Duties {
    stop: CancellationToken,
    handle: Option<tokio::task::JoinHandle<Result<(), EngineError>>>,
}

impl Duties {
    /// Starts them under `fence`; `dead`: the previous leader's tag, when it died.
    pub(crate) fn start(shared: Arc<Shared>, fence: Fence, dead: Option<i32>) -> Duties {
        let stop = CancellationToken::new();
        let handle = tokio::spawn(lead(shared, fence, dead, stop.clone()));
        Duties {
            stop,
            handle: Some(handle),
        }
    }

    /// Resolves when they ended by themselves (a failure, or leadership lost).
    pub(crate) async fn ended(&mut self) -> Result<(), EngineError> {
        match self.handle.as_mut() {
            Some(handle) => {
                let result = handle
                    .await
                    .unwrap_or_else(|join| Err(super::joined_error("the leader's duties", join)));
                self.handle = None;
                result
            }
            None => std::future::pending().await,
        }
    }

    /// Asks them to stop (ingest drains).
    pub(crate) fn cancel(&self) {
        self.stop.cancel();
    }

    /// Stops them and waits until they have.
    pub(crate) async fn stop(mut self) {
        self.stop.cancel();
        if let Some(handle) = self.handle.take() {
            if let Ok(Err(e)) = handle.await {
                if !e.is_fenced() {
                    tracing::debug!(error = %e, "the leader's duties ended with an error");
                }
            }
        }
    }
}

async fn lead(
    shared: Arc<Shared>,
    fence: Fence,
    dead: Option<i32>,
    stop: CancellationToken,
) -> Result<(), EngineError> {
    let config = shared.config.clone();
    let lost = fence.lost();
    let (head_tx, head_rx) = watch::channel(0i64);
    let ingest_done = CancellationToken::new();
    let ingest = {
        let (config, stop, done) = (config.clone(), stop.clone(), ingest_done.clone());
        let fence = fence.clone();
        tokio::spawn(async move {
            let r = walfold_source::run_ingest(config, stop, head_tx, fence)
                .await
                .map_err(EngineError::from);
            done.cancel();
            r
        })
    };
    let news = tokio::spawn(tell_head(shared.clone(), head_rx, stop.clone()));
    let pruner = tokio::spawn(prune_periodically(
        config.clone(),
        shared
            .definitions
            .iter()
            .map(|d| d.options.clone())
            .collect(),
        stop.clone(),
        fence.clone(),
    ));
    let mut planners: JoinSet<(String, Result<(), EngineError>)> = JoinSet::new();
    for target in crate::target::Target::all(&config) {
        if target.is_extra() && !shared.definitions.iter().any(|d| d.target == target) {
            continue;
        }
        let planner = Planner {
            shared: shared.clone(),
            fence: fence.clone(),
            dead,
            stop: stop.clone(),
            target,
        };
        let name = format!("the planner of target {}", planner.target.label());
        planners.spawn(super::named(name, planner.run()));
    }
    let mut first_error = None;
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = lost.cancelled() => {}
        _ = ingest_done.cancelled() => {}
        Some(joined) = planners.join_next() => {
            if let Some(e) = super::failure(joined) {
                first_error = Some(e);
            }
        }
    }
    stop.cancel();
    while let Some(joined) = planners.join_next().await {
        if let Some(e) = super::failure(joined) {
            first_error.get_or_insert(e);
        }
    }
    pruner.abort();
    news.abort();
    let ingest_result = ingest
        .await
        .unwrap_or_else(|join| Err(super::joined_error("ingest", join)));
    if let Err(e) = ingest_result {
        if !e.is_fenced() {
            tracing::error!(error = %e, "ingest failed; stopping");
        }
        first_error.get_or_insert(e);
    }
    match first_error {
        Some(e) => Err(e),
        None if lost.is_cancelled() => Err(walfold_store::StoreError::Fenced.into()),
        None => Ok(()),
    }
}

/// Passes the head that ingest publishes to this instance's projectors and, as news, to
/// every other instance's (coalesced: the latest head, one notification at a time).
async fn tell_head(shared: Arc<Shared>, mut head: watch::Receiver<i64>, stop: CancellationToken) {
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            changed = head.changed() => if changed.is_err() { return },
        }
        let at = *head.borrow_and_update();
        shared.head_at(at);
        shared.tell(&format!("h {at}")).await;
    }
}

/// The daemon's prune pass, every `retention.prune_interval_s`.
async fn prune_periodically(
    config: Arc<walfold_config::Config>,
    projections: Vec<ProjectionConfig>,
    stop: CancellationToken,
    fence: Fence,
) {
    let every = Duration::from_secs(config.retention.prune_interval_s);
    if every.is_zero() {
        return;
    }
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        match crate::ops::prune_fenced(&config, &projections, Some(&fence)).await {
            Ok(p) if p.claims + p.events > 0 => {
                tracing::info!(claims = p.claims, events = p.events, "pruned")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "prune failed; trying again next time"),
        }
    }
}

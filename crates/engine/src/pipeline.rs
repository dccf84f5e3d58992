//! The pipeline: migrates walfold's schema, waits to lead (one instance per target
//! schema leads; the others stand by), then runs ingest (slot → event log) and, per
//! target, in generations, one projector per subscriber partition: each live projection
//! under its active subscriber, plus each rebuild in progress. A generation ends when
//! the set of rebuilds changes or a rebuild has caught up; its projectors finish their
//! batch and stop, and only then is a rebuild switched over or aborted, so no projector
//! ever writes a table while it is renamed or dropped.
//!
//! Each target (the main one, and every `[targets.NAME]` with projections) runs its own
//! generations: its registry, rebuilds, checkpoints and pauses live there. An extra
//! target is migrated and taken over ([`Fence::extend_to`]) before its first
//! generation; while it cannot be reached its projections are paused (logged once per
//! cause, `walfold_projection_paused`, `/readyz`) and everything else goes on.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use walfold_config::{Config, ProjectionConfig, QualifiedName, VersionMode};
use walfold_store::rebuild::{Readiness, Switch};
use walfold_store::{
    migrate, rebuild, Backoff, Checkpoints, Fence, Leadership, Rebuild, RebuildState,
};
use walfold_telemetry::signal::Signal;

use crate::error::EngineError;
use crate::pool::Pool;
use crate::projection::Projection;
use crate::projector::Partition;
use crate::sql::SqlProjection;
use crate::target::Target;

/// How often the leader looks at rebuilds (new, aborted, caught up, due to finish); a
/// rebuild's partition that reaches the head has it look at once (see
/// [`Generation::reached_head`]).
const CONTROL_PERIOD: Duration = Duration::from_secs(1);
/// How long after a failed switch-over it is tried again.
const SWITCH_BACKOFF: Duration = Duration::from_secs(30);
/// How long a rebuild found not due at its switch-over waits before the next attempt.
const SWITCH_RETRY: Duration = Duration::from_secs(3);
/// How long a rebuild's partitions may take, alone, to catch up with the live ones
/// before a switch-over (the live table does not move meanwhile).
const CATCH_UP_LIMIT: Duration = Duration::from_secs(10);
/// How close to the live subscriber's position every partition of a rebuild must be
/// before its switch-over is tried: the projectors stop, the rebuild's catch up alone
/// (see [`catch_up`]), and the switch checks that none is behind.
const SWITCH_SLACK: i64 = 100;

/// The whole path from the slot to the read models.
pub struct Pipeline {
    config: Arc<Config>,
    custom: Vec<(ProjectionConfig, Arc<dyn Projection>)>,
}

/// A projection the pipeline runs, and how to build it for another table.
#[derive(Clone)]
pub(crate) struct Defined {
    pub options: ProjectionConfig,
    pub live: Arc<dyn Projection>,
    /// Its position in `config.projection` (`None`: written in Rust).
    index: Option<usize>,
    /// Where its state lives.
    target: Target,
}

impl Defined {
    /// The projection writing to `table` (a rebuild's shadow); `None` if it cannot.
    fn for_table(
        &self,
        schema: &walfold_store::Schema,
        table: &QualifiedName,
    ) -> Result<Option<Arc<dyn Projection>>, EngineError> {
        match self.index {
            Some(i) => build(&self.options, i, schema, Some(table)).map(Some),
            None => Ok(self.live.for_table(table)),
        }
    }
}

/// Compiles a `sql`/`table` projection, for its own table or for `table`. It is
/// installed by its projectors (see [`Projection::install`]).
fn build(
    options: &ProjectionConfig,
    index: usize,
    schema: &walfold_store::Schema,
    table: Option<&QualifiedName>,
) -> Result<Arc<dyn Projection>, EngineError> {
    let invalid = |message: String| EngineError::Projection {
        projection: options.name.clone(),
        message,
    };
    let statement = options.statement_for(index, table).map_err(|problems| {
        invalid(
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    let projection = SqlProjection::new(&statement, schema).map_err(|e| invalid(e.to_string()))?;
    Ok(Arc::new(projection))
}

impl Pipeline {
    /// A pipeline for the projections in `config`.
    pub fn new(config: Config) -> Pipeline {
        Pipeline {
            config: Arc::new(config),
            custom: Vec::new(),
        }
    }

    /// Adds a projection written in Rust. `options` gives its name, subscriber, filters,
    /// parallelism and batching; its `kind` is [`ProjectionKind::Code`](walfold_config::ProjectionKind::Code), whose `target` names
    /// its table for rebuilds (see [`Projection::for_table`]).
    pub fn with_projection(
        mut self,
        options: ProjectionConfig,
        projection: Arc<dyn Projection>,
    ) -> Pipeline {
        self.custom.push((options, projection));
        self
    }

    /// Runs until `cancel`; then finishes in-flight batches, sends final feedback and
    /// returns. A definite error (e.g. wal_level is not logical) stops everything.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), EngineError> {
        let code: Vec<ProjectionConfig> = self.custom.iter().map(|(o, _)| o.clone()).collect();
        self.config.validate_with(&code)?;
        let config = self.config;
        let schema = Target::main(&config).schema;
        let mut defined = Vec::new();
        for (i, p) in config.projection.iter().enumerate() {
            let target = Target::of(&config, p);
            defined.push(Defined {
                options: p.clone(),
                live: build(p, i, &target.schema, None)?,
                index: Some(i),
                target,
            });
        }
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        loop {
            match migrate(config.target_url(), &schema).await {
                Ok(()) => break,
                Err(e) if e.kind().retries() => {
                    tracing::warn!(error = %e, "cannot create or upgrade walfold's schema yet; retrying");
                    if !backoff.sleep(&cancel).await {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        defined.extend(self.custom.into_iter().map(|(options, live)| Defined {
            target: Target::of(&config, &options),
            options,
            live,
            index: None,
        }));
        loop {
            let Some(leader) = Leadership::acquire(config.target_url(), &schema, &cancel).await?
            else {
                return Ok(());
            };
            let lost = leader.lost();
            Signal::LeadershipTaken.report();
            let result = lead(&config, &defined, &cancel, &lost, &leader.fence()).await;
            Signal::LeadershipEnded.report();
            drop(leader);
            if cancel.is_cancelled() || !lost.is_cancelled() {
                return result;
            }
            tracing::warn!("lost leadership; stopped and standing by again");
        }
    }
}

/// One projector set: what runs until the rebuilds change.
struct Generation {
    workers: Vec<(String, Partition)>,
    /// The connections its partitions share.
    pools: TargetPools,
    /// Log pages shared by this generation's partitions.
    pages: Arc<crate::pages::SharedPages>,
    /// Rebuilds replaying now.
    replaying: Vec<Replay>,
    /// The open rebuilds this generation was planned for: a change means plan again.
    planned: Vec<Planned>,
    /// Projections whose retired tables are dropped after a while.
    retire_after: Vec<RetireAfter>,
    /// Whether a blocked rebuild was reported in this generation.
    warned: AtomicBool,
    /// Rebuilds whose switch-over failed: not tried again before SWITCH_BACKOFF.
    failed_switches: Vec<FailedSwitch>,
    /// Told by a rebuild's partition when its read reaches the head: the control loop
    /// then looks whether the rebuild is due to switch over without waiting for its
    /// next period.
    reached_head: Arc<tokio::sync::Notify>,
}

/// A rebuild replaying in this generation.
struct Replay {
    rebuild: Rebuild,
    /// Its subscriber's partitions.
    partitions: u32,
    /// How close to the head counts as caught up.
    slack: i64,
}

/// An open rebuild as the plan saw it.
#[derive(PartialEq)]
struct Planned {
    subscriber: String,
    state: RebuildState,
}

impl Planned {
    fn of(open: &[Rebuild]) -> Vec<Planned> {
        open.iter()
            .map(|r| Planned {
                subscriber: r.subscriber.clone(),
                state: r.state,
            })
            .collect()
    }
}

/// A projection's `drop_retired_after`.
struct RetireAfter {
    projection: String,
    after: Duration,
}

/// A rebuild whose switch-over failed or was not due yet, and until when it waits.
#[derive(Clone)]
struct FailedSwitch {
    subscriber: String,
    until: tokio::time::Instant,
}

/// Whether `r`'s retired table has been kept as long as its projection wants.
fn retired_due(retire_after: &[RetireAfter], r: &Rebuild, now_unix: f64) -> bool {
    retire_after
        .iter()
        .any(|a| a.projection == r.projection && r.retired_longer_than(a.after, now_unix))
}

/// What ends a generation.
enum Next {
    Stop,
    Replan,
    Switch(Rebuild),
    Failed(EngineError),
}

/// Runs ingest and every target's projectors while this instance leads.
async fn lead(
    config: &Arc<Config>,
    defined: &[Defined],
    cancel: &CancellationToken,
    lost: &CancellationToken,
    fence: &Fence,
) -> Result<(), EngineError> {
    let (head_tx, head_rx) = watch::channel(0i64);
    // Every task stops on `stop`: shutdown, lost leadership, or a task's error. On
    // shutdown projectors finish their batch while ingest drains.
    let stop = cancel.child_token();
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
    let pruner = tokio::spawn(prune_periodically(
        config.clone(),
        defined.iter().map(|d| d.options.clone()).collect(),
        stop.clone(),
        fence.clone(),
    ));
    let mut targets: JoinSet<(String, Result<(), EngineError>)> = JoinSet::new();
    for (target, pools) in TargetPools::all(config) {
        let here: Vec<Defined> = defined
            .iter()
            .filter(|d| d.target == target)
            .cloned()
            .collect();
        if target.is_extra() && here.is_empty() {
            continue;
        }
        let run = Projecting {
            config: config.clone(),
            target,
            defined: here,
            stop: stop.clone(),
            lost: lost.clone(),
            ingest_done: ingest_done.clone(),
            fence: fence.clone(),
            head: head_rx.clone(),
            pools,
        };
        targets.spawn(named(format!("target {}", run.target.label()), run.run()));
    }
    let mut first_error = None;
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = lost.cancelled() => {}
        _ = ingest_done.cancelled() => {}
        Some(joined) = targets.join_next() => {
            if let Some(e) = target_failure(joined) {
                first_error = Some(e);
            }
        }
    }
    stop.cancel();
    while let Some(joined) = targets.join_next().await {
        if let Some(e) = target_failure(joined) {
            first_error.get_or_insert(e);
        }
    }
    pruner.abort();
    let ingest_result = ingest
        .await
        .unwrap_or_else(|join| Err(joined_error("ingest", join)));
    if let Err(e) = ingest_result {
        tracing::error!(error = %e, "ingest failed; stopping");
        first_error.get_or_insert(e);
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn target_failure(
    joined: Result<(String, Result<(), EngineError>), tokio::task::JoinError>,
) -> Option<EngineError> {
    match joined {
        Ok((_, Ok(()))) => None,
        Ok((_, Err(e))) => Some(e),
        Err(join) => Some(joined_error("a target's projectors", join)),
    }
}

/// Runs `task` as `name`: a panic becomes [`EngineError::Panicked`] naming it, so the
/// joining side knows which task it was.
async fn named(
    name: String,
    task: impl Future<Output = Result<(), EngineError>>,
) -> (String, Result<(), EngineError>) {
    let result = AssertUnwindSafe(task)
        .catch_unwind()
        .await
        .unwrap_or_else(|payload| Err(EngineError::panicked(&name, &*payload)));
    (name, result)
}

/// A task that ended without its result: it panicked (outside [`named`]) or was
/// cancelled with the runtime. Either way a stop.
fn joined_error(task: &str, join: tokio::task::JoinError) -> EngineError {
    match join.try_into_panic() {
        Ok(payload) => EngineError::panicked(task, &*payload),
        Err(join) => EngineError::Panicked {
            task: task.to_owned(),
            message: join.to_string(),
        },
    }
}

/// The connections one target's projectors share: its own, and the main target's for
/// reading the log when it is an extra target. Made once per leading term, so every
/// generation and target takes from the same budget.
#[derive(Clone)]
struct TargetPools {
    target: Arc<Pool>,
    log: Option<Arc<Pool>>,
}

impl TargetPools {
    /// Every target's, the main target's first (by [`Target::all`]'s order).
    fn all(config: &Config) -> Vec<(Target, TargetPools)> {
        let targets = Target::all(config);
        let main = Pool::new(&targets[0].url, config.target.pool_size);
        targets
            .into_iter()
            .map(|target| {
                let pools = match &target.name {
                    None => TargetPools {
                        target: main.clone(),
                        log: None,
                    },
                    Some(name) => TargetPools {
                        target: Pool::new(&target.url, config.targets[name].pool_size),
                        log: Some(main.clone()),
                    },
                };
                (target, pools)
            })
            .collect()
    }
}

/// One target's projector generations, while this instance leads.
struct Projecting {
    config: Arc<Config>,
    target: Target,
    defined: Vec<Defined>,
    stop: CancellationToken,
    lost: CancellationToken,
    ingest_done: CancellationToken,
    /// The leader's fence (on the main target).
    fence: Fence,
    head: watch::Receiver<i64>,
    pools: TargetPools,
}

/// What the generations of an extra target need beyond the main target's: its lease
/// (the fence there).
struct Extra {
    _lease: walfold_store::TargetLease,
}

impl Projecting {
    async fn run(self) -> Result<(), EngineError> {
        let Projecting {
            config,
            target,
            defined,
            stop,
            lost,
            ingest_done,
            fence: main_fence,
            head: head_rx,
            pools,
        } = &self;
        let schema = &target.schema;
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        let mut down = TargetDown::new(target, defined);
        let mut extra: Option<(Extra, Fence)> = None;
        // Rebuilds whose switch-over failed (tried again after SWITCH_BACKOFF) or found
        // the rebuild not due after all (after SWITCH_RETRY).
        let mut failed_switches: Vec<FailedSwitch> = Vec::new();
        while !stop.is_cancelled() && !lost.is_cancelled() && !ingest_done.is_cancelled() {
            if target.is_extra() && extra.is_none() {
                match take_over(config, target, main_fence).await {
                    Ok(taken) => extra = Some(taken),
                    Err(e) if e.kind().retries() => {
                        down.enter(&e);
                        tokio::select! {
                            _ = lost.cancelled() => {}
                            _ = backoff.sleep(stop) => {}
                        }
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            let fence = extra.as_ref().map_or(main_fence, |(_, f)| f);
            let control = match plan(config, target, pools, defined, fence).await {
                Ok(planned) => planned,
                Err(e) if e.kind().retries() => {
                    if target.is_extra() {
                        down.enter(&e);
                        extra = None;
                    } else {
                        tracing::warn!(error = %e, "cannot plan the projectors; retrying");
                    }
                    tokio::select! {
                        _ = lost.cancelled() => {}
                        _ = backoff.sleep(stop) => {}
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            down.leave();
            backoff.reset();
            let (mut client, mut generation) = control;
            // A later outage pauses the subscribers that run now (a rebuild may have
            // switched one).
            down.serving(&generation);
            failed_switches.retain(|f| f.until > tokio::time::Instant::now());
            generation.failed_switches = failed_switches.clone();
            let this = stop.child_token();
            let mut tasks: JoinSet<(String, Result<(), EngineError>)> = JoinSet::new();
            for (name, worker) in generation.workers.iter().cloned() {
                let (this, head) = (this.clone(), head_rx.clone());
                tasks.spawn(named(name, worker.run(this, head)));
            }
            let next = watch_generation(
                &mut client,
                schema,
                &generation,
                &mut tasks,
                stop,
                lost,
                ingest_done,
            )
            .await;
            this.cancel();
            let mut failed = None;
            while let Some(joined) = tasks.join_next().await {
                if let Some(e) = failure(joined) {
                    failed.get_or_insert(e);
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
            match next {
                Next::Stop => break,
                Next::Failed(e) => return Err(e),
                // The lease stays: if the target went away, the next plan fails and it is
                // taken over again then.
                Next::Replan => {}
                Next::Switch(r) if !lost.is_cancelled() => {
                    catch_up(&client, schema, &generation, &r, head_rx, stop).await;
                    match rebuild::switch(&mut client, schema, &r, fence).await {
                        Ok(Switch::Done) => {
                            tracing::info!(target = target.label(), projection = %r.projection, subscriber = %r.subscriber, live = %r.live, retired = %r.retired, "rebuild switched over: the rebuilt table is live")
                        }
                        Ok(Switch::Gone) => {}
                        // Its projectors stopped a batch behind the live ones (or a
                        // dead letter came with it): they go on, and it is tried again.
                        Ok(Switch::NotYet(why)) => {
                            tracing::info!(target = target.label(), projection = %r.projection, why = %why, "switch-over not due yet; trying again in {}s", SWITCH_RETRY.as_secs());
                            // Said in status too: after the catch-up, this is something
                            // an operator may need to see (a paused or slow partition).
                            if let Err(note) =
                                rebuild::switch_failed(&mut client, schema, &r, &why, fence).await
                            {
                                tracing::debug!(error = %note, "could not record why the switch-over waits");
                            }
                            failed_switches.push(FailedSwitch {
                                subscriber: r.subscriber.clone(),
                                until: tokio::time::Instant::now() + SWITCH_RETRY,
                            });
                        }
                        Err(e) => {
                            tracing::warn!(target = target.label(), projection = %r.projection, error = %e, "switch-over failed; trying again in {}s", SWITCH_BACKOFF.as_secs());
                            // Best effort: what failed the switch may fail this too.
                            if let Err(note) = rebuild::switch_failed(
                                &mut client,
                                schema,
                                &r,
                                &e.to_string(),
                                fence,
                            )
                            .await
                            {
                                tracing::debug!(error = %note, "could not record the failed switch-over");
                            }
                            failed_switches.push(FailedSwitch {
                                subscriber: r.subscriber.clone(),
                                until: tokio::time::Instant::now() + SWITCH_BACKOFF,
                            });
                        }
                    }
                }
                Next::Switch(_) => break,
            }
        }
        down.leave();
        Ok(())
    }
}

/// Migrates an extra target's walfold schema and takes it over for this leader; opens
/// the connection to the log's target its control checks read the head from.
async fn take_over(
    config: &Config,
    target: &Target,
    fence: &Fence,
) -> Result<(Extra, Fence), EngineError> {
    let unreachable = |source| EngineError::Unreachable {
        target: target.label().to_owned(),
        source,
    };
    migrate(&target.url, &target.schema)
        .await
        .map_err(unreachable)?;
    let lease = fence
        .extend_to(&target.url, &target.schema)
        .await
        .map_err(|e| match e {
            // A newer leader wrote there: this instance stands down (not a pause).
            walfold_store::StoreError::Fenced => e.into(),
            other => unreachable(other),
        })?;
    let mut log = walfold_store::connect(config.target_url()).await?;
    walfold_store::register_target(
        &mut log,
        &Target::main(config).schema,
        target.label(),
        fence,
    )
    .await?;
    let fence = lease.fence();
    Ok((Extra { _lease: lease }, fence))
}

/// An extra target that cannot be reached: its projections count as paused (once per
/// subscriber, in `walfold_projection_paused` and `/readyz`) and the cause is logged
/// once per change, until a plan there succeeds.
struct TargetDown {
    target: String,
    subscribers: Vec<String>,
    cause: Option<String>,
}

impl TargetDown {
    fn new(target: &Target, defined: &[Defined]) -> TargetDown {
        TargetDown {
            target: target.label().to_owned(),
            subscribers: defined
                .iter()
                .map(|d| d.options.subscriber.clone())
                .collect(),
            cause: None,
        }
    }

    /// The subscribers of `generation`, counted as paused while the target is down.
    fn serving(&mut self, generation: &Generation) {
        let mut subscribers: Vec<String> = Vec::new();
        for (_, w) in &generation.workers {
            if !subscribers.contains(&w.options.subscriber) {
                subscribers.push(w.options.subscriber.clone());
            }
        }
        self.subscribers = subscribers;
    }

    fn enter(&mut self, e: &EngineError) {
        let cause = e.to_string();
        if self.cause.is_none() {
            Signal::TargetPaused {
                subscribers: &self.subscribers,
            }
            .report();
        }
        if self.cause.as_deref() != Some(cause.as_str()) {
            Signal::TargetPauseCause {
                target: &self.target,
                subscribers: &self.subscribers,
                error: e,
            }
            .report();
            self.cause = Some(cause);
        }
    }

    fn leave(&mut self) {
        if self.cause.take().is_some() {
            Signal::TargetResumed {
                target: &self.target,
                subscribers: &self.subscribers,
            }
            .report();
        }
    }
}

/// A finished projector task's error, if it failed.
fn failure(
    joined: Result<(String, Result<(), EngineError>), tokio::task::JoinError>,
) -> Option<EngineError> {
    match joined {
        Ok((_, Ok(()))) => None,
        Ok((task, Err(e))) => {
            tracing::error!(task = %task, error = %e, "projector failed; stopping");
            Some(e)
        }
        Err(join) => Some(joined_error("a projector", join)),
    }
}

/// Decides what runs: ends rebuilds asked to abort (no projector runs now), drops
/// retired tables that are due, resolves each projection's active subscriber and
/// installs every projection. Returns the control connection with the plan.
async fn plan(
    config: &Config,
    target: &Target,
    pools: &TargetPools,
    defined: &[Defined],
    fence: &Fence,
) -> Result<(Client, Generation), EngineError> {
    let schema = &target.schema;
    let mut client = walfold_store::connect(&target.url)
        .await
        .map_err(|source| match target.is_extra() {
            true => EngineError::Unreachable {
                target: target.label().to_owned(),
                source,
            },
            false => source.into(),
        })?;
    let open = rebuild::open_settled(&client, schema).await?;
    walfold_store::clear_pauses(&mut client, fence, schema).await?;
    let now = unix_now();
    let retire_after: Vec<RetireAfter> = defined
        .iter()
        .filter_map(|d| {
            Some(RetireAfter {
                projection: d.options.name.clone(),
                after: d.options.drop_retired_after.after()?,
            })
        })
        .collect();
    for r in &open {
        if r.state == RebuildState::Aborting {
            crate::ops::end_abort(&mut client, schema, r, fence).await?;
        } else if retired_due(&retire_after, r, now) {
            // Not fatal: e.g. `--finish` came first, or something still depends on the
            // retired table (then it stays until an operator acts).
            match rebuild::finish(&mut client, schema, &r.projection, Some(fence)).await {
                Ok(finished) => {
                    tracing::info!(projection = %r.projection, retired = %finished.retired, "retired table dropped (drop_retired_after)")
                }
                Err(e) => {
                    tracing::warn!(projection = %r.projection, error = %e, "could not drop the retired table")
                }
            }
        }
    }
    let open = rebuild::open_settled(&client, schema).await?;
    let mut generation = Generation {
        workers: Vec::new(),
        pools: pools.clone(),
        pages: Arc::new(crate::pages::SharedPages::new(config.pipeline.page_bytes)),
        replaying: Vec::new(),
        planned: Planned::of(&open),
        retire_after,
        warned: AtomicBool::new(false),
        failed_switches: Vec::new(),
        reached_head: Arc::new(tokio::sync::Notify::new()),
    };
    for d in defined {
        let mut options = d.options.clone();
        options.subscriber = walfold_store::active_subscriber(
            &mut client,
            schema,
            &options.name,
            &options.subscriber,
            options.storage().as_ref(),
        )
        .await?;
        if options.version_mode == VersionMode::Strict
            && walfold_store::ran_without_versions(&client, schema, &options.subscriber).await?
        {
            return Err(EngineError::Projection {
                projection: options.name.clone(),
                message: format!(
                    "subscriber {} applied events in version_mode = \"guard\", so walfold does not \
                     know which versions it applied: strict mode needs them from the first one. \
                     Rebuild under a new subscriber (walfold rebuild {} --subscriber {}.strict) \
                     with version_mode = \"strict\", or keep \"guard\"",
                    options.subscriber, options.name, options.subscriber
                ),
            });
        }
        push_workers(
            &mut generation,
            &mut client,
            config,
            target,
            &options,
            &d.live,
            &options.name,
            fence,
        )
        .await?;
        let Some(r) = open
            .iter()
            .find(|r| r.projection == options.name && r.state == RebuildState::Running)
        else {
            continue;
        };
        let Some(shadow) = d.for_table(schema, &r.shadow_table())? else {
            tracing::error!(projection = %options.name, "this projection cannot write to another table (no `target`, or a Rust projection without for_table); abort its rebuild");
            continue;
        };
        let mut replay = options.clone();
        replay.subscriber = r.subscriber.clone();
        replay.batch_size = options.rebuild_batch_size;
        let live_workers = generation.workers.len();
        push_workers(
            &mut generation,
            &mut client,
            config,
            target,
            &replay,
            &shadow,
            &format!("{}~rebuild", options.name),
            fence,
        )
        .await?;
        for (_, worker) in &mut generation.workers[live_workers..] {
            worker.reached_head = Some(generation.reached_head.clone());
        }
        generation.replaying.push(Replay {
            rebuild: r.clone(),
            partitions: replay.parallelism,
            slack: SWITCH_SLACK.min(replay.batch_size as i64),
        });
    }
    for r in open.iter().filter(|r| r.state == RebuildState::Running) {
        if !defined.iter().any(|d| d.options.name == r.projection) {
            tracing::warn!(target = target.label(), projection = %r.projection, "a rebuild is recorded for a projection this config does not have here; not running it");
        }
    }
    Ok((client, generation))
}

/// Adds a subscriber's partitions to the generation, with its checkpoints made to
/// match its partition count first (one transaction, before any of them runs).
#[allow(clippy::too_many_arguments)]
async fn push_workers(
    generation: &mut Generation,
    client: &mut Client,
    config: &Config,
    target: &Target,
    options: &ProjectionConfig,
    projection: &Arc<dyn Projection>,
    name: &str,
    fence: &Fence,
) -> Result<(), EngineError> {
    Checkpoints::reconcile(
        client,
        &target.schema,
        &options.subscriber,
        options.parallelism,
        fence,
    )
    .await?;
    for partition in 0..options.parallelism {
        generation.workers.push((
            format!("{name}[{partition}]"),
            Partition {
                schema: target.schema.clone(),
                options: options.clone(),
                projection: projection.clone(),
                partition,
                fence: fence.clone(),
                pages: generation.pages.clone(),
                target: target.name.clone(),
                log: target.is_extra().then(|| Target::main(config)),
                until: None,
                reached_head: None,
                pool: generation.pools.target.clone(),
                log_pool: generation.pools.log.clone(),
            },
        ));
    }
    Ok(())
}

/// Before a switch-over, with every projector of the generation stopped: the rebuild's
/// partitions run alone until each has read as far as the live subscriber's (the live
/// table does not move meanwhile), at most `CATCH_UP_LIMIT`. Under a steady stream the
/// two stop at different points; without this the switch would find the rebuild a
/// batch behind again and again. The switch transaction checks the result.
async fn catch_up(
    client: &Client,
    schema: &walfold_store::Schema,
    generation: &Generation,
    r: &Rebuild,
    head: &watch::Receiver<i64>,
    stop: &CancellationToken,
) {
    let to = match rebuild::catch_up_to(client, schema, r).await {
        // Every partition has read as far as the live one: nothing to run.
        Ok(to) if to.is_empty() => return,
        Ok(to) => to,
        Err(e) => {
            tracing::warn!(projection = %r.projection, error = %e, "cannot read where the rebuild must catch up to");
            return;
        }
    };
    let cancel = stop.child_token();
    let mut tasks: JoinSet<(String, Result<(), EngineError>)> = JoinSet::new();
    for (name, worker) in &generation.workers {
        if worker.options.subscriber != r.subscriber {
            continue;
        }
        let Some((_, until)) = to.iter().find(|(p, _)| *p as u32 == worker.partition) else {
            continue;
        };
        let mut worker = worker.clone();
        worker.until = Some(*until);
        let (name, cancel, head) = (name.clone(), cancel.clone(), head.clone());
        tasks.spawn(named(name, worker.run(cancel, head)));
    }
    let joined = async {
        while let Some(done) = tasks.join_next().await {
            if let Some(e) = failure(done) {
                tracing::warn!(projection = %r.projection, error = %e, "a rebuild partition failed while catching up");
            }
        }
    };
    if tokio::time::timeout(CATCH_UP_LIMIT, joined).await.is_err() {
        cancel.cancel();
        while tasks.join_next().await.is_some() {}
    }
}

/// Waits until the generation must end.
async fn watch_generation(
    client: &mut Client,
    schema: &walfold_store::Schema,
    generation: &Generation,
    tasks: &mut JoinSet<(String, Result<(), EngineError>)>,
    stop: &CancellationToken,
    lost: &CancellationToken,
    ingest_done: &CancellationToken,
) -> Next {
    let mut tick = tokio::time::interval(CONTROL_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Next::Stop,
            _ = lost.cancelled() => return Next::Stop,
            _ = ingest_done.cancelled() => return Next::Stop,
            Some(joined) = tasks.join_next() => {
                if let Some(e) = failure(joined) {
                    return Next::Failed(e);
                }
            }
            _ = async {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = generation.reached_head.notified() => {}
                }
            } => match control_check(client, schema, generation).await {
                Ok(Some(next)) => return next,
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot check rebuilds; planning again");
                    return Next::Replan;
                }
            },
        }
    }
}

/// A change of rebuilds since the plan, or a rebuild that has caught up.
async fn control_check(
    client: &Client,
    schema: &walfold_store::Schema,
    generation: &Generation,
) -> Result<Option<Next>, EngineError> {
    let open = rebuild::open(client, schema).await?;
    if Planned::of(&open) != generation.planned {
        return Ok(Some(Next::Replan));
    }
    for Replay {
        rebuild: r,
        partitions,
        slack,
    } in &generation.replaying
    {
        let backing_off = generation
            .failed_switches
            .iter()
            .any(|f| f.subscriber == r.subscriber && f.until > tokio::time::Instant::now());
        if backing_off {
            continue;
        }
        match rebuild::readiness(client, schema, r, *partitions, *slack).await? {
            Readiness::Ready => return Ok(Some(Next::Switch(r.clone()))),
            Readiness::Blocked(n) if !generation.warned.swap(true, Ordering::Relaxed) => {
                tracing::warn!(projection = %r.projection, subscriber = %r.subscriber, dead_letters = n, "the rebuild has caught up but waits: it has open dead letters (retry or discard them)");
            }
            _ => {}
        }
    }
    let now_unix = unix_now();
    Ok(open
        .iter()
        .any(|r| retired_due(&generation.retire_after, r, now_unix))
        .then_some(Next::Replan))
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The daemon's prune pass, every `retention.prune_interval_s`.
async fn prune_periodically(
    config: Arc<Config>,
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

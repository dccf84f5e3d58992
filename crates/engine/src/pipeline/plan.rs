//! The leader's planner for one target: which work units exist there. One unit per
//! partition of each live projection's active subscriber and of each rebuild replaying;
//! instances take them by `assign.rs`. A change of plan that would have two layouts of
//! one subscriber run at once (a new partition count, a rebuild ended or switched over)
//! first holds the units concerned (`work_unit::hold`: their owners' next write fails at
//! its fence, and their transactions in flight end before the planner goes on), so no
//! projector ever writes a table while it is renamed or dropped, or a checkpoint while
//! it is moved. A new rebuild only adds units: nothing else stops.
//!
//! An extra target is migrated and taken over ([`Fence::extend_to`]) before its first
//! plan; while it cannot be reached or used (down, or behind a pooler that shares
//! sessions), its projections count as paused here and everything else goes on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use walfold_config::VersionMode;
use walfold_store::rebuild::Readiness;
use walfold_store::work_unit::{self, Planned, Unit};
use walfold_store::{migrate, rebuild, Backoff, Checkpoints, Fence, Rebuild, RebuildState};

use super::changed::Decided;
use super::definition::Definition;
use super::instance::Shared;
use super::switch::{self, FailedSwitch};
use super::target_down::TargetDown;
use crate::error::EngineError;
use crate::target::Target;

/// How often the planner looks at rebuilds (new, aborted, caught up, due to finish); a
/// rebuild's partition that reaches the head has it look at once.
const CONTROL_PERIOD: Duration = Duration::from_secs(1);
/// How close to the live subscriber's position every partition of a rebuild must be
/// before its switch-over is tried (see `switch.rs`).
const SWITCH_SLACK: i64 = 100;

/// One target's planner, while this instance leads.
pub(super) struct Planner {
    pub shared: Arc<Shared>,
    pub target: Target,
    /// The leader's fence on the main target.
    pub fence: Fence,
    /// The previous leader's tag, when it died: its sessions on this target are ended.
    pub dead: Option<i32>,
    pub stop: CancellationToken,
}

/// What a plan was made for: the open rebuilds as they were.
#[derive(PartialEq)]
struct Basis {
    rebuilds: Vec<(String, RebuildState)>,
}

impl Basis {
    fn of(open: &[Rebuild]) -> Basis {
        Basis {
            rebuilds: open
                .iter()
                .map(|r| (r.subscriber.clone(), r.state))
                .collect(),
        }
    }
}

/// What the planner keeps between rounds.
struct Rounds {
    basis: Option<Basis>,
    /// Each projection's live subscriber, as last planned.
    live: HashMap<String, String>,
    failed: Vec<FailedSwitch>,
    /// Rebuilds whose wait on dead letters was said.
    warned: Vec<String>,
}

impl Planner {
    fn definitions(&self) -> Vec<&Definition> {
        self.shared
            .definitions
            .iter()
            .filter(|d| d.target == self.target)
            .collect()
    }

    pub(super) async fn run(self) -> Result<(), EngineError> {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        let mut down = TargetDown::new(self.target.label());
        down.serving(
            self.definitions()
                .iter()
                .map(|d| d.options.subscriber.clone()),
        );
        let mut lease: Option<(walfold_store::TargetLease, Fence)> = None;
        let mut client: Option<Client> = None;
        let mut rounds = Rounds {
            basis: None,
            live: HashMap::new(),
            failed: Vec::new(),
            warned: Vec::new(),
        };
        while !self.stop.is_cancelled() {
            let result = async {
                if self.target.is_extra() && lease.is_none() {
                    lease = Some(self.take_over().await?);
                }
                let fence = lease.as_ref().map_or(&self.fence, |(_, f)| f).clone();
                if client.as_ref().is_none_or(Client::is_closed) {
                    client = Some(self.connect().await?);
                    rounds.basis = None;
                }
                let c = client.as_mut().expect("connected above");
                self.round(c, &fence, &mut rounds).await
            }
            .await;
            match result {
                Ok(()) => {
                    down.leave();
                    backoff.reset();
                    tokio::select! {
                        _ = self.stop.cancelled() => {}
                        _ = tokio::time::sleep(CONTROL_PERIOD) => {}
                        _ = self.shared.planners.notified() => {}
                    }
                }
                // A newer leader: this one stands down.
                Err(e) if e.is_fenced() => return Ok(()),
                // An extra target that cannot be used, even for good (behind a pooler
                // that shares sessions, a schema of a newer release): only its
                // projections pause, and it is looked at again, so fixing its URL's
                // server (a session pool) needs no restart.
                Err(e) if e.kind().retries() || e.is_unusable_target() => {
                    if self.target.is_extra() {
                        down.enter(&e);
                        lease = None;
                    } else {
                        tracing::warn!(error = %e, "cannot plan the work units; retrying");
                    }
                    client = None;
                    if !backoff.sleep(&self.stop).await {
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        down.leave();
        Ok(())
    }

    async fn connect(&self) -> Result<Client, EngineError> {
        walfold_pg::connect(&self.target.url)
            .await
            .map_err(|source| self.unreachable(source.into()))
    }

    fn unreachable(&self, source: walfold_store::StoreError) -> EngineError {
        match self.target.is_extra() {
            true => EngineError::Unreachable {
                target: self.target.label().to_owned(),
                source,
            },
            false => source.into(),
        }
    }

    /// Migrates an extra target's walfold schema and takes it over for this leader.
    async fn take_over(&self) -> Result<(walfold_store::TargetLease, Fence), EngineError> {
        let (config, target) = (&self.shared.config, &self.target);
        migrate(&target.url, &target.schema)
            .await
            .map_err(|e| self.unreachable(e))?;
        if let Some(dead) = self.dead {
            let client = self.connect().await?;
            walfold_store::instance::end_sessions(&client, &target.schema, dead)
                .await
                .map_err(|e| self.unreachable(e))?;
        }
        let lease = self
            .fence
            .extend_to(&target.url, &target.schema, self.dead)
            .await
            .map_err(|e| match e {
                // A newer leader wrote there: this instance stands down (not a pause).
                walfold_store::StoreError::Fenced => e.into(),
                other => self.unreachable(other),
            })?;
        let mut log = walfold_pg::connect(config.target_url()).await?;
        walfold_store::register_target(
            &mut log,
            &Target::main(config).schema,
            target.label(),
            &self.fence,
        )
        .await?;
        let fence = lease.fence();
        Ok((lease, fence))
    }

    /// One look: ends aborted rebuilds, drops retired tables that are due, plans the
    /// units again when the rebuilds changed, and switches over a rebuild that caught up.
    async fn round(
        &self,
        client: &mut Client,
        fence: &Fence,
        rounds: &mut Rounds,
    ) -> Result<(), EngineError> {
        let schema = &self.target.schema;
        if rounds.basis.is_none() {
            // A switch-over or a change of layout cut short (a change of leader, the
            // target down): the plan below puts the units right.
            self.fenced(client, fence, async |tx, schema| {
                for u in work_unit::units(tx, schema)
                    .await?
                    .iter()
                    .filter(|u| u.held)
                {
                    work_unit::let_go(tx, schema, &u.key.subscriber).await?;
                }
                Ok(())
            })
            .await?;
        }
        let mut open = rebuild::open_settled(client, schema).await?;
        if self.end_and_retire(client, fence, &open).await? {
            open = rebuild::open_settled(client, schema).await?;
        }
        let basis = Basis::of(&open);
        if rounds.basis.as_ref() != Some(&basis) && self.plan(client, fence, &open, rounds).await? {
            rounds.basis = Some(basis);
        }
        rounds.failed.retain(|f| !f.over());
        for r in open.iter().filter(|r| r.state == RebuildState::Running) {
            if rounds.failed.iter().any(|f| f.subscriber == r.subscriber) {
                continue;
            }
            let Some(live) = rounds.live.get(&r.projection).cloned() else {
                continue;
            };
            let Some(definition) = self
                .definitions()
                .into_iter()
                .find(|d| d.options.name == r.projection)
            else {
                continue;
            };
            let partitions = definition.options.parallelism;
            let slack = SWITCH_SLACK.min(definition.options.rebuild_batch_size as i64);
            match rebuild::readiness(client, schema, r, partitions, slack).await? {
                Readiness::Ready => {
                    let units = work_unit::units(&*client, schema).await?;
                    if !units.iter().any(|u| u.key.subscriber == r.subscriber) {
                        continue;
                    }
                    let switched = switch::Switch {
                        planner: self,
                        definition,
                        rebuild: r,
                        live: &live,
                        fence,
                    }
                    .run(client, &mut rounds.failed)
                    .await?;
                    if switched {
                        rounds
                            .live
                            .insert(r.projection.clone(), r.subscriber.clone());
                    }
                    // The plan is made again next round: the rebuilds changed.
                    rounds.basis = None;
                    return Ok(());
                }
                Readiness::Blocked(n) if !rounds.warned.contains(&r.subscriber) => {
                    rounds.warned.push(r.subscriber.clone());
                    tracing::warn!(projection = %r.projection, subscriber = %r.subscriber, dead_letters = n, "the rebuild has caught up but waits: it has open dead letters (retry or discard them)");
                }
                _ => {}
            }
        }
        let now = unix_now();
        if open.iter().any(|r| self.retired_due(r, now)) {
            rounds.basis = None;
        }
        Ok(())
    }

    /// Ends rebuilds asked to abort (their units held first) and drops retired tables
    /// that are due; whether anything changed.
    async fn end_and_retire(
        &self,
        client: &mut Client,
        fence: &Fence,
        open: &[Rebuild],
    ) -> Result<bool, EngineError> {
        let schema = &self.target.schema;
        let now = unix_now();
        let mut changed = false;
        for r in open {
            if r.state == RebuildState::Aborting {
                self.hold(client, fence, &[&r.subscriber]).await?;
                crate::ops::end_abort(client, schema, r, fence).await?;
                self.fenced(client, fence, async |tx, schema| {
                    work_unit::unplan(tx, schema, &r.subscriber).await
                })
                .await?;
                changed = true;
            } else if self.retired_due(r, now) {
                // Not fatal: e.g. `--finish` came first, or something still depends on
                // the retired table (then it stays until an operator acts).
                match rebuild::finish(client, schema, &r.projection, Some(fence)).await {
                    Ok(finished) => {
                        tracing::info!(projection = %r.projection, retired = %finished.retired, "retired table dropped (drop_retired_after)")
                    }
                    Err(e) => {
                        tracing::warn!(projection = %r.projection, error = %e, "could not drop the retired table")
                    }
                }
                changed = true;
            }
        }
        Ok(changed)
    }

    /// Whether `r`'s retired table has been kept as long as its projection wants.
    fn retired_due(&self, r: &Rebuild, now_unix: f64) -> bool {
        self.definitions().iter().any(|d| {
            d.options.name == r.projection
                && d.options
                    .drop_retired_after
                    .after()
                    .is_some_and(|after| r.retired_longer_than(after, now_unix))
        })
    }

    /// The units this target should have, made so: resolves each projection's active
    /// subscriber (the registry), decides about a changed definition (`changed.rs`), and
    /// adds, changes and removes units to match. `false`: a rebuild started (or waits to
    /// start), so the plan is made again next round.
    async fn plan(
        &self,
        client: &mut Client,
        fence: &Fence,
        open: &[Rebuild],
        rounds: &mut Rounds,
    ) -> Result<bool, EngineError> {
        let schema = &self.target.schema;
        let mut wanted: Vec<Planned> = Vec::new();
        let mut settled = true;
        for d in self.definitions() {
            let options = &d.options;
            let active = walfold_store::active_subscriber(
                client,
                schema,
                &options.name,
                &options.subscriber,
                options.storage().as_ref(),
            )
            .await?;
            let running = open
                .iter()
                .find(|r| r.projection == options.name && r.state == RebuildState::Running);
            let decided = self
                .decide_definition(client, fence, d, &active, running)
                .await?;
            settled &= decided != Decided::Rebuilding;
            // The live subscriber folds with the config's definition only when it matches.
            let folds_config = matches!(decided, Decided::Same | Decided::Recorded);
            if folds_config
                && options.version_mode == VersionMode::Strict
                && walfold_store::ran_without_versions(client, schema, &active).await?
            {
                return Err(EngineError::Projection {
                    projection: options.name.clone(),
                    message: format!(
                        "subscriber {active} applied events in version_mode = \"guard\", so walfold does not \
                         know which versions it applied: strict mode needs them from the first one. \
                         Rebuild under a new subscriber (walfold rebuild {} --subscriber {active}.strict) \
                         with version_mode = \"strict\", or keep \"guard\"",
                        options.name
                    ),
                });
            }
            rounds.live.insert(options.name.clone(), active.clone());
            wanted.push(Planned {
                subscriber: active,
                partitions: options.parallelism,
                projection: options.name.clone(),
                rebuild: false,
            });
            let Some(r) = open
                .iter()
                .find(|r| r.projection == options.name && r.state == RebuildState::Running)
            else {
                continue;
            };
            if d.for_table(schema, &r.shadow_table())?.is_none() {
                tracing::error!(projection = %options.name, "this projection cannot write to another table (no `target`, or a Rust projection without for_table); abort its rebuild");
                continue;
            }
            wanted.push(Planned {
                subscriber: r.subscriber.clone(),
                partitions: options.parallelism,
                projection: options.name.clone(),
                rebuild: true,
            });
        }
        for r in open.iter().filter(|r| r.state == RebuildState::Running) {
            if !self
                .definitions()
                .iter()
                .any(|d| d.options.name == r.projection)
            {
                tracing::warn!(target = self.target.label(), projection = %r.projection, "a rebuild is recorded for a projection this config does not have here; not running it");
            }
        }
        let existing = work_unit::units(&*client, schema).await?;
        let mut changed = false;
        for w in &wanted {
            let mine: Vec<&Unit> = existing
                .iter()
                .filter(|u| u.key.subscriber == w.subscriber)
                .collect();
            let same = mine.len() == w.partitions as usize
                && mine.iter().all(|u| {
                    u.partitions == w.partitions
                        && u.projection == w.projection
                        && u.rebuild == w.rebuild
                });
            if same {
                continue;
            }
            if !mine.is_empty() {
                self.hold(client, fence, &[&w.subscriber]).await?;
            }
            // Every partition moves to the lowest position of the old layout before any
            // unit of the new one runs (guarantee 11).
            Checkpoints::reconcile(client, schema, &w.subscriber, w.partitions, fence).await?;
            self.fenced(client, fence, async |tx, schema| {
                work_unit::unplan(tx, schema, &w.subscriber).await?;
                work_unit::plan(tx, schema, w).await
            })
            .await?;
            tracing::info!(target = self.target.label(), subscriber = %w.subscriber, partitions = w.partitions, rebuild = w.rebuild, "planned the work units");
            changed = true;
        }
        let mut gone: Vec<&str> = existing
            .iter()
            .map(|u| u.key.subscriber.as_str())
            .filter(|s| !wanted.iter().any(|w| w.subscriber == *s))
            .collect();
        gone.dedup();
        for subscriber in gone {
            self.hold(client, fence, &[subscriber]).await?;
            self.fenced(client, fence, async |tx, schema| {
                work_unit::unplan(tx, schema, subscriber).await
            })
            .await?;
            tracing::info!(
                target = self.target.label(),
                subscriber,
                "removed the work units: this subscriber no longer runs"
            );
            changed = true;
        }
        if changed {
            self.shared.units_changed().await;
        }
        Ok(settled)
    }

    /// Holds every unit of `subscribers` for a change of plan and waits until none of
    /// their owners' transactions is in flight.
    pub(super) async fn hold(
        &self,
        client: &mut Client,
        fence: &Fence,
        subscribers: &[&str],
    ) -> Result<(), EngineError> {
        let held = self
            .fenced(client, fence, async |tx, schema| {
                let mut held = Vec::new();
                for s in subscribers {
                    held.extend(work_unit::hold(tx, schema, s).await?);
                }
                Ok(held)
            })
            .await?;
        let shared = &self.shared;
        work_unit::wait_for_holders(client, &self.target.schema, &held, |id| shared.dead_tag(id))
            .await?;
        Ok(())
    }

    /// Runs `work` in one transaction that proves this leader's `fence`.
    pub(super) async fn fenced<T>(
        &self,
        client: &mut Client,
        fence: &Fence,
        work: impl AsyncFnOnce(
            &tokio_postgres::Transaction<'_>,
            &walfold_store::Schema,
        ) -> Result<T, walfold_store::StoreError>,
    ) -> Result<T, EngineError> {
        let tx = client
            .transaction()
            .await
            .map_err(walfold_store::StoreError::db("changing the work units"))?;
        fence.check(&tx).await?;
        let out = work(&tx, &self.target.schema).await?;
        tx.commit()
            .await
            .map_err(walfold_store::StoreError::db("changing the work units"))?;
        Ok(out)
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

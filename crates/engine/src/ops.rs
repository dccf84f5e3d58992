//! Operations on a running (or stopped) walfold, for the CLI and the library: start,
//! abort and finish a rebuild, prune. Whatever changes what the leader runs (aborting a
//! replaying rebuild) is done by the leader; when no daemon leads, the command leads
//! for the moment it takes. A projection's rebuild runs on its own target (`database`);
//! pruning reads every target. Every statement goes through the operator's handle
//! ([`Operator`]), bound to the leader's fence whenever this process leads; its errors
//! say what failed, so they pass up with `?` ([`EngineError::Store`]); what the config
//! or the command line asks for that cannot be done is a [`RebuildRefusal`].

use std::time::Duration;

use walfold_config::{Config, ProjectionConfig};
use walfold_store::operator::{PrunePolicy, Pruned};
use walfold_store::{Fence, Leadership, Operator, Rebuild, RebuildState, Schema};

pub use walfold_source::{backfill, BackfillReport, SourceError};

use crate::error::{EngineError, RebuildRefusal};
use crate::target::Target;

fn projection<'a>(config: &'a Config, name: &str) -> Result<&'a ProjectionConfig, EngineError> {
    config
        .projection
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| RebuildRefusal::NoSuchProjection(name.to_owned()).into())
}

/// The operator's handle on `target`, with walfold's schema there created or upgraded
/// first.
async fn connect_to(target: &Target) -> Result<Operator, EngineError> {
    walfold_store::migrate(&target.url, &target.schema).await?;
    Ok(Operator::connect(&target.url, &target.schema).await?)
}

/// The fence on `target` of a leader whose fence on the main target is `fence`: the
/// same one on the main target, a takeover of the extra target otherwise (kept alive
/// by the returned lease while it is used).
async fn fence_on(
    fence: &Fence,
    target: &Target,
) -> Result<(Fence, Option<walfold_store::TargetLease>), EngineError> {
    if !target.is_extra() {
        return Ok((fence.clone(), None));
    }
    let lease = fence.extend_to(&target.url, &target.schema, None).await?;
    Ok((lease.fence(), Some(lease)))
}

/// How much history a rebuild may replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum History {
    /// Every event since walfold began: a rebuild is refused once retention has pruned
    /// the event log, since the new table would lack whatever the pruned events built.
    Whole,
    /// What the event log still holds, pruned or not (`--from-retained-log`).
    Retained,
}

/// Starts rebuilding the configured projection `name` under the new subscriber ID
/// `subscriber`: a shadow table is created like the live one; the leader replays the
/// log into it, then switches over.
pub async fn start_rebuild(
    config: &Config,
    name: &str,
    subscriber: &str,
    history: History,
) -> Result<Rebuild, EngineError> {
    start_rebuild_with(config, projection(config, name)?, subscriber, history).await
}

/// [`start_rebuild`] for any projection's options, e.g. a Rust projection added with
/// `Pipeline::with_projection` (the `target` of its `ProjectionKind::Code` names the
/// table; it must implement [`crate::Projection::for_table`]).
pub async fn start_rebuild_with(
    config: &Config,
    options: &ProjectionConfig,
    subscriber: &str,
    history: History,
) -> Result<Rebuild, EngineError> {
    // A Rust projection's version is the program's: its pipeline records it when the
    // rebuild's subscriber first runs.
    let definition = match options.kind {
        walfold_config::ProjectionKind::Code { .. } => None,
        _ => Some(walfold_config::FoldDefinition::of(options, 1)),
    };
    start_rebuild_recording(
        config,
        options,
        subscriber,
        history,
        Recording {
            definition: definition.as_ref(),
            ..Recording::default()
        },
    )
    .await
}

/// What a rebuild records beside itself: the definition its subscriber folds with, and,
/// when the leader starts it for a changed definition, its fence on the projection's
/// target and the definition the live subscriber folds with, with who decided.
#[derive(Default, Clone, Copy)]
pub(crate) struct Recording<'a> {
    pub definition: Option<&'a walfold_config::FoldDefinition>,
    pub fence: Option<&'a Fence>,
    pub changed_from: Option<(&'a walfold_store::definition::RecordedDefinition, &'a str)>,
}

/// [`start_rebuild_with`], recording `recording` in the rebuild's transaction.
pub(crate) async fn start_rebuild_recording(
    config: &Config,
    options: &ProjectionConfig,
    subscriber: &str,
    history: History,
    recording: Recording<'_>,
) -> Result<Rebuild, EngineError> {
    let name = options.name.as_str();
    let live = options
        .storage()
        .ok_or_else(|| RebuildRefusal::NoTable(name.to_owned()))?;
    if subscriber.trim().is_empty() || subscriber.len() > 200 {
        return Err(RebuildRefusal::SubscriberLength.into());
    }
    if subscriber == walfold_config::INGEST_SUBSCRIBER {
        return Err(RebuildRefusal::IngestSubscriber.into());
    }
    // Subscriber IDs name metrics and `walfold status` lines across every target: one
    // configured for a projection, or used on another target, is refused too. Its own
    // target checks in the transaction that records the rebuild.
    if let Some(p) = config
        .projection
        .iter()
        .find(|p| p.subscriber == subscriber)
    {
        return Err(RebuildRefusal::SubscriberConfigured {
            subscriber: subscriber.to_owned(),
            projection: p.name.clone(),
        }
        .into());
    }
    // The log is the main target's. Its prune lock, held by this session until the
    // rebuild is recorded, keeps a prune pass from deleting what this rebuild needs
    // between the check below and the rebuild's subscriber holding the log (a pass reads
    // its holders after taking the lock).
    let main = Target::main(config);
    let mut guard = connect_to(&main).await?;
    if !guard.try_hold_off_pruning().await? {
        return Err(RebuildRefusal::PruneRunning.into());
    }
    if history == History::Whole {
        if let Some(p) = guard.log_pruned().await? {
            let how = if p.at_unix.is_some() {
                "retention.event_log has pruned the event log"
            } else {
                "the event log starts after seq 1 (pruned before walfold recorded it)"
            };
            return Err(RebuildRefusal::LogPruned {
                how,
                through: p.through,
                live,
            }
            .into());
        }
    }
    let target = Target::of(config, options);
    for other in Target::all(config).iter().filter(|t| **t != target) {
        let used = if other.is_extra() {
            connect_to(other).await?.subscriber_used(subscriber).await?
        } else {
            guard.subscriber_used(subscriber).await?
        };
        if used {
            return Err(RebuildRefusal::SubscriberUsedOn {
                subscriber: subscriber.to_owned(),
                target: other.label().to_owned(),
            }
            .into());
        }
    }
    // The main target's rebuild runs on the session that holds the prune lock.
    let mut own = if target.is_extra() {
        Some(connect_to(&target).await?)
    } else {
        None
    };
    if let Some(fence) = recording.fence {
        match own.take() {
            Some(o) => own = Some(o.leading(fence.clone())),
            None => guard = guard.leading(fence.clone()),
        }
    }
    let op = own.as_mut().unwrap_or(&mut guard);
    let previous = op
        .active_subscriber(name, &options.subscriber, Some(&live))
        .await?;
    // Recorded (or not), the prune lock goes with `guard`'s session when it is dropped.
    // A `sql` or `table` projection's statement for the shadow table, checked there.
    let probe = |shadow: &walfold_config::QualifiedName| {
        let statement = options.statement_for(0, Some(shadow)).ok()?;
        let projection = crate::sql::SqlProjection::new(&statement, &target.schema).ok()?;
        Some(projection.probe())
    };
    Ok(op
        .start_rebuild(
            name,
            &live,
            &previous,
            subscriber,
            &probe,
            walfold_store::rebuild::StartWith {
                definition: recording.definition,
                fence: None,
                changed_from: recording.changed_from,
            },
        )
        .await?)
}

/// Aborts the replaying rebuild of `name`: the shadow table and the new subscriber's
/// state go; nothing live changes. Waits up to `wait` for a running daemon to do it.
pub async fn abort_rebuild(
    config: &Config,
    name: &str,
    wait: Duration,
) -> Result<Rebuild, EngineError> {
    let target = Target::of(config, projection(config, name)?);
    let op = connect_to(&target).await?;
    let r = op.request_abort(name).await?;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        // No instance leads (none runs, or the leader died): the command does it.
        if let Some(leader) = CommandLead::try_acquire(config).await? {
            let (fence, lease) = fence_on(&leader.fence(), &target).await?;
            let mut op = op.leading(fence);
            let done = op.abort_rebuild(&r).await;
            drop(lease);
            leader.end().await;
            done?;
            aborted(&r);
            return Ok(r);
        }
        if !op
            .rebuilds()
            .await?
            .iter()
            .any(|o| o.subscriber == r.subscriber)
        {
            return Ok(r);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(RebuildRefusal::AbortPending {
                projection: name.to_owned(),
                wait,
            }
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Drops the table a switched rebuild retired, with the previous subscriber's state.
pub async fn finish_rebuild(config: &Config, name: &str) -> Result<Rebuild, EngineError> {
    let target = Target::of(config, projection(config, name)?);
    let mut op = connect_to(&target).await?;
    // Beside a leading daemon, unfenced: see `Operator::finish_rebuild`.
    let r = op.finish_rebuild(name).await?;
    forget_with(&op, &r.previous).await;
    Ok(r)
}

/// One prune pass: claims of `projections` past their `dedup_retention` (those of the
/// active subscriber and of a rebuild in progress), and events past
/// `retention.event_log` that every subscriber has passed. When no daemon leads, this
/// command leads for the pass (fenced like the daemon's); while one leads, it prunes
/// beside it: pruning deletes only what every checkpoint has passed, which the leader's
/// work only moves forward.
pub async fn prune(
    config: &Config,
    projections: &[ProjectionConfig],
) -> Result<Pruned, EngineError> {
    drop(connect_to(&Target::main(config)).await?);
    // An extra target that is down is reported by the pass (and holds the log).
    for target in Target::all(config).iter().filter(|t| t.is_extra()) {
        drop(connect_to(target).await);
    }
    let leader = CommandLead::try_acquire(config).await?;
    let fence = leader.as_ref().map(CommandLead::fence);
    let pruned = prune_fenced(config, projections, fence.as_ref()).await;
    if let Some(leader) = leader {
        leader.end().await;
    }
    pruned
}

/// A command that leads for the moment it takes, when no instance leads (none runs, or
/// the leader is dead): it registers as an instance that runs no projection and
/// heartbeats while it leads, so a daemon that starts meanwhile waits for it, or finds
/// it dead and ends its sessions.
struct CommandLead {
    control: std::sync::Arc<tokio_postgres::Client>,
    leadership: Leadership,
    me: uuid::Uuid,
    schema: Schema,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl CommandLead {
    async fn try_acquire(config: &Config) -> Result<Option<CommandLead>, EngineError> {
        use walfold_store::instance::{self, Registration};
        let tag = walfold_pg::tag_sessions();
        let schema = Target::main(config).schema;
        let control = walfold_pg::connect(config.target_url()).await?;
        let me = Registration {
            id: uuid::Uuid::new_v4(),
            host: instance::host_name(),
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            runs: Some(Vec::new()),
            knows: Vec::new(),
            leads: true,
            tag,
        };
        instance::register(&control, &schema, &me).await?;
        let lease = Duration::from_secs(config.cluster.lease_s);
        let row = walfold_store::leader_row(&control, &schema).await?;
        let seen = instance::seen(&control, &schema).await?;
        let owner = row.owner.and_then(|o| seen.iter().find(|s| s.id == o));
        let taken = match (row.owner, owner) {
            // A command is no server restart's reconnect: a leader whose sessions are
            // gone is dead.
            (Some(_), Some(s)) if s.alive(lease, true) => None,
            (_, owner) => {
                let dead = owner.map(|s| s.tag);
                if let Some(tag) = dead {
                    instance::end_sessions(&control, &schema, tag).await?;
                }
                match Leadership::try_take(&control, &schema, me.id, row, dead).await? {
                    walfold_store::Attempt::Leads(l) => Some(l),
                    _ => None,
                }
            }
        };
        let Some(leadership) = taken else {
            instance::leave(&control, &schema, &me.id).await?;
            return Ok(None);
        };
        let control = std::sync::Arc::new(control);
        let heartbeat = {
            let (control, schema, id) = (control.clone(), schema.clone(), me.id);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if instance::heartbeat(&control, &schema, &id).await.is_err() {
                        return;
                    }
                }
            })
        };
        Ok(Some(CommandLead {
            control,
            leadership,
            me: me.id,
            schema,
            heartbeat,
        }))
    }

    fn fence(&self) -> Fence {
        self.leadership.fence()
    }

    /// Gives leadership up and leaves.
    async fn end(self) {
        self.heartbeat.abort();
        self.leadership
            .end(&self.control, &self.schema, self.me, true)
            .await;
        if let Err(e) = walfold_store::instance::leave(&self.control, &self.schema, &self.me).await
        {
            tracing::debug!(error = %e, "could not deregister the command");
        }
    }
}

/// [`prune`] with the leader's fence (the daemon's pass), on migrated schemas. Each
/// extra target prunes its own claims and says how far it lets go of the log; one that
/// cannot be read holds the whole log for this pass.
pub(crate) async fn prune_fenced(
    config: &Config,
    projections: &[ProjectionConfig],
    fence: Option<&Fence>,
) -> Result<Pruned, EngineError> {
    let main = Target::main(config);
    let mut log = Operator::connect(&main.url, &main.schema).await?;
    if let Some(fence) = fence {
        log = log.leading(fence.clone());
    }
    // Held for the whole pass (this connection's session): a rebuild never starts
    // between the pass reading what holds the log and its deletes.
    log.lock_pruning().await?;
    let mut pruned = Pruned::default();
    let mut held_elsewhere: Option<i64> = None;
    let mut holds: Vec<(String, Option<i64>)> = Vec::new();
    let mut configured: Vec<String> = Vec::new();
    for target in Target::all(config).iter().filter(|t| t.is_extra()) {
        configured.push(target.label().to_owned());
        let here: Vec<ProjectionConfig> = projections
            .iter()
            .filter(|p| Target::of(config, p) == *target)
            .cloned()
            .collect();
        match prune_extra(config, target, &here, &log, fence).await {
            Ok((p, held)) => {
                pruned.claims += p.claims;
                holds.push((target.label().to_owned(), held));
                if let Some(held) = held {
                    held_elsewhere = Some(held_elsewhere.map_or(held, |h| h.min(held)));
                }
            }
            Err(e) => {
                tracing::warn!(target = target.label(), error = %e, "cannot prune on this target; the event log keeps every event for this pass");
                held_elsewhere = Some(0);
                pruned.held_by.push((
                    target.label().to_owned(),
                    format!(
                        "cannot prune on target {} ({e}); the event log keeps every event until it can be read",
                        target.label()
                    ),
                ));
            }
        }
    }
    // A target taken out of the config still holds the log where it last did.
    let (recorded, removed) = log.record_holds(&holds, &configured).await?;
    if let Some(r) = recorded {
        held_elsewhere = Some(held_elsewhere.map_or(r, |h| h.min(r)));
    }
    for (target, bound) in removed {
        let why = format!(
            "target {target} is no longer in the config but its projections had read the log only \
             up to {bound}: the log is kept from there (delete from {}.target_hold where \
             target = '{target}' to let go)",
            main.schema.name()
        );
        tracing::warn!(target = %target, bound, "{why}");
        pruned.held_by.push((target, why));
    }
    let here: Vec<ProjectionConfig> = projections
        .iter()
        .filter(|p| !Target::of(config, p).is_extra())
        .cloned()
        .collect();
    let mut policy = policy(config, &mut log, &here).await?;
    policy.held_elsewhere = held_elsewhere;
    policy.identities = identity_retention(&log, projections).await?;
    let p = log.prune(&policy).await?;
    pruned.claims += p.claims;
    pruned.events += p.events;
    Ok(pruned)
}

/// How long a pruned event's identity is kept (see the store's `claim.rs`): as long as
/// the longest claim retention of every projection that may hold claims on its seq, on
/// any target. Those are the projections given (a daemon's include its Rust ones) and
/// every projection the log's registry knows: one it knows that is not given (taken out
/// of the config, or a Rust projection a command does not see) keeps its claims forever,
/// as does one without `dedup_retention`, and then identities are kept forever (`None`).
async fn identity_retention(
    log: &Operator,
    projections: &[ProjectionConfig],
) -> Result<Option<std::time::Duration>, EngineError> {
    let known = log.active_projections().await?;
    if known
        .iter()
        .any(|(name, _)| !projections.iter().any(|p| p.name == *name))
    {
        return Ok(None);
    }
    Ok(projections
        .iter()
        .map(|p| p.dedup_retention.after())
        .try_fold(std::time::Duration::ZERO, |max, r| r.map(|r| max.max(r))))
}

/// Claims on an extra target, and how far it lets go of the log.
async fn prune_extra(
    config: &Config,
    target: &Target,
    projections: &[ProjectionConfig],
    log: &Operator,
    fence: Option<&Fence>,
) -> Result<(Pruned, Option<i64>), EngineError> {
    let mut op = Operator::connect(&target.url, &target.schema).await?;
    let _lease = match fence {
        Some(f) => {
            let (f, lease) = fence_on(f, target).await?;
            op = op.leading(f);
            lease
        }
        None => None,
    };
    let policy = policy(config, &mut op, projections).await?;
    let pruned = op.prune_claims(log, &policy).await?;
    let held = op.hold().await?;
    Ok((pruned, held))
}

/// The claims to prune on one target (registering its projections: every projection's
/// active subscriber holds the events it has not passed, with or without a retention).
async fn policy(
    config: &Config,
    op: &mut Operator,
    projections: &[ProjectionConfig],
) -> Result<PrunePolicy, EngineError> {
    let open = op.rebuilds().await?;
    let mut claims = Vec::new();
    for p in projections {
        let active = op
            .active_subscriber(&p.name, &p.subscriber, p.storage().as_ref())
            .await?;
        let Some(retention) = p.dedup_retention.after() else {
            continue;
        };
        claims.push((active, retention));
        for r in open
            .iter()
            .filter(|r| r.projection == p.name && r.state == RebuildState::Running)
        {
            claims.push((r.subscriber.clone(), retention));
        }
    }
    Ok(PrunePolicy {
        event_log: config.retention.event_log.after(),
        claims,
        identities: None,
        batch: config.retention.prune_batch_size,
        held_elsewhere: None,
    })
}

/// Ends an aborted rebuild while none of its projectors runs. Its claims go with the
/// next prune.
pub(crate) async fn end_abort(
    client: &mut tokio_postgres::Client,
    schema: &Schema,
    r: &Rebuild,
    fence: &Fence,
) -> Result<(), EngineError> {
    let mut op = Operator::new(client, schema).leading(fence.clone());
    op.abort_rebuild(r).await?;
    aborted(r);
    Ok(())
}

fn aborted(r: &Rebuild) {
    tracing::info!(projection = %r.projection, subscriber = %r.subscriber, "rebuild aborted; shadow table dropped");
}

/// Deletes a retired subscriber's claims; what is left is deleted next time.
async fn forget_with(op: &Operator, subscriber: &str) {
    if let Err(e) = op.forget_claims(subscriber, 10_000).await {
        tracing::warn!(subscriber, error = %e, "could not delete a retired subscriber's claims");
    }
}

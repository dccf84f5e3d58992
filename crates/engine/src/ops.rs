//! Operations on a running (or stopped) walfold, for the CLI and the library: start,
//! abort and finish a rebuild, prune. Whatever changes what the leader runs (aborting a
//! replaying rebuild) is done by the leader; when no daemon leads, the command leads
//! for the moment it takes.

use std::time::Duration;

use walfold_config::{Config, ProjectionConfig};
use walfold_store::{rebuild, Fence, Leadership, PrunePolicy, Pruned, Rebuild, StoreError};

pub use walfold_source::{backfill, BackfillReport, SourceError};

use crate::error::EngineError;

fn projection<'a>(config: &'a Config, name: &str) -> Result<&'a ProjectionConfig, EngineError> {
    config
        .projection
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| refused(format!("the config has no projection named {name}")))
}

fn refused(message: String) -> EngineError {
    EngineError::Store {
        context: "rebuild",
        source: StoreError::Refused(message),
    }
}

async fn connect(config: &Config) -> Result<tokio_postgres::Client, EngineError> {
    walfold_store::migrate(config.target_url(), &config.target.schema)
        .await
        .map_err(EngineError::store("creating walfold's schema"))?;
    walfold_store::connect(config.target_url())
        .await
        .map_err(EngineError::store("connecting to the target"))
}

/// Starts rebuilding the configured projection `name` under the new subscriber ID
/// `subscriber`: a shadow table is created like the live one; the leader replays the
/// log into it, then switches over.
pub async fn start_rebuild(
    config: &Config,
    name: &str,
    subscriber: &str,
) -> Result<Rebuild, EngineError> {
    start_rebuild_with(config, projection(config, name)?, subscriber).await
}

/// [`start_rebuild`] for any projection's options, e.g. a Rust projection added with
/// `Pipeline::with_projection` (its `target` names the table; it must implement
/// [`crate::Projection::for_table`]).
pub async fn start_rebuild_with(
    config: &Config,
    options: &ProjectionConfig,
    subscriber: &str,
) -> Result<Rebuild, EngineError> {
    let name = options.name.as_str();
    let live = options.storage().ok_or_else(|| {
        refused(format!(
            "projection {name} names no table to rebuild: set `target` and write `{{table}}` in its sql"
        ))
    })?;
    if subscriber.trim().is_empty() || subscriber.len() > 200 {
        return Err(refused("--subscriber must be 1-200 characters".into()));
    }
    let mut client = connect(config).await?;
    let schema = &config.target.schema;
    let previous = walfold_store::active_subscriber(&mut client, schema, name, &options.subscriber)
        .await
        .map_err(EngineError::store("resolving the active subscriber"))?;
    rebuild::start(&mut client, schema, name, &live, &previous, subscriber)
        .await
        .map_err(EngineError::store("starting a rebuild"))
}

/// Aborts the replaying rebuild of `name`: the shadow table and the new subscriber's
/// state go; nothing live changes. Waits up to `wait` for a running daemon to do it.
pub async fn abort_rebuild(
    config: &Config,
    name: &str,
    wait: Duration,
) -> Result<Rebuild, EngineError> {
    projection(config, name)?;
    let mut client = connect(config).await?;
    let schema = &config.target.schema;
    let r = rebuild::request_abort(&client, schema, name)
        .await
        .map_err(EngineError::store("aborting a rebuild"))?;
    if let Some(leader) = Leadership::try_acquire(config.target_url(), schema)
        .await
        .map_err(EngineError::store("taking the leader lock"))?
    {
        crate::pipeline::end_abort(&mut client, schema, &r, &leader.fence()).await?;
        drop(leader);
        return Ok(r);
    }
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let open = rebuild::open(&client, schema)
            .await
            .map_err(EngineError::store("reading rebuilds"))?;
        if !open.iter().any(|o| o.subscriber == r.subscriber) {
            return Ok(r);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(refused(format!(
                "the abort of {name} is recorded, but the leading daemon has not carried it out within {}s; it will",
                wait.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Drops the table a switched rebuild retired, with the previous subscriber's state.
pub async fn finish_rebuild(config: &Config, name: &str) -> Result<Rebuild, EngineError> {
    projection(config, name)?;
    let mut client = connect(config).await?;
    let schema = &config.target.schema;
    let r = rebuild::finish(&mut client, schema, name, None)
        .await
        .map_err(EngineError::store("finishing a rebuild"))?;
    crate::pipeline::forget(&client, schema, &r.previous).await;
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
    drop(connect(config).await?);
    let leader = Leadership::try_acquire(config.target_url(), &config.target.schema)
        .await
        .map_err(EngineError::store("taking the leader lock"))?;
    let fence = leader.as_ref().map(Leadership::fence);
    prune_fenced(config, projections, fence.as_ref()).await
}

/// [`prune`] with the leader's fence (the daemon's pass), on a migrated schema.
pub(crate) async fn prune_fenced(
    config: &Config,
    projections: &[ProjectionConfig],
    fence: Option<&Fence>,
) -> Result<Pruned, EngineError> {
    let mut client = walfold_store::connect(config.target_url())
        .await
        .map_err(EngineError::store("connecting to the target"))?;
    let schema = &config.target.schema;
    let open = rebuild::open(&client, schema)
        .await
        .map_err(EngineError::store("reading rebuilds"))?;
    let mut claims = Vec::new();
    for p in projections {
        // Registered even without a claim retention: every projection's active
        // subscriber holds the events it has not passed.
        let active = walfold_store::active_subscriber(&mut client, schema, &p.name, &p.subscriber)
            .await
            .map_err(EngineError::store("resolving the active subscriber"))?;
        let Some(retention) = p.dedup_retention() else {
            continue;
        };
        claims.push((active, retention));
        for r in open
            .iter()
            .filter(|r| r.projection == p.name && r.state == "running")
        {
            claims.push((r.subscriber.clone(), retention));
        }
    }
    let policy = PrunePolicy {
        event_log: config.retention.event_log(),
        claims,
        batch: config.retention.prune_batch_size,
    };
    walfold_store::prune(&mut client, schema, &policy, fence)
        .await
        .map_err(EngineError::store("pruning"))
}

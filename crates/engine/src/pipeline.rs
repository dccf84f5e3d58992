//! The pipeline: migrates walfold's schema, waits to lead (one instance per target
//! schema leads; the others stand by), then runs ingest (slot → event log) and one
//! projector per subscriber partition until cancelled or leadership is lost.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use walfold_config::{Config, ProjectionConfig};
use walfold_store::{migrate, Leadership};

use crate::error::EngineError;
use crate::projection::Projection;
use crate::projector::Partition;
use crate::sql::SqlProjection;

/// The whole path from the slot to the read models.
pub struct Pipeline {
    config: Arc<Config>,
    custom: Vec<(ProjectionConfig, Arc<dyn Projection>)>,
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
    /// parallelism and batching (its `sql`/`table` are ignored).
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
        let config = self.config;
        let schema = config.target.schema.clone();
        migrate(config.target_url(), &schema)
            .await
            .map_err(EngineError::store("creating walfold's schema"))?;
        let probe = walfold_store::connect(config.target_url())
            .await
            .map_err(EngineError::store("connecting to the target"))?;
        let mut projections: Vec<(ProjectionConfig, Arc<dyn Projection>)> = Vec::new();
        for (i, p) in config.projection.iter().enumerate() {
            let kind = p.kind(i).map_err(|problems| EngineError::Projection {
                projection: p.name.clone(),
                message: problems
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            })?;
            let returns_rows = SqlProjection::returns_rows(&probe, &kind).await;
            let projection = SqlProjection::new(&kind, &schema, returns_rows).map_err(|e| {
                EngineError::Projection {
                    projection: p.name.clone(),
                    message: e.to_string(),
                }
            })?;
            projections.push((p.clone(), Arc::new(projection)));
        }
        drop(probe);
        projections.extend(self.custom);
        loop {
            let Some(leader) = Leadership::acquire(config.target_url(), &schema, &cancel)
                .await
                .map_err(EngineError::store("waiting for leadership"))?
            else {
                return Ok(());
            };
            let lost = leader.lost();
            let result = lead(&config, &schema, &projections, &cancel, &lost).await;
            drop(leader);
            if cancel.is_cancelled() || !lost.is_cancelled() {
                return result;
            }
            tracing::warn!("lost leadership; stopped and standing by again");
        }
    }
}

/// Runs ingest and every projector while this instance leads.
async fn lead(
    config: &Arc<Config>,
    schema: &str,
    projections: &[(ProjectionConfig, Arc<dyn Projection>)],
    cancel: &CancellationToken,
    lost: &CancellationToken,
) -> Result<(), EngineError> {
    let mut setup = walfold_store::connect(config.target_url())
        .await
        .map_err(EngineError::store("connecting to the target"))?;
    for (options, projection) in projections {
        projection
            .install(&mut setup)
            .await
            .map_err(|e| EngineError::Projection {
                projection: options.name.clone(),
                message: format!("installing: {e}"),
            })?;
    }
    drop(setup);

    let (head_tx, head_rx) = watch::channel(0i64);
    // Every task stops on `stop`: shutdown, lost leadership, or another task's error.
    // On shutdown projectors finish their batch while ingest drains.
    let stop = cancel.child_token();
    let mut tasks: JoinSet<(String, Result<(), EngineError>)> = JoinSet::new();
    {
        let config = config.clone();
        let stop = stop.clone();
        tasks.spawn(async move {
            let r = walfold_source::run_ingest(config, stop, head_tx)
                .await
                .map_err(EngineError::from);
            ("ingest".to_owned(), r)
        });
    }
    for (options, projection) in projections {
        for partition in 0..options.parallelism {
            let worker = Partition {
                url: config.target_url().to_owned(),
                schema: schema.to_owned(),
                options: options.clone(),
                projection: projection.clone(),
                partition,
            };
            let name = format!("{}[{partition}]", options.name);
            let stop = stop.clone();
            let head = head_rx.clone();
            tasks.spawn(async move { (name, worker.run(stop, head).await) });
        }
    }
    let mut first_error = None;
    loop {
        let joined = tokio::select! {
            joined = tasks.join_next() => joined,
            _ = lost.cancelled(), if !stop.is_cancelled() => {
                stop.cancel();
                continue;
            }
        };
        let Some(joined) = joined else { break };
        match joined {
            Ok((_, Ok(()))) => {}
            Ok((task, Err(e))) => {
                tracing::error!(task = %task, error = %e, "pipeline task failed; stopping");
                stop.cancel();
                first_error.get_or_insert(e);
            }
            Err(join) => {
                stop.cancel();
                first_error.get_or_insert(EngineError::Projection {
                    projection: "pipeline".into(),
                    message: format!("task panicked: {join}"),
                });
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

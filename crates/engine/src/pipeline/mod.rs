//! The pipeline: migrates walfold's schema, then runs this instance (`instance.rs`).
//! Any number of instances may run on one config, and all of them work: the projections'
//! work is cut into units, one per partition of each subscriber (`work_unit` in the
//! store), which every instance takes a fair share of (`assign.rs`) and runs under each
//! unit's fence; one instance also leads (`lead.rs`): it reads the slots, prunes, and
//! plans each target's units (`plan.rs`), switching rebuilds over (`switch.rs`).
//!
//! Each target (the main one, and every `[targets.NAME]` with projections) has its own
//! units, registry, rebuilds, checkpoints and pauses. An extra target is migrated and
//! taken over ([`walfold_store::Fence::extend_to`]) before the leader plans there; while
//! it cannot be reached or used (behind a pooler that shares sessions) its projections
//! are paused (logged once per cause,
//! `walfold_projection_paused`, `/readyz`) and everything else goes on.

mod assign;
mod changed;
mod definition;
mod instance;
mod lead;
mod plan;
mod switch;
mod target_down;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use walfold_config::{Config, ProjectionConfig};
use walfold_store::{migrate, Backoff};

use self::definition::Definition;
use crate::error::EngineError;
use crate::projection::Projection;
use crate::target::Target;

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

    /// Runs until `cancel`; then finishes in-flight batches, gives its work back, sends
    /// final feedback and returns. A definite error (e.g. wal_level is not logical)
    /// stops everything.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), EngineError> {
        let code: Vec<ProjectionConfig> = self.custom.iter().map(|(o, _)| o.clone()).collect();
        self.config.validate_with(&code)?;
        let config = self.config;
        let definitions = Definition::all(&config, self.custom)?;
        let schema = Target::main(&config).schema;
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
        instance::run(config, definitions, cancel).await
    }
}

/// Runs `task` as `name`: a panic becomes [`EngineError::Panicked`] naming it, so the
/// joining side knows which task it was.
pub(crate) async fn named(
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
pub(crate) fn joined_error(task: &str, join: tokio::task::JoinError) -> EngineError {
    match join.try_into_panic() {
        Ok(payload) => EngineError::panicked(task, &*payload),
        Err(join) => EngineError::Panicked {
            task: task.to_owned(),
            message: join.to_string(),
        },
    }
}

/// A finished task's error, if it failed.
pub(crate) fn failure(
    joined: Result<(String, Result<(), EngineError>), tokio::task::JoinError>,
) -> Option<EngineError> {
    match joined {
        Ok((_, Ok(()))) => None,
        Ok((_, Err(e))) if e.is_fenced() => None,
        Ok((task, Err(e))) => {
            tracing::error!(task = %task, error = %e, "failed; stopping");
            Some(e)
        }
        Err(join) => Some(joined_error("a task", join)),
    }
}

//! A projection as this instance can run it: its options, its live projection, how to
//! build it for another table (a rebuild's shadow), and where its state lives; and the
//! projector of one of its work units.

use std::sync::Arc;

use walfold_config::{Config, FoldDefinition, ProjectionConfig, QualifiedName};
use walfold_store::definition::RecordedDefinition;
use walfold_store::Fence;

use crate::error::EngineError;
use crate::pages::SharedPages;
use crate::pool::Pool;
use crate::projection::Projection;
use crate::projector::Partition;
use crate::sql::SqlProjection;
use crate::target::Target;

/// A projection the pipeline runs.
#[derive(Clone)]
pub(crate) struct Definition {
    pub options: ProjectionConfig,
    pub live: Arc<dyn Projection>,
    /// Its position in `config.projection` (`None`: written in Rust).
    index: Option<usize>,
    /// Where its state lives.
    pub target: Target,
    /// What defines its fold, as its subscriber records it.
    pub fold: FoldDefinition,
}

impl Definition {
    /// The projections of `config` (compiled) and those written in Rust.
    pub(crate) fn all(
        config: &Config,
        custom: Vec<(ProjectionConfig, Arc<dyn Projection>)>,
    ) -> Result<Vec<Definition>, EngineError> {
        let mut all = Vec::new();
        for (i, p) in config.projection.iter().enumerate() {
            let target = Target::of(config, p);
            all.push(Definition {
                options: p.clone(),
                live: build(p, i, &target.schema, None)?,
                index: Some(i),
                target,
                fold: FoldDefinition::of(p, 1),
            });
        }
        all.extend(custom.into_iter().map(|(options, live)| Definition {
            target: Target::of(config, &options),
            fold: FoldDefinition::of(&options, live.definition_version()),
            options,
            live,
            index: None,
        }));
        Ok(all)
    }

    /// This projection as it folds for a subscriber that recorded `recorded`: itself
    /// when that is its own definition (or none is recorded yet), else the recorded
    /// definition built again with these options' names and tuning (a `sql` or `table`
    /// projection's; the old definition serves until a rebuild switches over, or an
    /// operator accepts the new one). `None`: it cannot be built (a Rust projection's
    /// older code).
    pub(crate) fn folding(
        &self,
        recorded: Option<&RecordedDefinition>,
    ) -> Result<Option<Definition>, EngineError> {
        let Some(recorded) = recorded else {
            return Ok(Some(self.clone()));
        };
        if recorded.digest == self.fold.digest() {
            return Ok(Some(self.clone()));
        }
        let (Some(index), Some(parts)) = (self.index, recorded.parts.as_ref()) else {
            return Ok(None);
        };
        let Some(options) = parts.apply_to(&self.options) else {
            return Ok(None);
        };
        Ok(Some(Definition {
            live: build(&options, index, &self.target.schema, None)?,
            fold: parts.clone(),
            options,
            index: Some(index),
            target: self.target.clone(),
        }))
    }

    /// The projection writing to `table` (a rebuild's shadow); `None` if it cannot.
    pub(crate) fn for_table(
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

/// The connections one target's projectors share: its own, and the main target's for
/// reading the log when it is an extra target. Made once per instance, so every unit on
/// a target takes from the same budget.
#[derive(Clone)]
pub(crate) struct TargetPools {
    pub target: Arc<Pool>,
    pub log: Option<Arc<Pool>>,
}

impl TargetPools {
    /// Every target's, the main target's first (by [`Target::all`]'s order).
    pub(crate) fn all(config: &Config) -> Vec<(Target, TargetPools)> {
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

/// What a unit's projector is built from, beyond its definition.
pub(crate) struct UnitRun<'a> {
    pub config: &'a Config,
    pub subscriber: &'a str,
    pub partition: u32,
    pub partitions: u32,
    /// A rebuild's replay: its batch size, into this projection (its shadow table).
    pub replay: Option<Arc<dyn Projection>>,
    pub fence: Fence,
    pub pools: &'a TargetPools,
    pub pages: Arc<SharedPages>,
    pub reached_head: Option<Arc<tokio::sync::Notify>>,
}

impl Definition {
    /// The projector of one of this projection's units.
    pub(crate) fn partition(&self, run: UnitRun<'_>) -> Partition {
        let mut options = self.options.clone();
        options.subscriber = run.subscriber.to_owned();
        options.parallelism = run.partitions;
        if run.replay.is_some() {
            options.batch_size = options.rebuild_batch_size;
        }
        Partition {
            schema: self.target.schema.clone(),
            options,
            projection: run.replay.unwrap_or_else(|| self.live.clone()),
            partition: run.partition,
            fence: run.fence,
            pages: run.pages,
            target: self.target.name.clone(),
            log: self.target.is_extra().then(|| Target::main(run.config)),
            until: None,
            reached_head: run.reached_head,
            pool: run.pools.target.clone(),
            log_pool: run.pools.log.clone(),
        }
    }
}

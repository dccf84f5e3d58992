//! Where a projection's state lives: the main target (`[target]`, which also holds the
//! event log, the ingest position and the leader lock) or an extra target
//! (`[targets.NAME]`, named by the projection's `database`). A projection's read model,
//! claims, checkpoints, parked aggregates, dead letters, pauses, registry row and
//! rebuilds all live on its target, so its claim, change and checkpoint commit in one
//! transaction there; its projectors read the log from the main target.

use walfold_config::{Config, ProjectionConfig};
use walfold_store::Schema;

/// One database holding walfold's schema.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    /// `None` for the main target, else the `[targets.NAME]` name.
    pub name: Option<String>,
    pub url: String,
    /// walfold's schema there, quoted once for every statement the store runs on it.
    pub schema: Schema,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("url", &walfold_config::redact_url(&self.url))
            .field("schema", &self.schema)
            .finish()
    }
}

impl Target {
    /// The main target: the event log and every projection without `database`.
    pub fn main(config: &Config) -> Target {
        Target {
            name: None,
            url: config.target_url().to_owned(),
            schema: Schema::new(config.target.schema.as_str()),
        }
    }

    /// The target of `projection`.
    pub fn of(config: &Config, projection: &ProjectionConfig) -> Target {
        match config.target_of(projection) {
            Some((name, t)) => Target {
                name: Some(name.to_owned()),
                url: t.url.clone(),
                schema: Schema::new(t.schema.as_str()),
            },
            None => Target::main(config),
        }
    }

    /// Every target: the main one first, then the extra ones by name.
    pub fn all(config: &Config) -> Vec<Target> {
        let mut all = vec![Target::main(config)];
        all.extend(config.targets.iter().map(|(name, t)| Target {
            name: Some(name.clone()),
            url: t.url.clone(),
            schema: Schema::new(t.schema.as_str()),
        }));
        all
    }

    /// Whether this is an extra target (its projectors read the log over another
    /// connection, and its writes pass its own lease's fence).
    pub fn is_extra(&self) -> bool {
        self.name.is_some()
    }

    /// How status, logs and errors name it: `main`, or the extra target's name.
    pub fn label(&self) -> &str {
        self.name.as_deref().unwrap_or("main")
    }

    /// The most connections one instance holds on this target (each instance its own):
    /// its projectors' pool and its lease session; on the main target also its control
    /// session and the one it notifies the others on, and while it leads the appender
    /// lock, one appender per source, the planner's and the prune task's, and `/metrics`'
    /// when it listens; on an extra target, while it leads, the planner's and the lease
    /// that took the target over.
    pub fn connection_budget(&self, config: &Config) -> usize {
        match &self.name {
            Some(name) => config.targets[name].pool_size + 3,
            None => {
                // Per source: its appender, and the session that records the source's
                // WAL position for `wait_for` (wal_watch.rs).
                config.target.pool_size
                    + 6
                    + 2 * config.sources().len()
                    + usize::from(config.metrics.listen.is_some())
            }
        }
    }

    /// The projections of `config` whose state lives here.
    pub fn projections<'c>(&self, config: &'c Config) -> Vec<&'c ProjectionConfig> {
        config
            .projection
            .iter()
            .filter(|p| p.database.as_deref() == self.name.as_deref())
            .collect()
    }
}

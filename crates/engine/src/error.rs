//! Engine errors. Every one has a [`kind`](EngineError::kind) and says whether it is a
//! usage error ([`usage`](EngineError::usage)): the projector, the pipeline and the
//! binary's exit code act on those, decided by each error where it is made, never on
//! messages.

use walfold_event::ErrorKind;
use walfold_pg::PgError;
use walfold_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Source(#[from] walfold_source::SourceError),
    /// One of walfold's own statements failed, or the store refused a request; the error
    /// says what, and for whom (a subscriber's store names its subscriber and partition).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A rebuild the config or the command line asks for cannot be done: a usage error.
    #[error(transparent)]
    Refused(#[from] RebuildRefusal),
    /// The config, or a projection added in Rust, is invalid: checked before the
    /// pipeline touches a database.
    #[error(transparent)]
    Config(#[from] walfold_config::ConfigError),
    /// A task panicked (a bug, walfold's or a Rust projection's): it stops the pipeline.
    #[error("task {task} panicked: {message}")]
    Panicked { task: String, message: String },
    /// A projection could not apply events or install itself.
    #[error("projection {projection}: {source}")]
    Apply {
        projection: String,
        #[source]
        source: ProjectionError,
    },
    /// An extra target (`[targets.NAME]`) cannot be reached: its projections pause.
    #[error("target {target} cannot be reached: {source}")]
    Unreachable {
        target: String,
        #[source]
        source: StoreError,
    },
    /// A projection that can never run as configured.
    #[error("projection {projection}: {message}")]
    Projection { projection: String, message: String },
}

/// Why a rebuild (started, aborted or finished from the command line or the library)
/// is refused before the store is asked: each says why and what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RebuildRefusal {
    #[error("the config has no projection named {0}")]
    NoSuchProjection(String),
    #[error(
        "projection {0} names no table to rebuild: set `target` and write `{{table}}` in its sql"
    )]
    NoTable(String),
    #[error("--subscriber must be 1-200 characters")]
    SubscriberLength,
    #[error("`ingest` names the rows rejected before any subscriber; choose another ID")]
    IngestSubscriber,
    /// The new subscriber ID is one a configured projection uses.
    #[error(
        "subscriber ID {subscriber} has been used before (projection {projection} is configured \
         with it); a rebuild needs a new one, e.g. {subscriber}.2"
    )]
    SubscriberConfigured {
        subscriber: String,
        projection: String,
    },
    /// The new subscriber ID has been used on another target.
    #[error(
        "subscriber ID {subscriber} has been used on target {target} before; a rebuild \
         needs a new one, e.g. {subscriber}.2"
    )]
    SubscriberUsedOn { subscriber: String, target: String },
    #[error(
        "a prune pass is running on the event log; start the rebuild again once it has \
         ended"
    )]
    PruneRunning,
    /// The event log has been pruned, so replaying it would miss what the pruned events
    /// built; `how` says how it was pruned.
    #[error(
        "{how} through seq {through}: a rebuild replays only the events still in the log, so \
         {live} would lack whatever the pruned events built. Pass --from-retained-log \
         (History::Retained) to rebuild from what the log holds anyway"
    )]
    LogPruned {
        how: &'static str,
        through: i64,
        live: walfold_config::QualifiedName,
    },
    /// The abort is recorded; the leading daemon did not carry it out within the wait.
    #[error(
        "the abort of {projection} is recorded, but the leading daemon has not carried it out within {}s; it will",
        wait.as_secs()
    )]
    AbortPending {
        projection: String,
        wait: std::time::Duration,
    },
}

/// Why a projection could not apply an event (or install itself).
#[derive(Debug, thiserror::Error)]
pub enum ProjectionError {
    #[error("{}", walfold_pg::describe(.0))]
    Db(#[from] tokio_postgres::Error),
    /// A row walfold reads back (its installed function's result, the catalog) cannot
    /// be read: no event is at fault.
    #[error(transparent)]
    Row(#[from] StoreError),
    /// The event can never apply (e.g. a `table` projection needs a version).
    #[error("{0}")]
    Invalid(String),
    /// Applied before its install succeeded.
    #[error("the projection is not installed yet")]
    NotInstalled,
}

/// A row walfold reads back that cannot be read.
impl From<PgError> for ProjectionError {
    fn from(e: PgError) -> Self {
        ProjectionError::Row(e.into())
    }
}

/// Connecting to a target, or reading one of its rows.
impl From<PgError> for EngineError {
    fn from(e: PgError) -> Self {
        EngineError::Store(e.into())
    }
}

impl ProjectionError {
    /// Whose fault it is: by SQLSTATE for database errors; an invalid event is data.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ProjectionError::Db(e) => walfold_pg::kind_of(e),
            ProjectionError::Row(e) => e.kind().own_statement(),
            ProjectionError::Invalid(_) => ErrorKind::Data,
            ProjectionError::NotInstalled => ErrorKind::Environment,
        }
    }

    /// The SQLSTATE, for database errors.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            ProjectionError::Db(e) => walfold_pg::sqlstate(e),
            ProjectionError::Row(e) => e.pg().and_then(walfold_pg::sqlstate),
            ProjectionError::Invalid(_) | ProjectionError::NotInstalled => None,
        }
    }
}

impl EngineError {
    /// A task's panic, with the message it panicked with.
    pub(crate) fn panicked(task: &str, payload: &(dyn std::any::Any + Send)) -> Self {
        let message = match payload.downcast_ref::<&str>() {
            Some(s) => (*s).to_owned(),
            None => payload
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "a panic without a message".to_owned()),
        };
        EngineError::Panicked {
            task: task.to_owned(),
            message,
        }
    }

    /// An extra target that cannot be reached or used (even for good: behind a pooler
    /// that shares sessions): its projections pause, the rest goes on.
    pub fn is_unusable_target(&self) -> bool {
        matches!(self, EngineError::Unreachable { .. })
    }

    /// Whether a fence refused a write: what it proved is held elsewhere now.
    pub fn is_fenced(&self) -> bool {
        matches!(self, EngineError::Store(StoreError::Fenced))
    }

    /// Whose fault it is. walfold's own statements cannot fail because of an event, so
    /// their data errors count as environment.
    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::Source(e) => e.kind(),
            EngineError::Store(source) => source.kind().own_statement(),
            EngineError::Unreachable { source, .. } => {
                walfold_event::unreachable_target(source.kind().own_statement())
            }
            EngineError::Apply { source, .. } => source.kind(),
            EngineError::Projection { .. }
            | EngineError::Refused(_)
            | EngineError::Config(_)
            | EngineError::Panicked { .. } => ErrorKind::Definite,
        }
    }

    /// The SQLSTATE behind it, if any.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            EngineError::Store(source) | EngineError::Unreachable { source, .. } => {
                source.pg().and_then(walfold_pg::sqlstate)
            }
            EngineError::Apply { source, .. } => source.sqlstate(),
            EngineError::Source(_)
            | EngineError::Refused(_)
            | EngineError::Projection { .. }
            | EngineError::Config(_)
            | EngineError::Panicked { .. } => None,
        }
    }

    /// An event that can never apply as it is: retrying it would only wait.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            EngineError::Apply {
                source: ProjectionError::Invalid(_),
                ..
            }
        )
    }

    /// Whether the server ran short of disk, memory or connections.
    pub fn is_resource(&self) -> bool {
        walfold_event::is_resource_code(self.sqlstate())
    }

    /// Where the fix is, for the environment errors an operator meets most on a target:
    /// a right walfold's role lacks, a table or column the projection names that is
    /// missing (said with the error when a partition pauses).
    pub fn fix(&self) -> Option<&'static str> {
        let code = self.sqlstate();
        if walfold_event::is_insufficient_privilege(code) {
            Some("walfold's role lacks a right on the target: `walfold doctor` lists the grants it needs")
        } else if walfold_event::is_undefined_table(code)
            || walfold_event::is_undefined_column(code)
        {
            Some(
                "the projection names a table or column the target does not have: create it or \
                 fix the projection (`walfold doctor` checks its table)",
            )
        } else {
            None
        }
    }

    /// A usage error (exit code 2), as the operator reads it: a request the config or the
    /// current state refuses, or a URL walfold cannot work through (a pooler sharing
    /// sessions). Each error says for itself whether it is one; `None` for the others.
    pub fn usage(&self) -> Option<String> {
        match self {
            EngineError::Refused(_) => Some(self.to_string()),
            EngineError::Store(e) if e.is_usage() => Some(e.to_string()),
            EngineError::Source(e) if e.is_usage() => Some(e.to_string()),
            // An extra target behind a pooler is not unreachable: named as the target.
            EngineError::Unreachable { target, source } if source.is_usage() => {
                Some(format!("target {target}: {source}"))
            }
            _ => None,
        }
    }
}

//! Engine errors. Every one has a [`kind`](EngineError::kind): the projector, the
//! pipeline and the binary's exit code act on it, never on messages.

use walfold_event::ErrorKind;
use walfold_pg::PgError;
use walfold_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Source(#[from] walfold_source::SourceError),
    /// One of walfold's own statements failed.
    #[error("{context}: {source}")]
    Store {
        context: &'static str,
        #[source]
        source: StoreError,
    },
    /// One of walfold's own statements failed; the error says what, and for whom (a
    /// subscriber's store names its subscriber and partition).
    #[error(transparent)]
    Own(#[from] StoreError),
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
        EngineError::Own(e.into())
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

    /// Whether a fence refused a write: what it proved is held elsewhere now.
    pub fn is_fenced(&self) -> bool {
        matches!(
            self,
            EngineError::Own(StoreError::Fenced)
                | EngineError::Store {
                    source: StoreError::Fenced,
                    ..
                }
        )
    }

    /// Whose fault it is. walfold's own statements cannot fail because of an event, so
    /// their data errors count as environment.
    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::Source(e) => e.kind(),
            EngineError::Store { source, .. } | EngineError::Own(source) => {
                source.kind().own_statement()
            }
            EngineError::Unreachable { source, .. } => {
                walfold_event::unreachable_target(source.kind().own_statement())
            }
            EngineError::Apply { source, .. } => source.kind(),
            EngineError::Projection { .. }
            | EngineError::Config(_)
            | EngineError::Panicked { .. } => ErrorKind::Definite,
        }
    }

    /// The SQLSTATE behind it, if any.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            EngineError::Store { source, .. }
            | EngineError::Own(source)
            | EngineError::Unreachable { source, .. } => source.pg().and_then(walfold_pg::sqlstate),
            EngineError::Apply { source, .. } => source.sqlstate(),
            EngineError::Source(_)
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

    /// An operator request the current state refuses, or a URL walfold cannot work
    /// through (a pooler sharing sessions): a usage error, exit code 2.
    pub fn refused(&self) -> Option<String> {
        match self {
            EngineError::Store {
                source: StoreError::Refused(m),
                ..
            }
            | EngineError::Own(StoreError::Refused(m)) => Some(m.clone()),
            EngineError::Source(walfold_source::SourceError::Store {
                source: StoreError::Refused(m),
                ..
            }) => Some(m.clone()),
            EngineError::Store {
                source: e @ StoreError::Pg(PgError::Pooled { .. }),
                ..
            }
            | EngineError::Own(e @ StoreError::Pg(PgError::Pooled { .. }))
            | EngineError::Source(walfold_source::SourceError::Store {
                source: e @ StoreError::Pg(PgError::Pooled { .. }),
                ..
            }) => Some(e.to_string()),
            EngineError::Source(walfold_source::SourceError::Pg(e @ PgError::Pooled { .. })) => {
                Some(e.to_string())
            }
            EngineError::Unreachable {
                target,
                source: e @ StoreError::Pg(PgError::Pooled { .. }),
            } => Some(format!("target {target}: {e}")),
            _ => None,
        }
    }
}

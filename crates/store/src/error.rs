//! Store errors, with the context we own (schema, subscriber), and whose fault each is.
//! Errors of talking to PostgreSQL itself (a URL, TLS, connecting, a pooler, a column
//! that cannot be read) are `walfold_pg`'s, carried as [`StoreError::Pg`].

use walfold_event::ErrorKind;
use walfold_pg::{describe, kind_of, sqlstate, PgError};

use crate::refusal::Refusal;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Connecting, a server that did not answer, a pooler sharing sessions, a column
    /// that cannot be read.
    #[error(transparent)]
    Pg(#[from] PgError),
    /// A server a command or scrape needs failed or did not answer: which one.
    #[error("{server}: {source}")]
    Server {
        server: String,
        #[source]
        source: Box<StoreError>,
    },
    #[error("migrating schema {schema}{}: {}", version.map(|v| format!(" to {v}")).unwrap_or_default(), describe(source))]
    Migrate {
        schema: String,
        /// The migration being applied, if one was.
        version: Option<i64>,
        #[source]
        source: tokio_postgres::Error,
    },
    /// walfold's role lacks a right its schema needs; `missing` says which, with the fix.
    #[error("migrating schema {schema}: {missing}")]
    SchemaRights { schema: String, missing: String },
    /// A migration waited `waited` for a lock on one of walfold's tables and gave up
    /// (`lock_timeout`), rather than hold every later session of that table in the lock
    /// queue; `blockers` names the sessions holding locks there.
    #[error("migrating schema {schema}{}: waited {}s for a lock on walfold's tables, held by {blockers}; end that transaction (select pg_terminate_backend(pid)) or retry when it is done", version.map(|v| format!(" to {v}")).unwrap_or_default(), waited.as_secs())]
    MigrationBlocked {
        schema: String,
        version: Option<i64>,
        waited: std::time::Duration,
        blockers: String,
    },
    /// The schema's migrations do not match this build's (one failed part-way, one
    /// changed, one is newer).
    #[error("migrating schema {schema}: {reason}")]
    MigrationHistory { schema: String, reason: String },
    /// Another walfold holds what this one needs (the event log's appender lock, or a
    /// checkpoint written with another partition count); retry later.
    #[error("{0}")]
    Busy(String),
    /// The operator (or the config) asked for something the current state does not
    /// allow: a usage error, which says why and what to do instead.
    #[error(transparent)]
    Refused(Box<Refusal>),
    /// Another instance has taken over leadership: this transaction must not land.
    #[error(
        "this instance no longer leads (another instance took over); the write was not committed"
    )]
    Fenced,
    /// One of a subscriber's statements failed (see [`crate::subscriber`]): for which
    /// subscriber and partition; `source` says what it was doing.
    #[error("subscriber {subscriber}, partition {partition}: {source}")]
    Subscriber {
        subscriber: std::sync::Arc<str>,
        partition: u32,
        #[source]
        source: Box<StoreError>,
    },
    #[error("{context}: {}", describe(source))]
    Db {
        context: String,
        #[source]
        source: tokio_postgres::Error,
    },
}

impl From<Refusal> for StoreError {
    fn from(refusal: Refusal) -> Self {
        StoreError::Refused(Box::new(refusal))
    }
}

/// A store error from a command's server names the server (see `walfold_pg::answer_within`).
impl walfold_pg::ServerError for StoreError {
    fn at_server(self, server: &str) -> Self {
        StoreError::Server {
            server: server.to_owned(),
            source: Box::new(self),
        }
    }
}

impl StoreError {
    /// A database error with what walfold was doing (`map_err(StoreError::db("…"))`).
    pub fn db(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> Self {
        let context = context.into();
        move |source| StoreError::Db { context, source }
    }

    /// Whose fault it is (see [`ErrorKind`]).
    pub fn kind(&self) -> walfold_event::ErrorKind {
        match self {
            StoreError::Busy(_) | StoreError::Fenced => ErrorKind::Transient,
            StoreError::Pg(e) => e.kind(),
            StoreError::Server { source, .. } | StoreError::Subscriber { source, .. } => {
                source.kind()
            }
            StoreError::Db { source, .. } => kind_of(source),
            StoreError::Refused(_) => ErrorKind::Definite,
            // A migration that fails needs the right to create the schema, or a repair;
            // only a lost connection is retried as such.
            StoreError::Migrate { source, .. } => match kind_of(source) {
                ErrorKind::Transient => ErrorKind::Transient,
                _ => ErrorKind::Environment,
            },
            // Retried by a daemon (the transaction in the way ends some time).
            StoreError::MigrationBlocked { .. } => ErrorKind::Transient,
            StoreError::SchemaRights { .. } | StoreError::MigrationHistory { .. } => {
                ErrorKind::Environment
            }
        }
    }

    /// Whether it is a usage error (exit code 2): an operator request the current state
    /// refuses, or a URL behind a pooler walfold cannot work through.
    pub fn is_usage(&self) -> bool {
        match self {
            StoreError::Refused(_) => true,
            StoreError::Pg(e) => e.is_usage(),
            StoreError::Server { source, .. } => source.is_usage(),
            _ => false,
        }
    }

    /// Whether the server ran short of disk, memory or connections.
    pub fn is_resource(&self) -> bool {
        walfold_event::is_resource_code(self.pg().and_then(sqlstate))
    }

    /// The PostgreSQL error behind this one, if any.
    pub fn pg(&self) -> Option<&tokio_postgres::Error> {
        match self {
            StoreError::Db { source, .. } | StoreError::Migrate { source, .. } => Some(source),
            StoreError::Pg(e) => e.pg(),
            StoreError::Server { source, .. } | StoreError::Subscriber { source, .. } => {
                source.pg()
            }
            _ => None,
        }
    }
}

//! Store errors, with the context we own (schema, subscriber), and what kind of failure
//! a PostgreSQL error is.

use walfold_event::{kind_for_code, ErrorKind};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid database url {url}: {reason}")]
    Url { url: String, reason: String },
    #[error("cannot read sslrootcert {path}: {reason}")]
    RootCert { path: String, reason: String },
    #[error("cannot connect to {url}: {}", describe(source))]
    Connect {
        url: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// A server a command or scrape needs failed or did not answer: which one.
    #[error("{server}: {source}")]
    Server {
        server: String,
        #[source]
        source: Box<StoreError>,
    },
    #[error("did not answer within {} s ({url})", within.as_secs_f64())]
    NoAnswer {
        url: String,
        within: std::time::Duration,
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
    /// The schema's migrations do not match this build's (one failed part-way, one
    /// changed, one is newer).
    #[error("migrating schema {schema}: {reason}")]
    MigrationHistory { schema: String, reason: String },
    /// Another walfold holds what this one needs (the event log's appender lock, or a
    /// checkpoint written with another partition count); retry later.
    #[error("{0}")]
    Busy(String),
    /// The operator asked for something the current state does not allow; the message
    /// says why and what to do instead.
    #[error("{0}")]
    Refused(String),
    /// A pooler in front of `url` shares server sessions between clients (transaction
    /// or statement pooling): walfold needs a session of its own there.
    #[error(
        "{key} ({url}) leads to a pooler that shares server sessions between clients \
         (transaction or statement pooling): {evidence}; walfold needs a session of its own \
         there (its leader lock, prepared statements, search_path). Fix: {}",
        crate::pooler::pooler_fix(key)
    )]
    Pooled {
        /// What names the URL in the config (`source.url`, `the target URL`).
        key: String,
        /// The URL, redacted.
        url: String,
        evidence: String,
    },
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
    /// A row lacks a column walfold reads, or holds it as another type (or null): the
    /// table has drifted from what this walfold expects (an operator altered or dropped
    /// the column). No event is at fault: pause and retry until it is restored.
    #[error(
        "column {column} of {table} cannot be read: {}; if it was altered or dropped, restore it",
        unreadable(source)
    )]
    Column {
        table: &'static str,
        column: String,
        #[source]
        source: tokio_postgres::Error,
    },
}

/// Why `try_get` could not read a column, without tokio-postgres's position of it.
fn unreadable(err: &tokio_postgres::Error) -> String {
    match std::error::Error::source(err) {
        // The conversion's own reason: "cannot convert between the Rust type `i64` and
        // the Postgres type `text`", "a Postgres value was `NULL`".
        Some(cause) => cause.to_string(),
        None => "the row has no such column".to_owned(),
    }
}

/// A PostgreSQL error in one line with what an operator needs: SQLSTATE, message,
/// detail and constraint (tokio-postgres's own `Display` says only "db error").
pub fn describe(err: &tokio_postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => {
            let mut s = format!("{} ({}): {}", db.severity(), db.code().code(), db.message());
            if let Some(d) = db.detail() {
                s.push_str(&format!("; detail: {d}"));
            }
            if let Some(c) = db.constraint() {
                s.push_str(&format!("; constraint: {c}"));
            }
            s
        }
        // "error connecting to server" says nothing without its cause ("Connection
        // refused", a TLS failure, a timeout).
        None => {
            let mut s = err.to_string();
            let mut cause = std::error::Error::source(err);
            while let Some(c) = cause {
                let text = c.to_string();
                if !s.contains(&text) {
                    s.push_str(": ");
                    s.push_str(&text);
                }
                cause = c.source();
            }
            s
        }
    }
}

/// Maps a PostgreSQL error to its kind.
pub fn kind_of(err: &tokio_postgres::Error) -> ErrorKind {
    kind_for_code(sqlstate(err))
}

/// The SQLSTATE of a PostgreSQL error, if the server sent one.
pub fn sqlstate(err: &tokio_postgres::Error) -> Option<&str> {
    err.code().map(|c| c.code())
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
            StoreError::Busy(_) | StoreError::Fenced | StoreError::NoAnswer { .. } => {
                ErrorKind::Transient
            }
            StoreError::Server { source, .. } | StoreError::Subscriber { source, .. } => {
                source.kind()
            }
            StoreError::Connect { source, .. } | StoreError::Db { source, .. } => kind_of(source),
            // The URL is wrong: retrying through the same pooler cannot help.
            StoreError::Url { .. }
            | StoreError::RootCert { .. }
            | StoreError::Refused(_)
            | StoreError::Pooled { .. } => ErrorKind::Definite,
            // A migration that fails needs the right to create the schema, or a repair;
            // only a lost connection is retried as such.
            StoreError::Migrate { source, .. } => match kind_of(source) {
                ErrorKind::Transient => ErrorKind::Transient,
                _ => ErrorKind::Environment,
            },
            StoreError::SchemaRights { .. } | StoreError::MigrationHistory { .. } => {
                ErrorKind::Environment
            }
            // A drifted table: the environment, never the event nor the connection.
            StoreError::Column { .. } => ErrorKind::Environment,
        }
    }

    /// Whether the server ran short of disk, memory or connections.
    pub fn is_resource(&self) -> bool {
        walfold_event::is_resource_code(self.pg().and_then(sqlstate))
    }

    /// The PostgreSQL error behind this one, if any.
    pub fn pg(&self) -> Option<&tokio_postgres::Error> {
        match self {
            StoreError::Connect { source, .. }
            | StoreError::Db { source, .. }
            | StoreError::Migrate { source, .. } => Some(source),
            StoreError::Server { source, .. } | StoreError::Subscriber { source, .. } => {
                source.pg()
            }
            _ => None,
        }
    }
}

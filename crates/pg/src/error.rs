//! Errors of talking to PostgreSQL (a URL, TLS, connecting, a server that does not
//! answer, a pooler that shares sessions, a column that cannot be read), and the one-line
//! reading of a PostgreSQL error: its SQLSTATE, its kind, its text. What a SQLSTATE
//! means is decided in `walfold_event`'s `kind.rs`; this file only reads it off.

use walfold_event::{kind_for_code, ErrorKind};

#[derive(Debug, thiserror::Error)]
pub enum PgError {
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
        source: Box<PgError>,
    },
    #[error("did not answer within {} s ({url})", within.as_secs_f64())]
    NoAnswer {
        url: String,
        within: std::time::Duration,
    },
    /// A pooler in front of `url` shares server sessions between clients (transaction
    /// or statement pooling): walfold needs a session of its own there. A usage error:
    /// the URL must change.
    #[error(
        "{key} ({url}) leads to a pooler that shares server sessions between clients \
         (transaction or statement pooling): {evidence}; walfold needs a session of its own \
         there (its leader lock, prepared statements, search_path). Fix: {}",
        pooler_fix(key)
    )]
    Pooled {
        /// What names the URL in the config (`source.url`, `the target URL`).
        key: String,
        /// The URL, redacted.
        url: String,
        evidence: String,
    },
    /// A statement of a connection's own set-up (its `search_path`, its timeout, the
    /// pooler check) failed.
    #[error("{context}: {}", describe(source))]
    Db {
        context: &'static str,
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

/// What to do about a pooler that shares sessions in front of the URL named `key`.
pub fn pooler_fix(key: &str) -> String {
    format!(
        "point {key} at PostgreSQL directly, or at a pool in session mode (PgBouncer: \
         pool_mode = session, for walfold's database or user)"
    )
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

impl PgError {
    /// A database error with what walfold was doing (`map_err(PgError::db("…"))`).
    pub fn db(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Self {
        move |source| PgError::Db { context, source }
    }

    /// Whose fault it is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            PgError::NoAnswer { .. } => ErrorKind::Transient,
            PgError::Server { source, .. } => source.kind(),
            PgError::Connect { source, .. } | PgError::Db { source, .. } => kind_of(source),
            // The URL is wrong: retrying through the same pooler cannot help.
            PgError::Url { .. } | PgError::RootCert { .. } | PgError::Pooled { .. } => {
                ErrorKind::Definite
            }
            // A drifted table: the environment, never the event nor the connection.
            PgError::Column { .. } => ErrorKind::Environment,
        }
    }

    /// Whether it is a usage error (exit code 2): the URL leads to a pooler that walfold
    /// cannot work through.
    pub fn is_usage(&self) -> bool {
        match self {
            PgError::Pooled { .. } => true,
            PgError::Server { source, .. } => source.is_usage(),
            _ => false,
        }
    }

    /// The PostgreSQL error behind this one, if any.
    pub fn pg(&self) -> Option<&tokio_postgres::Error> {
        match self {
            PgError::Connect { source, .. } | PgError::Db { source, .. } => Some(source),
            PgError::Server { source, .. } => source.pg(),
            _ => None,
        }
    }
}

//! Store errors, with the context we own (schema, subscriber).

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
    #[error("migrating schema {schema}: {source}")]
    Migrate {
        schema: String,
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    #[error("migrating schema {schema}: {source}")]
    MigrateConnect {
        schema: String,
        #[source]
        source: sqlx::Error,
    },
    /// Another walfold holds what this one needs (the event log's appender lock, or a
    /// checkpoint written with another partition count); retry later.
    #[error("{0}")]
    Busy(String),
    /// The operator asked for something the current state does not allow; the message
    /// says why and what to do instead.
    #[error("{0}")]
    Refused(String),
    #[error("{context}: {}", describe(source))]
    Db {
        context: String,
        #[source]
        source: tokio_postgres::Error,
    },
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
        None => err.to_string(),
    }
}

impl StoreError {
    pub(crate) fn db(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> Self {
        let context = context.into();
        move |source| StoreError::Db { context, source }
    }

    /// Whether retrying later can help.
    pub fn directive(&self) -> crate::Directive {
        match self {
            StoreError::Busy(_) => crate::Directive::Retry,
            other => other
                .pg()
                .map_or(crate::Directive::Definite, crate::directive),
        }
    }

    /// The PostgreSQL error behind this one, if any.
    pub fn pg(&self) -> Option<&tokio_postgres::Error> {
        match self {
            StoreError::Connect { source, .. } | StoreError::Db { source, .. } => Some(source),
            _ => None,
        }
    }
}

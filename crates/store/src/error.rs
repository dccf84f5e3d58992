//! Store errors, with the context we own (schema, subscriber).

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid database url {url}: {reason}")]
    Url { url: String, reason: String },
    #[error("cannot read sslrootcert {path}: {reason}")]
    RootCert { path: String, reason: String },
    #[error("cannot connect to {url}: {source}")]
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
    #[error("{context}: {source}")]
    Db {
        context: String,
        #[source]
        source: tokio_postgres::Error,
    },
}

impl StoreError {
    pub(crate) fn db(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> Self {
        let context = context.into();
        move |source| StoreError::Db { context, source }
    }

    /// The PostgreSQL error behind this one, if any.
    pub fn pg(&self) -> Option<&tokio_postgres::Error> {
        match self {
            StoreError::Connect { source, .. } | StoreError::Db { source, .. } => Some(source),
            _ => None,
        }
    }
}

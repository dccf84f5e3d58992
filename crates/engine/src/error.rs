//! Engine errors.

use walfold_store::{Directive, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Source(#[from] walfold_source::SourceError),
    #[error("{context}: {source}")]
    Store {
        context: String,
        #[source]
        source: StoreError,
    },
    #[error("projection {projection}: {message}")]
    Projection { projection: String, message: String },
}

/// Why a projection could not apply an event.
#[derive(Debug, thiserror::Error)]
pub enum ProjectionError {
    #[error("{}", walfold_store::describe(.0))]
    Db(#[from] tokio_postgres::Error),
    /// The event can never apply (e.g. a `table` projection needs a version).
    #[error("{0}")]
    Invalid(String),
}

impl ProjectionError {
    pub fn directive(&self) -> Directive {
        match self {
            ProjectionError::Db(e) => walfold_store::directive(e),
            ProjectionError::Invalid(_) => Directive::Definite,
        }
    }
}

impl EngineError {
    pub(crate) fn store(context: impl Into<String>) -> impl FnOnce(StoreError) -> Self {
        let context = context.into();
        move |source| EngineError::Store { context, source }
    }

    pub fn directive(&self) -> Directive {
        match self {
            EngineError::Source(e) => e.directive(),
            EngineError::Store { source, .. } => source.directive(),
            EngineError::Projection { .. } => Directive::Definite,
        }
    }
}

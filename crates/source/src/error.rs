//! Source errors, split into transient (reconnect from the last durable point) and
//! definite (stop with a message that says how to fix it).

use walfold_store::{directive_for_code, Directive, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("the source server has wal_level={0}; set wal_level=logical in postgresql.conf and restart the server")]
    WalLevel(String),
    #[error("outbox table {0} does not exist in the source database; create it or fix [[outbox]] table in the config")]
    MissingTable(String),
    #[error("replication slot {slot} {problem}")]
    Slot { slot: String, problem: String },
    #[error("{context}: {source}")]
    Store {
        context: String,
        #[source]
        source: StoreError,
    },
    #[error("replication stream: {0}")]
    Replication(#[from] pgwire_replication::PgWireError),
    #[error("replication stream: {0}")]
    Decode(String),
    #[error("replication stream ended")]
    StreamEnded,
}

impl SourceError {
    pub(crate) fn store(context: impl Into<String>) -> impl FnOnce(StoreError) -> Self {
        let context = context.into();
        move |source| SourceError::Store { context, source }
    }

    /// Whether reconnecting can help; the supervisor stops on definite errors.
    pub fn directive(&self) -> Directive {
        use pgwire_replication::PgWireError as W;
        match self {
            SourceError::WalLevel(_) | SourceError::MissingTable(_) | SourceError::Slot { .. } => {
                Directive::Definite
            }
            SourceError::Store { source, .. } => source.directive(),
            SourceError::Replication(W::Server(msg)) => directive_for_code(sqlstate(msg)),
            SourceError::Replication(W::Auth(_) | W::Tls(_)) => Directive::Definite,
            SourceError::Replication(_) => Directive::Retry,
            // A decode error means we misread the stream; a fresh stream from the
            // durable point is the only safe move, and it is logged loudly.
            SourceError::Decode(_) => Directive::Retry,
            SourceError::StreamEnded => Directive::Retry,
        }
    }
}

/// The SQLSTATE in a pgwire-replication server error (`message (SQLSTATE 42704)`).
fn sqlstate(msg: &str) -> Option<&str> {
    let start = msg.rfind("(SQLSTATE ")? + "(SQLSTATE ".len();
    msg.get(start..start + 5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_are_classified_by_sqlstate() {
        let e =
            |m: &str| SourceError::Replication(pgwire_replication::PgWireError::Server(m.into()));
        assert_eq!(
            e("replication slot \"x\" does not exist (SQLSTATE 42704)").directive(),
            Directive::Definite
        );
        assert_eq!(
            e("replication slot \"x\" is active for PID 1 (SQLSTATE 55006)").directive(),
            Directive::Retry
        );
        assert_eq!(
            e("terminating connection due to administrator command (SQLSTATE 57P01)").directive(),
            Directive::Retry
        );
    }
}

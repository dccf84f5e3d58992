//! The one place that decides whether an error is worth retrying. Transient errors
//! (connection lost, server shutting down, serialization failure, deadlock, a slot still
//! held by a dying walsender, a target in read-only mode during failover) restart from
//! the last durable point. A statement timeout is not on the list: on the same event it
//! would time out again, so it is definite and the event is set aside. Everything else is
//! definite: set the event aside, or stop with the error.

/// What to do after an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Directive {
    /// Reconnect or retry from the last durable point with backoff.
    Retry,
    /// Retrying cannot help: dead-letter the event, or stop with the error.
    Definite,
}

/// Maps a SQLSTATE (none: an I/O or protocol error) to a directive. Keep the list short.
pub fn directive_for_code(code: Option<&str>) -> Directive {
    let Some(c) = code else {
        return Directive::Retry;
    };
    let retry = c.starts_with("08") // connection exception
        || c.starts_with("53") // insufficient resources
        || c.starts_with("57P") // admin/crash shutdown, cannot connect now
        || matches!(
            c,
            "40001" // serialization failure
            | "40P01" // deadlock detected
            | "55P03" // lock not available
            | "55006" // object in use: the slot is still held by a walsender that is exiting
            | "25006" // read-only transaction: the target is a standby mid-failover
        );
    if retry {
        Directive::Retry
    } else {
        Directive::Definite
    }
}

/// Maps a PostgreSQL error to a directive.
pub fn directive(err: &tokio_postgres::Error) -> Directive {
    directive_for_code(err.code().map(|c| c.code()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_loss_retries_and_bad_data_does_not() {
        assert_eq!(directive_for_code(None), Directive::Retry);
        assert_eq!(directive_for_code(Some("08006")), Directive::Retry);
        assert_eq!(directive_for_code(Some("57P01")), Directive::Retry);
        assert_eq!(directive_for_code(Some("40001")), Directive::Retry);
        assert_eq!(directive_for_code(Some("57014")), Directive::Definite);
        assert_eq!(directive_for_code(Some("23505")), Directive::Definite);
        assert_eq!(directive_for_code(Some("42P01")), Directive::Definite);
        assert_eq!(directive_for_code(Some("22P02")), Directive::Definite);
    }
}

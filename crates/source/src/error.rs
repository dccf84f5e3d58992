//! Source errors, each with its [`ErrorKind`]: transient (reconnect from the last durable
//! point), environment (the same, loudly: a revoked right, a full disk), definite (stop
//! with a message that says how to fix it). Whether one is a usage error is said by
//! [`SourceError::is_usage`]; a long fix is [`SourceError::fix`], which the message ends
//! with.

use walfold_event::{kind_for_code, ErrorKind};
use walfold_pg::PgError;
use walfold_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("the source server has wal_level={0}; set wal_level=logical in postgresql.conf and restart the server")]
    WalLevel(String),
    #[error("outbox table {0} does not exist in the source database; create it or fix [[outbox]] table in the config")]
    MissingTable(String),
    #[error("{}; {}", .0.problem, .0.fix)]
    Refused(Refusal),
    /// A column a field names (or an expression reads) that the outbox table does not
    /// have, on a first start: the config is wrong (a usage error, exit code 2).
    #[error("{}; {}", .0.problem, .0.fix)]
    MissingColumn(Refusal),
    #[error("{0}")]
    NoSuchOutbox(String),
    #[error("replication slot {slot} {problem}")]
    Slot { slot: String, problem: String },
    /// Connecting to a server (the source or the target) or reading a row.
    #[error(transparent)]
    Pg(#[from] PgError),
    /// `source.url` cannot be read as a connection string.
    #[error("reading source.url: {0}")]
    SourceUrl(#[source] PgError),
    /// A failure of walfold's own statements; the store's error says what it was doing.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A streamed event the log refused for a reason that will not go away could not be
    /// staged as its dead letter either.
    #[error("staging a streamed dead letter: {0}")]
    StagingDeadLetter(#[source] StoreError),
    /// A backfill beside a daemon that appends to the event log: a usage error.
    #[error(
        "a walfold daemon is appending to the event log; stop it for the backfill (its slot \
         keeps every change meanwhile) and start it again afterwards"
    )]
    BackfillBesideDaemon,
    /// A change of a relation that is no outbox: ingest stops before acknowledging it.
    #[error(
        "the publication {publication} sent {change} of {relation}, which is no [[outbox]]; \
         ingest stopped before acknowledging its transaction (commit {commit_lsn}). Fix: {}",
        self.fix().unwrap_or_default()
    )]
    Unmapped {
        change: &'static str,
        relation: String,
        publication: String,
        slot: String,
        commit_lsn: walfold_event::Lsn,
        /// Just past the commit: where the slot must be advanced to skip the transaction.
        skip_to: walfold_event::Lsn,
    },
    #[error(
        "outbox {table}: the transaction at commit {commit_lsn} wrote rows without column \
         `{column}` (outbox.{key}); its rows have the columns {columns}. The column was \
         renamed or dropped: ingest stopped before acknowledging the transaction and \
         retries; nothing is dead-lettered. Fix: {}",
        self.fix().unwrap_or_default()
    )]
    OutboxChanged {
        table: String,
        key: &'static str,
        column: String,
        columns: String,
        commit_lsn: walfold_event::Lsn,
    },
    #[error("replication stream: {0}")]
    Replication(#[from] crate::wire::WireError),

    #[error("replication stream: {0}")]
    Decode(String),
    #[error("replication stream ended")]
    StreamEnded,
    #[error(
        "publication {0} was rewritten while walfold ran: reading again, with a backfill over \
         the change"
    )]
    PublicationRewritten(String),
}

impl SourceError {
    /// What the operator can do about it, where that takes more than the message's own
    /// clause: the message ends with `Fix: ` and this.
    pub fn fix(&self) -> Option<String> {
        match self {
            SourceError::Unmapped {
                relation,
                publication,
                slot,
                skip_to,
                ..
            } => Some(format!(
                "add {relation} as an [[outbox]]; if it is a partition of an outbox, run alter \
                 publication \"{publication}\" set (publish_via_partition_root = true) and \
                 restart; if its changes are no events, remove it from the publication (changes \
                 written before that are still sent: to skip this transaction, stop walfold and \
                 run select pg_replication_slot_advance('{slot}', '{skip_to}'); walfold then \
                 records the skipped range as a slot gap and backfills its outbox rows from the \
                 tables; each such transaction stops ingest once, so repeat for the next)"
            )),
            SourceError::OutboxChanged { key, .. } => Some(format!(
                "set outbox.{key} to the name those rows use and restart (once walfold has \
                 ingested it starts with a column the table no longer has), then, when ingest \
                 stops at the first row of the new shape, set the new name and restart again; \
                 or restore the column"
            )),
            _ => None,
        }
    }

    /// Whether it is a usage error (exit code 2): a request the current state refuses, or
    /// a URL behind a pooler walfold cannot work through.
    pub fn is_usage(&self) -> bool {
        match self {
            SourceError::BackfillBesideDaemon | SourceError::MissingColumn(_) => true,
            SourceError::Store(e) => e.is_usage(),
            SourceError::Pg(e) => e.is_usage(),
            _ => false,
        }
    }

    /// What a deferred change is, without the position it does not have yet.
    pub(crate) fn summary(&self) -> String {
        match self {
            SourceError::Unmapped {
                change, relation, ..
            } => format!("{change} of {relation}, which is no [[outbox]]"),
            SourceError::OutboxChanged { table, column, .. } => {
                format!("rows of {table} without column `{column}`")
            }
            other => other.to_string(),
        }
    }

    /// The error of a streamed transaction's change, once its commit position is known.
    pub(crate) fn at_commit(self, at: walfold_event::Lsn) -> SourceError {
        match self {
            SourceError::Unmapped {
                change,
                relation,
                publication,
                slot,
                ..
            } => SourceError::Unmapped {
                change,
                relation,
                publication,
                slot,
                commit_lsn: at,
                skip_to: walfold_event::Lsn(at.0 + 1),
            },
            SourceError::OutboxChanged {
                table,
                key,
                column,
                columns,
                ..
            } => SourceError::OutboxChanged {
                table,
                key,
                column,
                columns,
                commit_lsn: at,
            },
            other => other,
        }
    }

    /// Whose fault it is; the supervisor stops on definite errors and retries the rest.
    pub fn kind(&self) -> ErrorKind {
        use crate::wire::WireError as W;
        match self {
            SourceError::WalLevel(_)
            | SourceError::MissingTable(_)
            | SourceError::Slot { .. }
            | SourceError::Refused(_)
            | SourceError::MissingColumn(_)
            | SourceError::NoSuchOutbox(_)
            | SourceError::Unmapped { .. }
            | SourceError::Replication(W::Unsupported(_)) => ErrorKind::Definite,
            // walfold's own statements: an event is never at fault here (the appender
            // sets aside events the log refuses before this point).
            SourceError::Store(source) | SourceError::StagingDeadLetter(source) => {
                source.kind().own_statement()
            }
            // Definite as the store's refusal it replaces.
            SourceError::BackfillBesideDaemon => ErrorKind::Definite,
            SourceError::Pg(e) | SourceError::SourceUrl(e) => e.kind().own_statement(),
            // The slot or the publication does not exist (any more).
            SourceError::Replication(W::Server { code, .. } | W::Streaming { code, .. })
                if walfold_event::is_undefined_object(code.as_deref()) =>
            {
                ErrorKind::Definite
            }
            SourceError::Replication(W::Server { code, .. } | W::Streaming { code, .. }) => {
                kind_for_code(code.as_deref()).own_statement()
            }
            SourceError::Replication(W::Auth(_) | W::Tls(_)) => ErrorKind::Environment,
            // Someone changed the outbox table; putting it back heals without a restart.
            SourceError::OutboxChanged { .. } => ErrorKind::Environment,
            SourceError::Replication(_) => ErrorKind::Transient,
            // A decode error means we misread the stream; a fresh stream from the
            // durable point is the only safe move, and it is logged loudly.
            SourceError::Decode(_) => ErrorKind::Transient,
            SourceError::StreamEnded => ErrorKind::Transient,
            // The next attempt records the gap and backfills it (`publication_rewritten`).
            SourceError::PublicationRewritten(_) => ErrorKind::Transient,
        }
    }
}

/// A reason the source cannot be followed as configured, with its fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub problem: String,
    pub fix: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_are_classified_by_sqlstate() {
        let e = |code: &str| {
            SourceError::Replication(crate::wire::WireError::Server {
                code: Some(code.into()),
                message: "m".into(),
            })
        };
        assert_eq!(e("42704").kind(), ErrorKind::Definite);
        assert_eq!(e("55006").kind(), ErrorKind::Transient);
        assert_eq!(e("57P01").kind(), ErrorKind::Transient);
        assert_eq!(e("28P01").kind(), ErrorKind::Environment);
    }

    /// The long fixes moved out of the messages' format strings: the operator reads the
    /// same words as before, ending with `Fix: ` and [`SourceError::fix`].
    #[test]
    fn a_long_fix_ends_the_message_word_for_word() {
        let (publication, change, relation, slot) =
            ("walfold_outbox", "an insert", "public.t", "s");
        let (commit_lsn, skip_to) = (walfold_event::Lsn(0x10), walfold_event::Lsn(0x11));
        let e = SourceError::Unmapped {
            change,
            relation: relation.into(),
            publication: publication.into(),
            slot: slot.into(),
            commit_lsn,
            skip_to,
        };
        assert_eq!(
            e.to_string(),
            format!(
                "the publication {publication} sent {change} of {relation}, which is no [[outbox]]; \
                 ingest stopped before acknowledging its transaction (commit {commit_lsn}). Fix: add \
                 {relation} as an [[outbox]]; if it is a partition of an outbox, run alter publication \
                 \"{publication}\" set (publish_via_partition_root = true) and restart; if its changes \
                 are no events, remove it from the publication (changes written before that are still \
                 sent: to skip this transaction, stop walfold and run \
                 select pg_replication_slot_advance('{slot}', '{skip_to}'); walfold then records the \
                 skipped range as a slot gap and backfills its outbox rows from the tables; each such \
                 transaction stops ingest once, so repeat for the next)"
            )
        );
        assert!(e
            .to_string()
            .ends_with(&format!("Fix: {}", e.fix().unwrap())));
        let (table, key, column, columns) = ("public.outbox", "id", "id", "uuid, body");
        let e = SourceError::OutboxChanged {
            table: table.into(),
            key,
            column: column.into(),
            columns: columns.into(),
            commit_lsn,
        };
        assert_eq!(
            e.to_string(),
            format!(
                "outbox {table}: the transaction at commit {commit_lsn} wrote rows without column \
                 `{column}` (outbox.{key}); its rows have the columns {columns}. The column was \
                 renamed or dropped: ingest stopped before acknowledging the transaction and \
                 retries; nothing is dead-lettered. Fix: set outbox.{key} to the name those rows \
                 use and restart (once walfold has ingested it starts with a column the table no \
                 longer has), then, when ingest stops at the first row of the new shape, set the \
                 new name and restart again; or restore the column"
            )
        );
    }
}

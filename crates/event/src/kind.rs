//! The one place that decides whose fault an error is, and so what happens next. Every
//! caller (the projector, the appender, the supervisors, the binary) reads the
//! [`ErrorKind`] of an error; nobody else interprets SQLSTATEs (`walfold-pg` only reads
//! them off PostgreSQL errors). The few that mean more than their kind (a lock not
//! available, a unique violation, an undefined object, table or column, a missing
//! privilege) are asked for by name here too, and so is the one message text walfold
//! reads (a pooler refusing a replication connection). Codes are tokio-postgres's typed [`SqlState`] constants.
//!
//! - *Transient*: the connection or the transaction failed, not the work (connection
//!   lost, server shutting down, serialization failure, deadlock, a lock or slot still
//!   held by a dying session). Retry from the last durable point. Keep this list short.
//! - *Environment*: the target or the config is wrong (privileges, a missing table,
//!   column or function, a syntax error in a projection's statement, a read-only
//!   server, disk full, out of memory, too many connections, a statement timeout). No
//!   event is to blame: pause, retry with capped backoff, say so loudly, resume by
//!   itself once fixed. Never dead-letter for it.
//! - *Data*: the event's own values cannot apply (a constraint, invalid input, an out of
//!   range or oversized value, a division by zero, an exception raised by a trigger).
//!   Dead-letter the event and park its aggregate; everything else goes on.
//! - *Definite*: nothing this process can retry fixes it (the slot is lost, the
//!   publication dropped, `wal_level` is not logical). Stop with the fix.
//!
//! A statement timeout (57014) counts as environment: most often a lock held by
//! someone else, and pausing a projection is recoverable without anyone retrying
//! thousands of dead letters by hand.

use tokio_postgres::error::SqlState;

/// Whose fault an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Retry from the last durable point, with backoff.
    Transient,
    /// The target or config is wrong: pause, retry with capped backoff, loudly.
    Environment,
    /// The event cannot apply: dead-letter it and park its aggregate.
    Data,
    /// Stop with the fix.
    Definite,
}

impl ErrorKind {
    /// The kind for an error raised by walfold's own statements (claims, checkpoints,
    /// dead letters): no event can be at fault for those, so data errors are blamed on
    /// the environment (e.g. someone altered walfold's schema).
    pub fn own_statement(self) -> ErrorKind {
        match self {
            ErrorKind::Data => ErrorKind::Environment,
            other => other,
        }
    }

    /// Whether retrying (at once or after a pause) can help.
    pub fn retries(self) -> bool {
        matches!(self, ErrorKind::Transient | ErrorKind::Environment)
    }
}

/// Admin or crash shutdown, cannot connect now: the server is going or coming.
const SHUTTING_DOWN: [SqlState; 3] = [
    SqlState::ADMIN_SHUTDOWN,
    SqlState::CRASH_SHUTDOWN,
    SqlState::CANNOT_CONNECT_NOW,
];

/// Serialization failure, deadlock, statement completion unknown, lock not available,
/// object in use (a slot still held by an exiting walsender), snapshot too old.
const TRY_AGAIN: [SqlState; 6] = [
    SqlState::T_R_SERIALIZATION_FAILURE,
    SqlState::T_R_DEADLOCK_DETECTED,
    SqlState::T_R_STATEMENT_COMPLETION_UNKNOWN,
    SqlState::LOCK_NOT_AVAILABLE,
    SqlState::OBJECT_IN_USE,
    SqlState::SNAPSHOT_TOO_OLD,
];

/// Maps a SQLSTATE (none: an I/O or protocol error) to its kind.
pub fn kind_for_code(code: Option<&str>) -> ErrorKind {
    let Some(c) = code else {
        return ErrorKind::Transient;
    };
    let class = c.get(..2).unwrap_or("");
    let one_of = |states: &[SqlState]| states.iter().any(|s| s.code() == c);
    match class {
        // Connection exceptions.
        "08" => ErrorKind::Transient,
        _ if one_of(&SHUTTING_DOWN) || one_of(&TRY_AGAIN) => ErrorKind::Transient,
        // Data exception, integrity constraint, cardinality (a statement meeting the
        // same row twice), program limit (an index row too large), trigger-raised
        // exceptions, routine exceptions, with check option.
        "22" | "23" | "21" | "54" | "P0" | "2F" | "38" | "39" | "27" | "44" => ErrorKind::Data,
        // Everything else is about the server or the statement, not the event:
        // 42 (privileges, missing objects, syntax), 53 (resources), 58 (system),
        // 25006 (read-only), 3D/3F (no such database/schema), 28 (authentication),
        // 0A (feature not supported), 57014 (statement timeout), XX (internal).
        _ => ErrorKind::Environment,
    }
}

/// Whether the code is `state`.
fn is(code: Option<&str>, state: SqlState) -> bool {
    code == Some(state.code())
}

/// A lock asked for without waiting (or within `lock_timeout`) is held by another
/// session (55P03).
pub fn is_lock_not_available(code: Option<&str>) -> bool {
    is(code, SqlState::LOCK_NOT_AVAILABLE)
}

/// A row with the same key exists (23505).
pub fn is_unique_violation(code: Option<&str>) -> bool {
    is(code, SqlState::UNIQUE_VIOLATION)
}

/// The object named does not exist, e.g. a slot or publication (42704).
pub fn is_undefined_object(code: Option<&str>) -> bool {
    is(code, SqlState::UNDEFINED_OBJECT)
}

/// A statement names a table that does not exist (42P01).
pub fn is_undefined_table(code: Option<&str>) -> bool {
    is(code, SqlState::UNDEFINED_TABLE)
}

/// A statement names a column that does not exist (42703).
pub fn is_undefined_column(code: Option<&str>) -> bool {
    is(code, SqlState::UNDEFINED_COLUMN)
}

/// The role lacks a privilege (42501).
pub fn is_insufficient_privilege(code: Option<&str>) -> bool {
    is(code, SqlState::INSUFFICIENT_PRIVILEGE)
}

/// A server's refusal of a replication connection's startup that only a connection
/// pooler makes: PostgreSQL never says "unsupported startup parameter", PgBouncer does
/// (for `replication`), and retrying cannot help. The one message text read anywhere.
pub fn is_pooler_startup_refusal(message: &str) -> bool {
    message.contains("unsupported startup parameter")
}

/// The kind of a failure to reach an extra target (`[targets.NAME]`) at all: a target
/// that is down or refuses connections is the environment of its projections, which
/// pause, loudly, and resume by themselves while every other projection goes on. (The
/// main target unreachable stays transient: nothing goes on without it.)
pub fn unreachable_target(kind: ErrorKind) -> ErrorKind {
    match kind {
        ErrorKind::Transient => ErrorKind::Environment,
        other => other,
    }
}

/// Whether a SQLSTATE says the server ran short of something (disk, memory,
/// connections): a batch that hits it is tried again smaller.
pub fn is_resource_code(code: Option<&str>) -> bool {
    // Class 53: insufficient resources.
    code.is_some_and(|c| c.starts_with("53"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sqlstate_is_blamed_on_what_caused_it() {
        use ErrorKind::*;
        for (code, kind) in [
            (None, Transient),
            (Some("08006"), Transient),
            (Some("57P01"), Transient),
            (Some("57P02"), Transient),
            (Some("57P03"), Transient),
            (Some("40001"), Transient),
            (Some("40P01"), Transient),
            (Some("40003"), Transient),
            (Some("55P03"), Transient),
            (Some("72000"), Transient),
            (Some("55006"), Transient),
            (Some("23505"), Data),
            (Some("22P02"), Data),
            (Some("22012"), Data),
            (Some("54000"), Data),
            (Some("P0001"), Data),
            (Some("42501"), Environment),
            (Some("42P01"), Environment),
            (Some("42703"), Environment),
            (Some("42883"), Environment),
            (Some("42601"), Environment),
            (Some("53100"), Environment),
            (Some("53200"), Environment),
            (Some("53300"), Environment),
            (Some("25006"), Environment),
            (Some("57014"), Environment),
            (Some("3F000"), Environment),
            (Some("XX000"), Environment),
        ] {
            assert_eq!(kind_for_code(code), kind, "{code:?}");
        }
        assert!(is_resource_code(Some("53100")));
        assert!(!is_resource_code(Some("42501")));
        assert!(is_lock_not_available(Some("55P03")));
        assert!(is_unique_violation(Some("23505")));
        assert!(is_undefined_object(Some("42704")));
        assert!(is_insufficient_privilege(Some("42501")));
        assert!(!is_insufficient_privilege(Some("42704")) && !is_undefined_object(None));
        assert_eq!(Data.own_statement(), Environment);
        assert_eq!(unreachable_target(Transient), Environment);
        assert_eq!(unreachable_target(Definite), Definite);
    }

    #[test]
    fn the_codes_and_the_text_asked_for_by_name_are_told_apart() {
        assert!(is_undefined_table(Some("42P01")));
        assert!(!is_undefined_table(Some("42704")) && !is_undefined_table(None));
        assert!(is_undefined_column(Some("42703")) && !is_undefined_column(Some("42P01")));
        assert!(is_pooler_startup_refusal(
            "unsupported startup parameter: replication"
        ));
        assert!(!is_pooler_startup_refusal("password authentication failed"));
    }
}

//! Doctor's checks of who can write events: whoever may insert into a table outbox
//! (through a partition, a view or a security-definer function too), whoever may
//! execute `pg_logical_emit_message` for a message outbox; and whether walfold's own
//! heartbeats may.

use walfold_config::QualifiedName;
use walfold_source::shape::TableRights;

use super::finding::{Finding, Level};
use super::source::Source;

/// Roles for a line of `doctor`: at most ten names, and superusers, who may do anything.
fn roles(names: &[String]) -> String {
    const SHOWN: usize = 10;
    match names.len() {
        0 => "superusers only".to_owned(),
        n if n > SHOWN => format!(
            "{} and {} more, and superusers",
            names[..SHOWN].join(", "),
            n - SHOWN
        ),
        _ => format!("{}, and superusers", names.join(", ")),
    }
}

/// Who can write `table`'s events: whoever may insert into it (informational), and a
/// warning when that is PUBLIC; and the security-definer functions that insert into it
/// for their callers.
pub(super) fn of_table(table: &QualifiedName, rights: &TableRights) -> Vec<Finding> {
    let writers = &rights.writers;
    let mut found = vec![if writers.public {
        Finding::warn(
            format!("any role may insert into {table}, and so write its events"),
            format!(
                "revoke insert on {} from public; grant insert on {} to <producing role>",
                table.quoted(),
                table.quoted()
            ),
        )
    } else {
        Finding::ok(format!(
            "roles that may write events into {table} (insert into it, a partition of it \
             or an updatable view on it): {}",
            roles(&writers.roles)
        ))
    }];
    if !writers.views.is_empty() {
        found.push(Finding::ok(match writers.views.as_slice() {
            [one] => format!(
                "view {one} writes rows into {table} as its owner: whoever may insert into \
                 it writes events"
            ),
            several => format!(
                "views {} write rows into {table} as their owners: whoever may insert into \
                 them writes events",
                several.join(", ")
            ),
        }));
    }
    for d in &rights.definers {
        let (level, who) = if d.public {
            (Level::Warn, "any role".to_owned())
        } else if !d.triggers_on.is_empty() {
            (
                Level::Ok,
                format!(
                    "whoever writes {} (its triggers call it)",
                    d.triggers_on.join(", ")
                ),
            )
        } else {
            (
                Level::Ok,
                roles(&[vec![d.owner.clone()], d.callers.clone()].concat()),
            )
        };
        found.push(Finding::new(
            level,
            format!(
                "security-definer function {} names {} and runs as {}, who may insert \
                 into it: {who} may write events through it",
                d.function,
                match &d.through {
                    Some(via) => format!("{via}, which writes rows into {table},"),
                    None => table.to_string(),
                },
                d.owner
            ),
            format!(
                "revoke execute on function {} from public; grant execute on function {} \
                 to <producing role>",
                d.function, d.function
            ),
        ));
    }
    found
}

/// Message outboxes need PostgreSQL 14, and are written by whoever may execute
/// `pg_logical_emit_message` (while PUBLIC may, `refusals` FAILed, or warned with
/// `allow_public_emit`). Without one, a PUBLIC right still costs memory.
pub(super) fn message_outboxes(s: &Source<'_>) -> Vec<Finding> {
    let message_outboxes: Vec<_> = s
        .view
        .outboxes()
        .filter(|o| o.message_prefix.is_some())
        .collect();
    let emitters = &s.shape.emit.emitters;
    let mut found: Vec<Finding> = message_outboxes
        .iter()
        .map(|o| {
            Finding::unless(
                s.shape.server.version >= 140000,
                Level::Fail,
                format!(
                    "{}: transactional messages under this prefix are events (the server sends them from PostgreSQL 14)",
                    o.describe()
                ),
                "upgrade the source to PostgreSQL 14 or later, or write events to an outbox table",
            )
        })
        .collect();
    if !message_outboxes.is_empty() && !emitters.public {
        let names: Vec<String> = message_outboxes.iter().map(|o| o.describe()).collect();
        found.push(Finding::ok(format!(
            "roles that may write events into {} (execute pg_logical_emit_message): {}",
            names.join(", "),
            roles(&emitters.roles)
        )));
    }
    found
}

/// Heartbeats call `pg_logical_emit_message` as the source role: once that is revoked
/// from PUBLIC, the role needs its own grant (or no heartbeats).
pub(super) fn heartbeat_right(s: &Source<'_>) -> Vec<Finding> {
    let heartbeat = &s.shape.emit.heartbeat;
    if s.view.source().heartbeat_interval_s == 0 || heartbeat.iter().any(|(_, may)| *may) {
        return Vec::new();
    }
    let functions: Vec<&str> = heartbeat.iter().map(|(f, _)| f.as_str()).collect();
    let role = s.role();
    vec![Finding::warn(
        format!("the source role {role} may not execute pg_logical_emit_message: walfold's heartbeats fail, so on a database where no outbox row is written the slot does not advance"),
        format!(
            "grant execute on function {} to {role}, or set source.heartbeat_interval_s = 0",
            functions.join(", ")
        ),
    )]
}

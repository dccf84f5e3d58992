//! Doctor's checks of the outboxes: what `walfold run` refuses (a FAIL here), each table
//! outbox that exists (its times, whether walfold may read it, its replica identity)
//! and whether the projections that need a version get one.

use walfold_config::{ProjectionKind, QualifiedName, VersionMode};
use walfold_source::shape::{Relation, TableRights};

use super::finding::{Finding, Level};
use super::source::Source;
use super::writers;

/// What `walfold run` refuses: each a FAIL; its warnings.
pub(super) fn refusals(s: &Source<'_>) -> Vec<Finding> {
    let v = &s.verdict;
    let refused = v
        .refusals
        .iter()
        .chain(&v.missing_columns)
        .chain(&v.public_emit)
        .map(|refusal| Finding::fail(&refusal.problem, &refusal.fix));
    let warned = v.warnings.iter().map(|w| Finding::warn(w, ""));
    refused.chain(warned).collect()
}

/// The relation the catalog has under `table`'s name.
fn relation<'s>(s: &'s Source<'_>, table: &QualifiedName) -> Option<&'s Relation> {
    s.shape
        .outboxes
        .tables
        .iter()
        .find(|t| t.name == *table)
        .and_then(|t| t.relation.as_ref())
}

/// Each table outbox that exists, in config order.
pub(super) fn tables(s: &Source<'_>) -> Vec<Finding> {
    let updates_or_deletes = s
        .shape
        .outboxes
        .publication
        .as_ref()
        .is_some_and(|p| p.updates_or_deletes);
    let mut found = Vec::new();
    for (o, t) in s.view.table_outboxes() {
        let Some(rights) = s.shape.rights.iter().find(|r| r.table == t) else {
            continue;
        };
        found.push(Finding::ok(format!("outbox table {t} exists")));
        // A column (an expression's times without an offset are UTC by rule).
        let occurred = o
            .fields()
            .into_iter()
            .find(|f| f.key == "occurred_at")
            .filter(|f| f.is_column())
            .map_or("", |f| f.value);
        found.extend(naive_time(s, &t, occurred));
        found.push(Finding::unless(
            rights.select,
            Level::Warn,
            format!("the source role may read {t} (needed by `walfold backfill` only)"),
            format!("grant select on {t} to {}", s.role()),
        ));
        found.extend(writers::of_table(&t, rights));
        if updates_or_deletes {
            found.push(replica_identity(s, &t, rights));
        }
    }
    found
}

/// An `occurred_at` column without a time zone is read as UTC.
fn naive_time(s: &Source<'_>, t: &QualifiedName, column: &str) -> Option<Finding> {
    let declared = relation(s, t)?
        .columns
        .iter()
        .find(|c| c.name == column)
        .map(|c| c.declared.as_str());
    (declared == Some("timestamp without time zone")).then(|| {
        Finding::warn(
            format!("{t}.{column}: timestamp without time zone, read as UTC"),
            "write UTC times into it, or make it timestamptz",
        )
    })
}

/// A publication of updates or deletes makes PostgreSQL refuse them on a table without
/// a replica identity.
fn replica_identity(s: &Source<'_>, t: &QualifiedName, rights: &TableRights) -> Finding {
    let identity = &rights.replica_identity;
    let publication = s.publication();
    Finding::unless(
        identity != "n",
        Level::Fail,
        format!("{t}: replica identity {identity} (the publication publishes updates/deletes)"),
        format!("publish only inserts (alter publication {publication} set (publish = 'insert, truncate')), or give {t} a primary key"),
    )
}

/// A projection that needs each event's version (a `table` one's guard, a strict one's
/// order) dead-letters every event that comes without one: an outbox whose version is
/// a column the table does not have gives none.
pub(super) fn versions_for_guards(s: &Source<'_>) -> Vec<Finding> {
    let name = &s.view.source().name;
    let needing: Vec<&str> = s
        .view
        .config
        .projection
        .iter()
        .filter(|p| {
            matches!(p.kind, ProjectionKind::Table { .. }) || p.version_mode == VersionMode::Strict
        })
        .filter(|p| p.sources.as_ref().is_none_or(|s| s.contains(name)))
        .map(|p| p.name.as_str())
        .collect();
    if needing.is_empty() {
        return Vec::new();
    }
    let mut without = Vec::new();
    let mut with = 0;
    for (o, t) in s.view.table_outboxes() {
        let Some(field) = o.fields().into_iter().find(|f| f.key == "version") else {
            continue;
        };
        let present = !field.is_column()
            || relation(s, &t).is_some_and(|r| r.columns.iter().any(|c| c.name == field.value));
        if present {
            with += 1;
        } else {
            without.push(format!("{t} (no column {})", field.value));
        }
    }
    if without.is_empty() {
        return Vec::new();
    }
    // A message outbox's events may carry a version of their own.
    let messages = s.view.outboxes().any(|o| o.message_prefix.is_some());
    let all = with == 0 && !messages;
    vec![Finding::new(
        if all { Level::Fail } else { Level::Warn },
        format!(
            "{} each event's version (a `table` projection's guard, a strict one's order), \
             and {} give none: {}",
            match needing.as_slice() {
                [one] => format!("projection {one} needs"),
                several => format!("projections {} need", several.join(", ")),
            },
            without.join(", "),
            if all {
                "every event is dead-lettered"
            } else {
                "their events are dead-lettered unless the projections' event_types or \
                 aggregate_types leave them out"
            }
        ),
        "map the version under [[outbox]] (`version = \"COLUMN\"`, or an expression), or \
         write those projections as `sql` ones that need none",
    )]
}

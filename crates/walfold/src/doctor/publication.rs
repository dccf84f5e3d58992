//! Doctor's checks of the publication: whether walfold can create it or add the outbox
//! tables it lacks as the source role, whether it is the one the slot was read through,
//! and how it publishes a partitioned outbox.

use walfold_config::quote_ident;
use walfold_source::shape::create_publication;

use super::finding::{Finding, Level};
use super::source::Source;

pub(super) fn publication(s: &Source<'_>) -> Vec<Finding> {
    let read_from = s.ingested.is_some() && s.shape.slot.is_some();
    match (s.verdict.publication_exists, read_from) {
        (false, true) => vec![missing_but_read(s)],
        (false, false) => vec![missing(s)],
        (true, _) => existing(s, read_from),
    }
}

/// The fix that goes back to the publication the slot was read through.
fn back(s: &Source<'_>) -> String {
    match &s.read_through {
        Some(r) if r != s.publication() => format!("set source.publication back to {r}"),
        _ => "if it is gone, see docs/OPERATIONS.md: a lost slot".to_owned(),
    }
}

/// The table outboxes (that exist) whose owner the source role is not: it cannot put
/// them in a publication.
fn not_owned(s: &Source<'_>) -> Vec<String> {
    s.view
        .table_outboxes()
        .filter(|(_, t)| s.shape.rights.iter().any(|r| r.table == *t && !r.owned))
        .map(|(_, t)| t.to_string())
        .collect()
}

/// A publication created now is not there for the changes the slot holds.
fn missing_but_read(s: &Source<'_>) -> Finding {
    Finding::fail(
        format!(
            "publication {} does not exist, and walfold has read slot {} through {}",
            s.publication(),
            s.slot(),
            s.read_through.as_deref().unwrap_or("another")
        ),
        format!(
            "walfold will not create it: a publication created now is not there for the changes the slot holds; {}",
            back(s)
        ),
    )
}

/// Creating it needs `create` on the database and to own the outbox tables.
fn missing(s: &Source<'_>) -> Finding {
    let not_owned = not_owned(s);
    let db_create = s.shape.role.create_on_database;
    let may = db_create && not_owned.is_empty();
    let role = s.role();
    Finding::new(
        if may { Level::Warn } else { Level::Fail },
        format!("publication {} does not exist", s.publication()),
        if may {
            format!(
                "walfold creates it on start as {role}, or create it as the outbox tables' owner: {}",
                create_publication(s.view)
            )
        } else {
            format!(
                "walfold cannot create it as {role} ({}): create it as the outbox tables' owner: {}",
                if db_create {
                    format!("it does not own {}", not_owned.join(", "))
                } else {
                    "no create on the database".to_owned()
                },
                create_publication(s.view)
            )
        },
    )
}

fn existing(s: &Source<'_>, read_from: bool) -> Vec<Finding> {
    let publication = s.publication();
    let mut found = Vec::new();
    if read_from && s.read_through.as_ref().is_some_and(|r| r != publication) {
        found.push(Finding::warn(
            format!(
                "walfold has read slot {} through publication {}, not {publication}",
                s.slot(),
                s.read_through.as_deref().unwrap_or_default()
            ),
            format!(
                "walfold refuses {publication} unless it is older than the changes the slot holds; {}",
                back(s)
            ),
        ));
    }
    let v = &s.verdict;
    if v.refusals.is_empty() && v.unpublished.is_empty() {
        found.push(Finding::ok(format!(
            "publication {publication} covers exactly the outbox tables"
        )));
    } else if !v.unpublished.is_empty() {
        found.push(lacks(s));
    }
    // A FAIL for a partitioned outbox without it is among the refusals.
    match (v.via_root, v.partitioned.is_empty()) {
        (true, _) => found.push(Finding::ok(format!(
            "publication {publication}: publish_via_partition_root = true"
        ))),
        (false, true) => found.push(Finding::ok(format!(
            "publication {publication}: publish_via_partition_root = false (no outbox is partitioned)"
        ))),
        (false, false) => {}
    }
    found
}

/// `alter publication … add table` needs both the publication and the tables.
fn lacks(s: &Source<'_>) -> Finding {
    let unpublished = &s.verdict.unpublished;
    let missing: Vec<String> = unpublished.iter().map(ToString::to_string).collect();
    let not_owned = not_owned(s);
    let owns_publication = s
        .shape
        .outboxes
        .publication
        .as_ref()
        .is_some_and(|p| p.owned);
    let quoted: Vec<String> = unpublished.iter().map(|t| t.quoted()).collect();
    let owns = owns_publication
        && unpublished
            .iter()
            .all(|t| !not_owned.contains(&t.to_string()));
    let role = s.role();
    Finding::new(
        if owns { Level::Warn } else { Level::Fail },
        format!(
            "publication {} lacks {}",
            s.publication(),
            missing.join(", ")
        ),
        if owns {
            format!("walfold adds them on start as {role}, or add them as their owner")
        } else {
            format!(
                "walfold cannot add them as {role} (that needs ownership of the publication and the tables): as their owner, alter publication {} add table {}",
                quote_ident(s.publication()),
                quoted.join(", ")
            )
        },
    )
}

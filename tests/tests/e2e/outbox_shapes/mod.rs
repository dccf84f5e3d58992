//! Outboxes as applications write them, end to end with the real `walfold` binary:
//! partitioned outboxes, several outboxes in one pipeline, names in every ORM's
//! convention, and what walfold refuses (with the fix) instead of dropping events.
//!
//! By behaviour: outboxes in each convention and partitioned (`conventions.rs`), what
//! walfold refuses or stops on (`refusals.rs`), rejected rows recorded once
//! (`rejected_rows.rs`), message outboxes (`messages.rs`).

mod conventions;
mod messages;
mod refusals;
mod rejected_rows;

use std::time::Duration;

use walfold_tests::{eventually, TestDb};

const ID: [&str; 4] = [
    "00000000-0000-4000-8000-000000000001",
    "00000000-0000-4000-8000-000000000002",
    "00000000-0000-4000-8000-000000000003",
    "00000000-0000-4000-8000-000000000004",
];

/// Waits until `slot`'s ingest position reaches `lsn`.
async fn ingested_through(db: &TestDb, slot: &str, lsn: &str) {
    let sql = format!(
        "select coalesce((select lsn >= '{lsn}' from walfold.ingest_position where slot = '{slot}'), false)"
    );
    eventually(
        Duration::from_secs(60),
        &format!("{slot} to ingest through {lsn}"),
        || async { db.psql(&sql) == "t" },
    )
    .await;
}

//! A drifted walfold table (a column an operator altered to another type, or made
//! nullable and emptied) fails the read that meets it with an environment error naming
//! the table and the column, so the daemon pauses and resumes once the column is
//! restored, instead of panicking.

use tokio_postgres::Client;
use walfold_event::ErrorKind;
use walfold_pg::{PgError, RowExt};
use walfold_store::{Operator, Schema, StoreError};
use walfold_tempdb::Cluster;

/// A fresh database with walfold's schema: its name, a connection and the schema.
async fn migrated(prefix: &str) -> (String, Client, Schema) {
    let cluster = Cluster::shared();
    let db = cluster.create_database(prefix).expect("database");
    let url = cluster.url(&db);
    let schema = Schema::new("walfold");
    walfold_store::migrate(&url, &schema)
        .await
        .expect("migrate");
    let client = walfold_pg::connect(&url).await.expect("connect");
    (db, client, schema)
}

fn psql(db: &str, sql: &str) {
    Cluster::shared().psql(db, sql).expect(sql);
}

/// `e` is the environment error of column `column` of `table`, and says so.
fn assert_unreadable(e: &StoreError, table: &str, column: &str, reason: &str) {
    assert_eq!(e.kind(), ErrorKind::Environment, "{e}");
    assert!(
        matches!(e, StoreError::Pg(PgError::Column { table: t, column: c, .. }) if *t == table && c == column),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("column {column} of {table} cannot be read: ")),
        "{text}"
    );
    assert!(text.contains(reason), "{text}");
}

#[tokio::test]
async fn status_names_an_ingest_position_column_altered_to_another_type_and_recovers() {
    let (db, client, schema) = migrated("drift_status").await;
    psql(
        &db,
        "insert into walfold.ingest_position (slot, lsn, appended) values ('drift', '0/10', 7); \
         alter table walfold.ingest_position alter column appended type text",
    );
    let e = Operator::new(&client, &schema)
        .status_of_slot(&client, "drift")
        .await
        .expect_err("a column of another type");
    assert_unreadable(
        &e,
        "ingest_position",
        "appended",
        "cannot convert between the Rust type `i64` and the Postgres type `text`",
    );

    // Restored, the same read works again: nothing to restart.
    psql(
        &db,
        "alter table walfold.ingest_position alter column appended type bigint using appended::bigint",
    );
    let status = Operator::new(&client, &schema)
        .status_of_slot(&client, "drift")
        .await
        .expect("the column restored");
    assert_eq!(status.ingest.expect("the ingest position").appended, 7);
}

#[tokio::test]
async fn status_names_a_column_that_holds_a_null_walfold_never_writes() {
    let (db, client, schema) = migrated("drift_null").await;
    psql(
        &db,
        "insert into walfold.ingest_position (slot, lsn) values ('drift', '0/10'); \
         alter table walfold.ingest_position alter column malformed drop not null; \
         update walfold.ingest_position set malformed = null",
    );
    let e = Operator::new(&client, &schema)
        .status_of_slot(&client, "drift")
        .await
        .expect_err("a null");
    assert_unreadable(&e, "ingest_position", "malformed", "NULL");
}

#[tokio::test]
async fn dead_letter_list_names_a_column_altered_to_another_type() {
    let (db, client, schema) = migrated("drift_dead_letter").await;
    psql(
        &db,
        "insert into walfold.dead_letter (reason, error) values ('malformed', 'no id'); \
         alter table walfold.dead_letter alter column attempts type text",
    );
    let e = Operator::new(&client, &schema)
        .dead_letters(None, true, 10)
        .await
        .expect_err("a column of another type");
    assert_unreadable(
        &e,
        "dead_letter",
        "attempts",
        "cannot convert between the Rust type `i32` and the Postgres type `text`",
    );
}

#[tokio::test]
async fn a_column_read_by_position_is_named_by_what_the_query_returned_there() {
    let (_db, client, _schema) = migrated("drift_position").await;
    let row = client
        .query_one("select 'seven'::text as counted", &[])
        .await
        .expect("a row");
    let e: StoreError = row
        .of("ingest_position")
        .col::<i64>(0)
        .expect_err("text is no i64")
        .into();
    assert_unreadable(
        &e,
        "ingest_position",
        "counted",
        "cannot convert between the Rust type `i64` and the Postgres type `text`",
    );
    let e: StoreError = row
        .of("ingest_position")
        .col::<String>(1)
        .expect_err("one column only")
        .into();
    assert_unreadable(&e, "ingest_position", "#1", "the row has no such column");
}

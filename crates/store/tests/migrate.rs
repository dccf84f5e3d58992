//! walfold's migration runner keeps sqlx's format: a schema migrated by sqlx's runner (as
//! walfold builds before this one did) validates, and the other way round; concurrent
//! runs apply each migration once; a migration that differs from the applied one, or
//! fails, stops.

use std::str::FromStr;

use sqlx::migrate::Migrator;
use sqlx::postgres::PgConnectOptions;
use sqlx::ConnectOptions;
use walfold_store::{migrate, Schema, StoreError};
use walfold_tempdb::Cluster;

/// sqlx's runner, as walfold ran it before: the bookkeeping table in the schema.
async fn migrate_with_sqlx(url: &str, schema: &Schema) -> Result<(), sqlx::migrate::MigrateError> {
    let mut conn = PgConnectOptions::from_str(url)?
        .options([("search_path", schema.quoted())])
        .connect()
        .await?;
    let mut migrator: Migrator = sqlx::migrate!("../../migrations");
    migrator.dangerous_set_table_name(format!("{}._sqlx_migrations", schema.quoted()));
    migrator.create_schema(schema.quoted().to_owned());
    migrator.run_direct(None, &mut conn, false).await
}

async fn versions(url: &str, schema: &Schema) -> Vec<(i64, bool)> {
    let client = walfold_pg::connect(url).await.unwrap();
    client
        .query(
            &format!(
                "select version, success from {}._sqlx_migrations order by 1",
                schema.quoted()
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_migrated_by_either_runner_validate_in_the_other() {
    let cluster = Cluster::shared();
    let db = cluster.create_database("migrate").unwrap();
    let url = cluster.url(&db);
    let expected = sqlx::migrate!("../../migrations").iter().count();

    let by_sqlx = Schema::new("ByOldRunner");
    migrate_with_sqlx(&url, &by_sqlx).await.unwrap();
    migrate(&url, &by_sqlx).await.unwrap();
    assert_eq!(versions(&url, &by_sqlx).await.len(), expected);

    let ours = Schema::new("walfold");
    let runs = (0..3).map(|_| migrate(&url, &ours));
    for run in futures::future::join_all(runs).await {
        run.unwrap();
    }
    let applied = versions(&url, &ours).await;
    assert_eq!(applied.len(), expected);
    assert!(applied.iter().all(|(_, ok)| *ok));
    migrate_with_sqlx(&url, &ours).await.unwrap();
    assert_eq!(versions(&url, &ours).await, applied);

    // A migration edited after it was applied is refused, not run again.
    cluster
        .psql(
            &db,
            "update walfold._sqlx_migrations set checksum = '\\x00' \
             where version = (select max(version) from walfold._sqlx_migrations)",
        )
        .unwrap();
    let err = migrate(&url, &ours).await.unwrap_err();
    assert!(matches!(err, StoreError::MigrationHistory { .. }), "{err}");
    assert!(err.to_string().contains("differs"), "{err}");

    // A migration that fails says which, and leaves no record of itself.
    cluster
        .psql(
            &db,
            "create schema clash; create table clash.event_log (x int);",
        )
        .unwrap();
    let clash = Schema::new("clash");
    let err = migrate(&url, &clash).await.unwrap_err();
    let first = sqlx::migrate!("../../migrations")
        .iter()
        .next()
        .unwrap()
        .version;
    assert!(
        matches!(err, StoreError::Migrate { version: Some(v), .. } if v == first),
        "{err}"
    );
    assert!(err.to_string().contains(&format!("to {first}")), "{err}");
    assert!(versions(&url, &clash).await.is_empty());
}

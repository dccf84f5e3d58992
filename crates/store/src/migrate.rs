//! walfold's schema, from the embedded migrations in `migrations/`, applied with sqlx.
//! The migrations run with `search_path` set to the configured schema, and sqlx's
//! bookkeeping table lives in that schema too.

use std::borrow::Cow;
use std::str::FromStr;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, SqlSafeStr};

use crate::error::StoreError;
use crate::schema::Schema;

/// `(version, description, sql)`, in order. A test checks every file in `migrations/` is here.
pub(crate) const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        20261130000001,
        "walfold schema",
        include_str!("../../../migrations/20261130000001_walfold_schema.sql"),
    ),
    (
        20261130000002,
        "dead letter once",
        include_str!("../../../migrations/20261130000002_dead_letter_once.sql"),
    ),
    (
        20261130000003,
        "dead letter resolution",
        include_str!("../../../migrations/20261130000003_dead_letter_resolution.sql"),
    ),
    (
        20261130000004,
        "rebuild and retention",
        include_str!("../../../migrations/20261130000004_rebuild_retention.sql"),
    ),
    (
        20261130000005,
        "slot gap",
        include_str!("../../../migrations/20261130000005_slot_gap.sql"),
    ),
    (
        20261201000001,
        "fence, pause, park key",
        include_str!("../../../migrations/20261201000001_fence_pause_park_key.sql"),
    ),
    (
        20261201000002,
        "strict versions",
        include_str!("../../../migrations/20261201000002_strict_versions.sql"),
    ),
    (
        20261201000100,
        "dead letter change identity",
        include_str!("../../../migrations/20261201000100_dead_letter_change_identity.sql"),
    ),
    (
        20261201000101,
        "dead letter row digest",
        include_str!("../../../migrations/20261201000101_dead_letter_row_digest.sql"),
    ),
    (
        20261201000200,
        "stream staging",
        include_str!("../../../migrations/20261201000200_stream_staging.sql"),
    ),
    (
        20261201000300,
        "event source",
        include_str!("../../../migrations/20261201000300_event_source.sql"),
    ),
    (
        20261201000301,
        "dead letter source",
        include_str!("../../../migrations/20261201000301_dead_letter_source.sql"),
    ),
    (
        20261201000302,
        "ingest position source",
        include_str!("../../../migrations/20261201000302_ingest_position_source.sql"),
    ),
    (
        20261201000303,
        "target hold",
        include_str!("../../../migrations/20261201000303_target_hold.sql"),
    ),
    (
        20261201000400,
        "dead letter reason check",
        include_str!("../../../migrations/20261201000400_dead_letter_reason_check.sql"),
    ),
];

/// sqlx's bookkeeping table, inside walfold's schema.
const BOOKKEEPING: &str = "{schema}._sqlx_migrations";

/// Creates or upgrades walfold's schema; idempotent and safe to run concurrently.
pub async fn migrate(url: &str, schema: &Schema) -> Result<(), StoreError> {
    let options = PgConnectOptions::from_str(url)
        .map_err(|source| StoreError::MigrateConnect {
            schema: schema.name().to_owned(),
            source,
        })?
        // Quoted, so a mixed-case schema is not folded to lower case.
        .options([("search_path", schema.quoted())])
        .application_name("walfold-migrate")
        .disable_statement_logging();
    let mut conn = options
        .connect()
        .await
        .map_err(|source| StoreError::MigrateConnect {
            schema: schema.name().to_owned(),
            source,
        })?;
    let mut migrator = Migrator::with_migrations(
        MIGRATIONS
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    Cow::Borrowed(description),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                )
            })
            .collect(),
    );
    migrator.dangerous_set_table_name(schema.sql(BOOKKEEPING));
    migrator.create_schema(schema.quoted().to_owned());
    // `run_direct` is sqlx's documented way around "Acquire is not general enough" when
    // the future must be Send (it runs inside a spawned task).
    migrator
        .run_direct(None, &mut conn, false)
        .await
        .map_err(|source| StoreError::Migrate {
            schema: schema.name().to_owned(),
            source,
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::MIGRATIONS;

    #[test]
    fn every_migration_file_is_embedded() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sql"))
            .collect();
        files.sort();
        let embedded: Vec<String> = MIGRATIONS.iter().map(|(v, _, _)| v.to_string()).collect();
        assert_eq!(files.len(), MIGRATIONS.len(), "{files:?}");
        for (file, version) in files.iter().zip(&embedded) {
            assert!(file.starts_with(version.as_str()), "{file} vs {version}");
        }
    }
}

//! walfold's schema, from the embedded migrations in `migrations/`, applied with sqlx.
//! The migrations run with `search_path` set to the configured schema, and sqlx's
//! bookkeeping table lives in that schema too.

use std::str::FromStr;

use sqlx::migrate::Migrator;
use sqlx::postgres::PgConnectOptions;
use sqlx::ConnectOptions;

use crate::error::StoreError;
use crate::schema::Schema;

/// Every file in `migrations/`, found and embedded at build time.
pub(crate) fn embedded() -> Migrator {
    sqlx::migrate!("../../migrations")
}

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
    let mut migrator = embedded();
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
pub(crate) mod tests {
    use std::borrow::Cow;

    use sqlx::migrate::{Migration, MigrationType};
    use sqlx::SqlSafeStr;

    /// A schema migrated by an earlier build (which listed the files by hand) must
    /// validate: every file is embedded, under its version, with the checksum of its text.
    #[test]
    fn every_migration_file_is_embedded_with_the_checksum_of_its_text() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations");
        let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "sql"))
            .collect();
        files.sort();
        let embedded = super::embedded();
        assert_eq!(files.len(), embedded.iter().count(), "{files:?}");
        for (file, m) in files.iter().zip(embedded.iter()) {
            let name = file.file_name().unwrap().to_string_lossy();
            assert!(
                name.starts_with(&m.version.to_string()),
                "{name} vs {}",
                m.version
            );
            let text: &'static str = String::leak(std::fs::read_to_string(file).unwrap());
            let by_hand = Migration::new(
                m.version,
                Cow::Borrowed(""),
                MigrationType::Simple,
                text.into_sql_str(),
                false,
            );
            assert_eq!(by_hand.checksum, m.checksum, "{name}");
            assert!(!m.no_tx, "{name}");
        }
    }

    /// The values the migrations' last `check (column in (…))` allows, sorted: what a test
    /// compares with an enum's `ALL`.
    pub(crate) fn checked_values(column: &str) -> Vec<String> {
        let needle = format!("check ({column} in (");
        let migrations = super::embedded();
        let last = migrations
            .iter()
            .filter_map(|m| {
                let sql = m.sql.as_str();
                sql.rfind(&needle)
                    .map(|at| sql[at + needle.len()..].to_owned())
            })
            .next_back()
            .unwrap_or_else(|| panic!("no check constraint on {column}"));
        let list = &last[..last.find(')').expect("the list closes")];
        let mut values: Vec<String> = list
            .split(',')
            .map(|v| v.trim().trim_matches('\'').to_owned())
            .collect();
        values.sort();
        values
    }
}

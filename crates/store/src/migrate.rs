//! walfold's schema, from the embedded migrations in `migrations/`, applied with sqlx.
//! The migrations run with `search_path` set to the configured schema, and sqlx's
//! bookkeeping table lives in that schema too.

use std::str::FromStr;

use sqlx::migrate::Migrator;
use sqlx::postgres::PgConnectOptions;
use sqlx::ConnectOptions;

use walfold_config::quote_ident;

use crate::error::StoreError;
use crate::schema::Schema;

/// Every file in `migrations/`, found and embedded at build time.
pub(crate) fn embedded() -> Migrator {
    sqlx::migrate!("../../migrations")
}

/// sqlx's bookkeeping table, inside walfold's schema.
const BOOKKEEPING: &str = "{schema}._sqlx_migrations";

/// What the connected role may do about walfold's schema (`$1`).
const SCHEMA_ACCESS: &str = "select exists (select from pg_namespace where nspname = $1) as exists, \
     has_database_privilege(current_database(), 'create') as create_schema, \
     coalesce((select has_schema_privilege(oid, 'create') from pg_namespace where nspname = $1), false) \
       as create_in_schema, \
     current_user::text as role, current_database()::text as database";

/// The rights walfold's role has for its schema, as [`SCHEMA_ACCESS`] reads them.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SchemaAccess {
    pub exists: bool,
    /// `create` on the database: what creating the schema needs.
    pub create_schema: bool,
    /// `create` in the schema: what creating walfold's tables and functions there needs.
    pub create_in_schema: bool,
    pub role: String,
    pub database: String,
}

impl SchemaAccess {
    /// What the role lacks to create or upgrade `schema`, with the fix; `None` when it
    /// has what it needs. `walfold doctor` says the same.
    pub fn missing(&self, schema: &str) -> Option<String> {
        let (role, database) = (quote_ident(&self.role), quote_ident(&self.database));
        let quoted = quote_ident(schema);
        match (self.exists, self.create_schema, self.create_in_schema) {
            (true, _, true) | (false, true, _) => None,
            (true, _, false) => Some(format!(
                "role {role} may not create tables in schema {quoted}, which exists: alter \
                 schema {quoted} owner to {role} (or grant create on schema {quoted} to {role})"
            )),
            (false, false, _) => Some(format!(
                "schema {quoted} does not exist and role {role} may not create it (no create \
                 on database {database}): create schema {quoted} authorization {role} (or grant \
                 create on database {database} to {role})"
            )),
        }
    }
}

/// What `target`'s role may do about walfold's `schema` (`walfold doctor`).
pub async fn schema_access(
    target: &tokio_postgres::Client,
    schema: &str,
) -> Result<SchemaAccess, tokio_postgres::Error> {
    let row = target.query_one(SCHEMA_ACCESS, &[&schema]).await?;
    Ok(SchemaAccess {
        exists: row.try_get("exists")?,
        create_schema: row.try_get("create_schema")?,
        create_in_schema: row.try_get("create_in_schema")?,
        role: row.try_get("role")?,
        database: row.try_get("database")?,
    })
}

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
    // `create schema if not exists` needs `create` on the database even when the schema
    // exists, so a schema created for walfold's role (the least-privilege setup) is only
    // created when it is missing.
    let access: SchemaAccess = sqlx::query_as(SCHEMA_ACCESS)
        .bind(schema.name())
        .fetch_one(&mut conn)
        .await
        .map_err(|source| StoreError::MigrateConnect {
            schema: schema.name().to_owned(),
            source,
        })?;
    if let Some(missing) = access.missing(schema.name()) {
        return Err(StoreError::SchemaRights {
            schema: schema.name().to_owned(),
            missing,
        });
    }
    if !access.exists {
        migrator.create_schema(schema.quoted().to_owned());
    }
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

    #[test]
    fn a_schema_created_for_the_role_needs_no_create_on_the_database() {
        let access = |exists, create_schema, create_in_schema| super::SchemaAccess {
            exists,
            create_schema,
            create_in_schema,
            role: "writer".into(),
            database: "app".into(),
        };
        assert_eq!(access(true, false, true).missing("walfold"), None);
        assert_eq!(access(false, true, false).missing("walfold"), None);
        let missing = access(false, false, false).missing("walfold").unwrap();
        assert!(
            missing.contains(r#"create schema "walfold" authorization "writer""#),
            "{missing}"
        );
        let missing = access(true, true, false).missing("walfold").unwrap();
        assert!(
            missing.contains(r#"alter schema "walfold" owner to "writer""#),
            "{missing}"
        );
    }

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

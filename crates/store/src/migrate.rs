//! walfold's schema, from the embedded migrations in `migrations/`, applied over a
//! walfold connection (so its URL rules and TLS verification are those of every other
//! connection), in sqlx's format: the same checksums, the same bookkeeping table inside
//! the configured schema, the same lock. A schema migrated by sqlx's runner validates
//! here, and the other way round.

use std::collections::HashMap;
use std::time::Instant;

use sqlx::migrate::Migrator;
use tokio_postgres::Client;

use walfold_config::quote_ident;

use crate::error::StoreError;
use crate::schema::Schema;
use walfold_pg::connect;
use walfold_pg::RowExt;

/// Every file in `migrations/`, found and embedded at build time.
pub(crate) fn embedded() -> Migrator {
    sqlx::migrate!("../../migrations")
}

/// sqlx's bookkeeping table, inside walfold's schema.
const BOOKKEEPING: &str = "create table if not exists {schema}._sqlx_migrations (
    version bigint primary key,
    description text not null,
    installed_on timestamptz not null default now(),
    success boolean not null,
    checksum bytea not null,
    execution_time bigint not null)";

const APPLIED: &str = "select version, checksum, success from {schema}._sqlx_migrations";

const RECORD: &str = "insert into {schema}._sqlx_migrations \
    (version, description, success, checksum, execution_time) values ($1, $2, true, $3, $4)";

/// What the connected role may do about walfold's schema (`$1`).
const SCHEMA_ACCESS: &str = "select exists (select from pg_namespace where nspname = $1) as exists, \
     has_database_privilege(current_database(), 'create') as create_schema, \
     coalesce((select has_schema_privilege(oid, 'create') from pg_namespace where nspname = $1), false) \
       as create_in_schema, \
     current_user::text as role, current_database()::text as database";

/// The rights walfold's role has for its schema, as [`SCHEMA_ACCESS`] reads them.
#[derive(Debug, Clone)]
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

/// What `client`'s role may do about walfold's `schema` (the migration, `walfold doctor`).
pub async fn schema_access(client: &Client, schema: &str) -> Result<SchemaAccess, StoreError> {
    let row = client
        .query_one(SCHEMA_ACCESS, &[&schema])
        .await
        .map_err(|source| StoreError::Db {
            context: "reading the rights on walfold's schema".into(),
            source,
        })?;
    let row = row.of("pg_namespace");
    Ok(SchemaAccess {
        exists: row.col("exists")?,
        create_schema: row.col("create_schema")?,
        create_in_schema: row.col("create_in_schema")?,
        role: row.col("role")?,
        database: row.col("database")?,
    })
}

/// Whether walfold's bookkeeping table exists (`$1`: its name as `to_regclass` reads it).
const HAS_BOOKKEEPING: &str = "select to_regclass($1) is not null as exists";

/// The newest migration applied to walfold's schema.
const NEWEST_APPLIED: &str =
    "select max(version) as newest from {schema}._sqlx_migrations where success";

/// Whether `schema` holds every migration of this build (or more: a newer release's):
/// until then its tables are missing or incomplete, and what reads them (a scrape, a
/// readiness check) has nothing to read yet rather than something wrong to report.
pub async fn schema_current(client: &Client, schema: &Schema) -> Result<bool, StoreError> {
    let db = || StoreError::db("reading which migrations walfold's schema holds");
    let table = format!("{}._sqlx_migrations", schema.quoted());
    let exists: bool = client
        .query_one(HAS_BOOKKEEPING, &[&table])
        .await
        .map_err(db())?
        .of("pg_class")
        .col("exists")?;
    if !exists {
        return Ok(false);
    }
    let newest: Option<i64> = client
        .query_one(&schema.sql(NEWEST_APPLIED), &[])
        .await
        .map_err(db())?
        .of("_sqlx_migrations")
        .col("newest")?;
    let ours = embedded().iter().map(|m| m.version).max().unwrap_or(0);
    Ok(newest.is_some_and(|n| n >= ours))
}

/// Creates or upgrades walfold's schema; idempotent and safe to run concurrently. Refuses
/// a URL behind a pooler that shares server sessions: the migration is the first thing
/// walfold does on every target, and nothing after it works there (see `pooler`).
pub async fn migrate(url: &str, schema: &Schema) -> Result<(), StoreError> {
    walfold_pg::refuse_pooling(url, "the target URL").await?;
    let mut client = connect(url).await?;
    let db = |source| StoreError::Migrate {
        schema: schema.name().to_owned(),
        version: None,
        source,
    };
    // Quoted, so a mixed-case schema is not folded to lower case.
    client
        .batch_execute(&format!(
            "set application_name = 'walfold-migrate'; set search_path = {}; \
             set lock_timeout = '{}s'",
            schema.quoted(),
            LOCK_TIMEOUT.as_secs()
        ))
        .await
        .map_err(db)?;
    let database: String = client
        .query_one("select current_database()", &[])
        .await
        .map_err(db)?
        .of("pg_database")
        .col(0)?;
    // One migrator per database at a time: sqlx's lock, so walfold builds that migrated
    // with sqlx's runner wait for this one and the other way round.
    let lock = lock_id(&database);
    client
        .execute("select pg_advisory_lock($1)", &[&lock])
        .await
        .map_err(db)?;
    let result = match apply(&mut client, schema).await {
        Err(StoreError::Migrate {
            schema: name,
            version,
            source,
        }) if walfold_event::is_lock_not_available(walfold_pg::sqlstate(&source)) => {
            let blockers = blockers(&client, schema).await;
            Err(StoreError::MigrationBlocked {
                schema: name,
                version,
                waited: LOCK_TIMEOUT,
                blockers,
            })
        }
        other => other,
    };
    // On an error the session ends, and the lock with it.
    if result.is_ok() {
        client
            .execute("select pg_advisory_unlock($1)", &[&lock])
            .await
            .map_err(db)?;
    }
    result
}

/// How long a migration waits for a lock on a table before it gives up (a migration
/// that sets its own, such as the claims one, keeps it). Waiting longer would hold the
/// lock queue: every session that needs the table after the migration waits too.
const LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The other sessions holding locks on walfold's tables (`$1`: its schema), as an
/// operator would look them up.
const BLOCKERS: &str = "select a.pid, coalesce(a.usename::text, '?') as usename, \
       coalesce(a.application_name, '') as application_name, coalesce(a.state, '') as state, \
       coalesce(extract(epoch from now() - a.xact_start)::int8, 0) as xact_age_s, \
       left(coalesce(a.query, ''), 120) as query \
     from pg_stat_activity a where a.pid <> pg_backend_pid() and a.pid in ( \
       select l.pid from pg_locks l join pg_class c on c.oid = l.relation \
       join pg_namespace n on n.oid = c.relnamespace where n.nspname = $1 and l.granted) \
     order by a.xact_start nulls last limit 5";

/// Who holds locks on walfold's tables, for the error of a migration that timed out
/// waiting for one; what could not be read is said as such.
async fn blockers(client: &Client, schema: &Schema) -> String {
    let rows = match client.query(BLOCKERS, &[&schema.name()]).await {
        Ok(rows) => rows,
        Err(e) => return format!("(cannot list them: {})", walfold_pg::describe(&e)),
    };
    let mut found = Vec::new();
    for row in &rows {
        if let Ok(line) = crate::lock_wait::session(row) {
            found.push(line);
        }
    }
    if found.is_empty() {
        "(none holds one now)".into()
    } else {
        found.join("; ")
    }
}

async fn apply(client: &mut Client, schema: &Schema) -> Result<(), StoreError> {
    let db = |source| StoreError::Migrate {
        schema: schema.name().to_owned(),
        version: None,
        source,
    };
    let history = |reason: String| StoreError::MigrationHistory {
        schema: schema.name().to_owned(),
        reason,
    };
    // `create schema if not exists` needs `create` on the database even when the schema
    // exists, so a schema created for walfold's role (the least-privilege setup) is only
    // created when it is missing.
    let access = schema_access(client, schema.name()).await?;
    if let Some(missing) = access.missing(schema.name()) {
        return Err(StoreError::SchemaRights {
            schema: schema.name().to_owned(),
            missing,
        });
    }
    if !access.exists {
        client
            .batch_execute(&format!("create schema if not exists {}", schema.quoted()))
            .await
            .map_err(db)?;
    }
    client
        .batch_execute(&schema.sql(BOOKKEEPING))
        .await
        .map_err(db)?;
    let mut applied: HashMap<i64, Vec<u8>> = HashMap::new();
    for row in client.query(&schema.sql(APPLIED), &[]).await.map_err(db)? {
        let row = row.of("_sqlx_migrations");
        let version: i64 = row.col("version")?;
        if !row.col::<bool>("success")? {
            return Err(history(format!(
                "migration {version} failed part-way; repair the schema by hand, then delete its row from _sqlx_migrations"
            )));
        }
        applied.insert(version, row.col("checksum")?);
    }
    let migrator = embedded();
    if let Some(unknown) = applied
        .keys()
        .filter(|v| !migrator.version_exists(**v))
        .min()
    {
        return Err(history(format!(
            "migration {unknown} was applied by a newer walfold: run that version (or newer)"
        )));
    }
    for m in migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
    {
        match applied.get(&m.version) {
            Some(checksum) if checksum.as_slice() != &*m.checksum => {
                return Err(history(format!(
                    "migration {} differs from the one applied to this schema",
                    m.version
                )))
            }
            Some(_) => continue,
            None => {}
        }
        let db = |source| StoreError::Migrate {
            schema: schema.name().to_owned(),
            version: Some(m.version),
            source,
        };
        let record = schema.sql(RECORD);
        let description = m.description.to_string();
        let checksum = m.checksum.to_vec();
        let start = Instant::now();
        let elapsed = || start.elapsed().as_nanos() as i64;
        if m.no_tx {
            client.batch_execute(m.sql.as_str()).await.map_err(db)?;
            client
                .execute(&record, &[&m.version, &description, &checksum, &elapsed()])
                .await
                .map_err(db)?;
        } else {
            let tx = client.transaction().await.map_err(db)?;
            tx.batch_execute(m.sql.as_str()).await.map_err(db)?;
            tx.execute(&record, &[&m.version, &description, &checksum, &elapsed()])
                .await
                .map_err(db)?;
            tx.commit().await.map_err(db)?;
        }
    }
    Ok(())
}

/// sqlx's advisory lock key for migrating `database`.
fn lock_id(database: &str) -> i64 {
    const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
    0x3d32_ad9e * i64::from(CRC.checksum(database.as_bytes()))
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
    /// The values the last migration with a `check (<column> in ('a', 'b', …))` allows.
    pub(crate) fn checked_values(column: &str) -> Vec<String> {
        last_list(&format!("check ({column} in ("))
    }

    /// The values the last migration that adds check constraint `name` allows.
    pub(crate) fn constraint_values(name: &str) -> Vec<String> {
        last_list(&format!("add constraint {name}"))
    }

    /// The sorted values of the first `in (…)` list after the last migration's `needle`.
    fn last_list(needle: &str) -> Vec<String> {
        let migrations = super::embedded();
        let last = migrations
            .iter()
            .filter_map(|m| {
                let sql = m.sql.as_str();
                sql.rfind(needle).map(|at| sql[at..].to_owned())
            })
            .next_back()
            .unwrap_or_else(|| panic!("no migration has {needle}"));
        let list = &last[last.find(" in (").expect("a list of values") + 5..];
        let list = &list[..list.find(')').expect("the list closes")];
        let mut values: Vec<String> = list
            .split(',')
            .map(|v| v.trim().trim_matches('\'').to_owned())
            .collect();
        values.sort();
        values
    }
}

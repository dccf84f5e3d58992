//! A target as `walfold doctor` reads it from its catalog: the connections the server
//! allows and who uses them, the roles that may write walfold's schema, the rights on
//! each projection's table (to write it, to rebuild it), the WAL settings and the
//! checkpoints since their statistics were reset. Doctor decides from it.

use tokio_postgres::Client;
use walfold_config::{quote_ident, QualifiedName};

use crate::error::StoreError;
use walfold_pg::RowExt;

/// The connections the server allows, and those in use (by walfold's processes apart).
const CONNECTIONS: &str = "select current_setting('max_connections')::int8 as max, \
     current_setting('superuser_reserved_connections')::int8 as reserved, \
     (select count(*) from pg_stat_activity where backend_type = 'client backend') as used, \
     (select count(*) from pg_stat_activity where backend_type = 'client backend' \
       and application_name like 'walfold%') as walfold";

/// The login roles other than the connected one and superusers that may write a table
/// of schema `$1` (quoted).
const SCHEMA_WRITERS: &str = "select distinct r.rolname::text from pg_roles r, pg_class c \
     where c.relnamespace = $1::text::regnamespace and c.relkind in ('r', 'p') \
     and r.rolcanlogin and not r.rolsuper and r.rolname <> current_user \
     and has_table_privilege(r.oid, c.oid, 'insert, update, delete, truncate') \
     order by 1";

/// Whether table `$1` (quoted) exists and the connected role may read, insert and update it.
const WRITABLE: &str = "select to_regclass($1) is not null and has_table_privilege($1, 'select') \
     and has_table_privilege($1, 'insert') and has_table_privilege($1, 'update')";

/// What a rebuild of table `$1` (quoted) needs: `create` in its schema, to own it (or be
/// in its owner's role), and `references` on the tables its foreign keys point at (those
/// lacking it, listed).
const REBUILD: &str = "select has_schema_privilege(c.relnamespace, 'create') as create, \
     pg_has_role(c.relowner, 'usage') as owns, \
     array(select k.confrelid::regclass::text from pg_constraint k \
           where k.conrelid = c.oid and k.contype = 'f' \
             and not has_table_privilege(k.confrelid, 'references')) as unreferenced \
     from pg_class c where c.oid = $1::text::regclass";

/// The WAL settings as `show` writes them, and checkpoint_timeout in seconds.
const WAL: &str = "select current_setting('full_page_writes') as full_page_writes, \
     current_setting('wal_compression') as wal_compression, \
     current_setting('max_wal_size') as max_wal_size, \
     current_setting('checkpoint_timeout') as checkpoint_timeout, \
     (select setting from pg_settings where name = 'checkpoint_timeout') as timeout_s";

/// Checkpoints since their statistics were reset (PostgreSQL 17+).
const CHECKPOINTER: &str = "select num_timed, num_requested, \
     extract(epoch from now() - stats_reset)::float8 from pg_stat_checkpointer";

/// [`CHECKPOINTER`] before PostgreSQL 17.
const BGWRITER: &str = "select checkpoints_timed, checkpoints_req, \
     extract(epoch from now() - stats_reset)::float8 from pg_stat_bgwriter";

/// WAL bytes per second since pg_stat_wal was reset (PostgreSQL 14+).
const WAL_RATE: &str =
    "select wal_bytes::float8 / nullif(extract(epoch from now() - stats_reset)::float8, 0) \
     from pg_stat_wal";

/// The server's connections.
#[derive(Debug, Clone, Copy)]
pub struct Connections {
    pub max: i64,
    pub reserved: i64,
    pub used: i64,
    /// Those of walfold's processes (by application name).
    pub walfold: i64,
}

/// What the connected role may do to a projection's table.
#[derive(Debug, Clone)]
pub struct TableAccess {
    /// It exists and may be read, inserted into and updated.
    pub writable: bool,
    /// What a rebuild needs (read when writable).
    pub rebuild: Option<RebuildAccess>,
}

/// What a rebuild needs of a table: it creates the shadow table beside it (with its
/// foreign keys) and swaps them by renaming.
#[derive(Debug, Clone)]
pub struct RebuildAccess {
    pub create: bool,
    pub owns: bool,
    /// The tables its foreign keys point at without `references`.
    pub unreferenced: Vec<String>,
}

/// The target's WAL settings.
#[derive(Debug, Clone)]
pub struct WalSettings {
    pub full_page_writes: String,
    pub wal_compression: String,
    pub max_wal_size: String,
    pub checkpoint_timeout: String,
    /// `checkpoint_timeout` in seconds.
    pub checkpoint_timeout_s: f64,
}

/// Checkpoint counts since their reset.
#[derive(Debug, Clone, Copy)]
pub struct Checkpoints {
    pub timed: i64,
    pub requested: i64,
    /// Since the statistics were reset.
    pub seconds: f64,
    /// WAL written since pg_stat_wal was reset (PostgreSQL 14+), scaled to `seconds`.
    pub wal_bytes: Option<f64>,
}

/// The server's connections now.
pub async fn connections(client: &Client) -> Result<Connections, StoreError> {
    let row = client
        .query_one(CONNECTIONS, &[])
        .await
        .map_err(StoreError::db("reading the connections"))?;
    let r = row.of("pg_stat_activity");
    Ok(Connections {
        max: r.col("max")?,
        reserved: r.col("reserved")?,
        used: r.col("used")?,
        walfold: r.col("walfold")?,
    })
}

/// How many instances of the deployment whose schema is `schema` heartbeat now (on the
/// main target); `None` before its first start (no `instance` table yet).
pub async fn running_instances(client: &Client, schema: &str) -> Result<Option<i64>, StoreError> {
    let table = format!("{}.instance", walfold_config::quote_ident(schema));
    let exists: bool = client
        .query_one("select to_regclass($1) is not null", &[&table])
        .await
        .map_err(StoreError::db("looking for the instances"))?
        .of("pg_class")
        .col(0)?;
    if !exists {
        return Ok(None);
    }
    let count: i64 = client
        .query_one(
            &format!(
                "select count(*) from {table} where heartbeat_at > now() - interval '1 minute'"
            ),
            &[],
        )
        .await
        .map_err(StoreError::db("counting the instances"))?
        .of("instance")
        .col(0)?;
    Ok(Some(count))
}

/// The roles other than the connected one (and superusers) that may write a table of
/// `schema`.
pub async fn schema_writers(client: &Client, schema: &str) -> Result<Vec<String>, StoreError> {
    client
        .query(SCHEMA_WRITERS, &[&quote_ident(schema)])
        .await
        .map_err(StoreError::db("reading who may write walfold's schema"))?
        .iter()
        .map(|row| Ok(row.of("pg_roles").col(0)?))
        .collect()
}

/// What the connected role may do to `table`. A table it cannot even look up (its
/// schema not usable) is not writable.
pub async fn table_access(
    client: &Client,
    table: &QualifiedName,
) -> Result<TableAccess, StoreError> {
    let quoted = table.quoted();
    let writable = client
        .query_one(WRITABLE, &[&quoted])
        .await
        .is_ok_and(|r| r.of("pg_class").col::<bool>(0).unwrap_or(false));
    if !writable {
        return Ok(TableAccess {
            writable,
            rebuild: None,
        });
    }
    let row = client
        .query_one(REBUILD, &[&quoted])
        .await
        .map_err(StoreError::db("reading the rights a rebuild needs"))?;
    let r = row.of("pg_class");
    Ok(TableAccess {
        writable,
        rebuild: Some(RebuildAccess {
            create: r.col("create")?,
            owns: r.col("owns")?,
            unreferenced: r.col("unreferenced")?,
        }),
    })
}

/// The server's WAL settings.
pub async fn wal_settings(client: &Client) -> Result<WalSettings, StoreError> {
    let row = client
        .query_one(WAL, &[])
        .await
        .map_err(StoreError::db("reading the WAL settings"))?;
    let r = row.of("pg_settings");
    let timeout_s: String = r.col("timeout_s")?;
    Ok(WalSettings {
        full_page_writes: r.col("full_page_writes")?,
        wal_compression: r.col("wal_compression")?,
        max_wal_size: r.col("max_wal_size")?,
        checkpoint_timeout: r.col("checkpoint_timeout")?,
        checkpoint_timeout_s: timeout_s.parse().unwrap_or(f64::NAN),
    })
}

/// Checkpoint counts since their reset: `pg_stat_checkpointer` (PostgreSQL 17+) or
/// `pg_stat_bgwriter`. `None` when neither answers.
pub async fn checkpoints(c: &Client) -> Option<Checkpoints> {
    let row = match c.query_one(CHECKPOINTER, &[]).await {
        Ok(row) => row,
        Err(_) => c.query_one(BGWRITER, &[]).await.ok()?,
    };
    let row = row.of("pg_stat_bgwriter");
    let seconds: f64 = row.col::<Option<f64>>(2).ok()??;
    // The WAL rate over pg_stat_wal's own period, applied to the checkpoints' period.
    let wal_bytes = c
        .query_one(WAL_RATE, &[])
        .await
        .ok()
        .and_then(|r| r.of("pg_stat_wal").col::<Option<f64>>(0).ok().flatten())
        .map(|per_s| per_s * seconds);
    Some(Checkpoints {
        timed: row.col(0).ok()?,
        requested: row.col(1).ok()?,
        seconds,
        wal_bytes,
    })
}

//! The configured replication slot as `pg_replication_slots` shows it, and the few
//! statements that create, drop or look for one.

use tokio_postgres::{Client, Row};
use walfold_pg::{FromRow, RowExt};
use walfold_store::StoreError;

/// Slot `$1`, of any database.
const SLOT: &str = "select plugin, database = current_database() as same_database, active, \
     wal_status, confirmed_flush_lsn::text as confirmed_flush_lsn, \
     null::bool as failover, null::bool as synced \
     from pg_replication_slots where slot_name = $1";

/// [`SLOT`] with PostgreSQL 17's failover slots.
const SLOT_17: &str = "select plugin, database = current_database() as same_database, active, \
     wal_status, confirmed_flush_lsn::text as confirmed_flush_lsn, failover, synced \
     from pg_replication_slots where slot_name = $1";

/// The WAL slot `$1` keeps, in bytes (a primary's position; a standby has none).
const RETAINED: &str = "select (pg_current_wal_lsn() - restart_lsn)::int8 as retained \
     from pg_replication_slots where slot_name = $1";

/// Whether slot `$1` exists in this database.
const EXISTS: &str = "select exists (select from pg_replication_slots \
     where slot_name = $1 and database = current_database())";

/// A replication slot.
#[derive(Debug, Clone)]
pub struct Slot {
    pub plugin: Option<String>,
    /// Whether it is a slot of this database.
    pub same_database: Option<bool>,
    pub active: bool,
    pub wal_status: Option<String>,
    /// As PostgreSQL writes a `pg_lsn`.
    pub confirmed: Option<String>,
    /// A failover slot (PostgreSQL 17; `None` before).
    pub failover: Option<bool>,
    /// A synced copy on a standby (PostgreSQL 17; `None` before).
    pub synced: Option<bool>,
}

impl FromRow for Slot {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("pg_replication_slots");
        Ok(Slot {
            plugin: r.col("plugin")?,
            same_database: r.col("same_database")?,
            active: r.col("active")?,
            wal_status: r.col("wal_status")?,
            confirmed: r.col("confirmed_flush_lsn")?,
            failover: r.col("failover")?,
            synced: r.col("synced")?,
        })
    }
}

impl Slot {
    /// Slot `name` on a server of `version` (`server_version_num`); `None`: none.
    pub(crate) async fn read(
        client: &Client,
        name: &str,
        version: i32,
    ) -> Result<Option<Slot>, StoreError> {
        let sql = if version >= 170_000 { SLOT_17 } else { SLOT };
        client
            .query_opt(sql, &[&name])
            .await
            .map_err(StoreError::db("reading the slot"))?
            .map(|row| Slot::from_row(&row))
            .transpose()
            .map_err(StoreError::from)
    }
}

/// The WAL slot `name` keeps, in bytes.
pub(crate) async fn retained(client: &Client, name: &str) -> Result<Option<i64>, StoreError> {
    Ok(client
        .query_opt(RETAINED, &[&name])
        .await
        .map_err(StoreError::db("reading the slot's WAL"))?
        .map(|row| row.of("pg_replication_slots").col("retained"))
        .transpose()?
        .flatten())
}

/// Whether slot `name` exists in this database.
pub(crate) async fn exists(client: &Client, name: &str) -> Result<bool, StoreError> {
    Ok(client
        .query_one(EXISTS, &[&name])
        .await
        .map_err(StoreError::db("reading the slot"))?
        .of("pg_replication_slots")
        .col(0)?)
}

/// Creates slot `name` (a failover slot where `version` has them); its start, as
/// PostgreSQL writes a `pg_lsn`.
pub(crate) async fn create(
    client: &Client,
    name: &str,
    version: i32,
) -> Result<String, StoreError> {
    Ok(client
        .query_one(crate::ha::create_slot_sql(version), &[&name])
        .await
        .map_err(StoreError::db("creating the replication slot"))?
        .of("pg_create_logical_replication_slot")
        .col(0)?)
}

/// Drops slot `name`.
pub(crate) async fn drop(client: &Client, name: &str) -> Result<(), StoreError> {
    client
        .execute("select pg_drop_replication_slot($1)", &[&name])
        .await
        .map_err(StoreError::db("dropping the invalidated slot"))?;
    Ok(())
}

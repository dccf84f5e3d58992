//! The source server as its settings and catalog say: `wal_level`, the slots and WAL
//! senders it allows and uses, what a slot may keep, the version; the role walfold
//! connects as; what a host of a several-host URL is; which database this is.

use tokio_postgres::Client;
use walfold_pg::RowExt;
use walfold_store::StoreError;

/// The settings and counts `walfold doctor` reports (a setting the version lacks is
/// empty).
const SETTINGS: &str = "select current_setting('wal_level') as wal_level, \
     current_setting('server_version_num')::int as version, \
     current_setting('max_replication_slots')::int as max_slots, \
     (select count(*) from pg_replication_slots)::int as slots, \
     current_setting('max_wal_senders')::int as max_senders, \
     (select count(*) from pg_stat_replication)::int as senders, \
     current_setting('max_slot_wal_keep_size') as slot_wal_keep_size, \
     coalesce(current_setting('synchronized_standby_slots', true), '') as standby_slots, \
     coalesce(current_setting('sync_replication_slots', true), '') as sync_slots, \
     (select count(*) from pg_replication_slots where slot_type = 'physical')::int \
       as physical_slots, \
     (select count(*) from pg_stat_activity where backend_type = 'walsender' \
       and datid is null)::int as physical_senders";

/// The connected role: whether it may replicate (the attribute, a superuser, or RDS's
/// `rds_replication`), and create on the database (a publication).
const ROLE: &str = "select rolreplication or rolsuper or exists (select 1 from pg_roles m \
     where m.rolname = 'rds_replication' and pg_has_role(current_user, m.oid, 'member')) \
     as replication, current_user::text as role, \
     has_database_privilege(current_database(), 'create') as create \
     from pg_roles where rolname = current_user";

/// A server of the source's URL: primary or standby, and what a standby needs to keep a
/// copy of slot `$1`.
const HOST: &str = "select pg_is_in_recovery() as standby, \
     current_setting('server_version_num')::int as version, \
     current_setting('hot_standby_feedback') as feedback, \
     current_setting('primary_slot_name') as primary_slot, \
     coalesce(current_setting('sync_replication_slots', true), '') as sync_slots, \
     exists (select from pg_replication_slots where slot_name = $1) as has_slot";

/// The database's name and oid, the server's start time and port.
const IDENTITY: &str = "select current_database() || '/' || d.oid::text || '/' || \
     pg_postmaster_start_time()::text || '/' || current_setting('port') as identity \
     from pg_database d where d.datname = current_database()";

/// The source server's settings.
#[derive(Debug, Clone)]
pub struct Server {
    pub wal_level: String,
    /// `server_version_num`.
    pub version: i32,
    pub max_replication_slots: i32,
    /// Slots that exist, of any database.
    pub replication_slots: i32,
    pub max_wal_senders: i32,
    /// WAL senders streaming now.
    pub wal_senders: i32,
    pub max_slot_wal_keep_size: String,
    /// PostgreSQL 17's: the standbys a failover slot waits for (empty before 17).
    pub synchronized_standby_slots: String,
    pub sync_replication_slots: String,
    /// Physical replication slots on this server (a standby's, a backup's).
    pub physical_slots: i32,
    /// WAL senders streaming physically now (a standby without a slot, a base backup).
    pub physical_senders: i32,
}

/// The role walfold connects to the source as.
#[derive(Debug, Clone)]
pub struct Role {
    pub name: String,
    pub replication: bool,
    /// `create` on the database: what creating a publication needs.
    pub create_on_database: bool,
}

/// One server of a several-host URL.
#[derive(Debug, Clone)]
pub struct Host {
    pub standby: bool,
    pub version: i32,
    pub hot_standby_feedback: String,
    pub primary_slot_name: String,
    pub sync_replication_slots: String,
    /// It has a slot of the configured name (a synced copy, a manager's permanent slot).
    pub has_slot: bool,
}

impl Server {
    pub(crate) async fn read(client: &Client) -> Result<Server, StoreError> {
        let row = client
            .query_one(SETTINGS, &[])
            .await
            .map_err(StoreError::db("reading the source's settings"))?;
        let r = row.of("pg_settings");
        Ok(Server {
            wal_level: r.col("wal_level")?,
            version: r.col("version")?,
            max_replication_slots: r.col("max_slots")?,
            replication_slots: r.col("slots")?,
            max_wal_senders: r.col("max_senders")?,
            wal_senders: r.col("senders")?,
            max_slot_wal_keep_size: r.col("slot_wal_keep_size")?,
            synchronized_standby_slots: r.col("standby_slots")?,
            sync_replication_slots: r.col("sync_slots")?,
            physical_slots: r.col("physical_slots")?,
            physical_senders: r.col("physical_senders")?,
        })
    }
}

impl Role {
    pub(crate) async fn read(client: &Client) -> Result<Role, StoreError> {
        let row = client
            .query_one(ROLE, &[])
            .await
            .map_err(StoreError::db("reading the source role"))?;
        let r = row.of("pg_roles");
        Ok(Role {
            name: r.col("role")?,
            replication: r.col("replication")?,
            create_on_database: r.col("create")?,
        })
    }
}

/// What the server `client` reaches is, for slot `slot`.
pub async fn host(client: &Client, slot: &str) -> Result<Host, StoreError> {
    let row = client
        .query_one(HOST, &[&slot])
        .await
        .map_err(StoreError::db("reading what the host is"))?;
    let r = row.of("pg_settings");
    Ok(Host {
        standby: r.col("standby")?,
        version: r.col("version")?,
        hot_standby_feedback: r.col("feedback")?,
        primary_slot_name: r.col("primary_slot")?,
        sync_replication_slots: r.col("sync_slots")?,
        has_slot: r.col("has_slot")?,
    })
}

/// The source's `wal_level`.
pub(crate) async fn wal_level(client: &Client) -> Result<String, StoreError> {
    Ok(client
        .query_one("select current_setting('wal_level')", &[])
        .await
        .map_err(StoreError::db("reading wal_level"))?
        .of("pg_settings")
        .col(0)?)
}

/// The source's `server_version_num`.
pub(crate) async fn server_version(client: &Client) -> Result<i32, StoreError> {
    Ok(client
        .query_one("select current_setting('server_version_num')::int", &[])
        .await
        .map_err(StoreError::db("reading server_version_num"))?
        .of("pg_settings")
        .col(0)?)
}

/// What identifies the database `client` is connected to, whatever URL reached it: its
/// name and oid, the server's start time and port. Two sources with the same identity
/// would read one outbox twice.
pub async fn database_identity(client: &Client) -> Result<String, StoreError> {
    Ok(client
        .query_one(IDENTITY, &[])
        .await
        .map_err(StoreError::db("reading the database's identity"))?
        .of("pg_database")
        .col("identity")?)
}

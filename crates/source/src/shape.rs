//! The source as walfold's commands read it from its catalog: the server's settings
//! and the role walfold connects as, the slot, the publication, each table outbox's
//! relation and columns, and the grants on them. Read once per use, then decided on
//! elsewhere: what `walfold run` refuses (`verdict`), `walfold doctor`'s checks,
//! `walfold init`'s mapping. Nothing here decides.
//!
//! `walfold run` reads [`Outboxes`] at start and again every few seconds while it runs
//! (so that part stays small); `walfold doctor` reads the whole [`SourceShape`].

mod grants;
mod publication;
mod server;
mod slot;
mod tables;

use tokio_postgres::Client;
use walfold_config::SourceView;
use walfold_store::StoreError;

pub use grants::{EmitRights, TableRights};
pub(crate) use publication::{
    add_tables, create as create_publication_now, named as publication_named, publishing_outboxes,
    seen_by_slot, signature as publication_signature, PUBLISH,
};
pub use publication::{create_publication, publications, Member, Publication};
pub use server::{database_identity, host, Host, Role, Server};
pub(crate) use server::{server_version, wal_level};
pub use slot::Slot;
pub(crate) use slot::{
    create as create_slot, drop as drop_slot, exists as slot_exists, retained as retained_wal,
};
pub use tables::{
    column_pairs, column_values, model_table, row_estimate, tables, Column, ModelTable,
    OutboxTable, Relation, Table,
};

/// The configured outboxes and publication as the catalog has them: what `walfold run`
/// checks before it streams, and while it streams.
#[derive(Debug, Clone)]
pub struct Outboxes {
    /// The server's `server_version_num`.
    pub version: i32,
    /// Each table outbox, in config order.
    pub tables: Vec<OutboxTable>,
    /// `source.publication`; `None`: it does not exist.
    pub publication: Option<Publication>,
}

impl Outboxes {
    pub async fn read(client: &Client, config: &SourceView<'_>) -> Result<Outboxes, StoreError> {
        let version = server_version(client).await?;
        let tables = tables::outbox_tables(client, config).await?;
        let publication = Publication::read(client, &config.source().publication, version).await?;
        Ok(Outboxes {
            version,
            tables,
            publication,
        })
    }
}

/// Everything `walfold doctor` checks on a source.
#[derive(Debug, Clone)]
pub struct SourceShape {
    pub server: Server,
    pub role: Role,
    /// `source.slot`; `None`: it does not exist.
    pub slot: Option<Slot>,
    /// The WAL the slot keeps, in bytes.
    pub retained: Option<i64>,
    pub outboxes: Outboxes,
    /// Each table outbox that exists, in config order.
    pub rights: Vec<TableRights>,
    pub emit: EmitRights,
}

impl SourceShape {
    pub async fn read(client: &Client, config: &SourceView<'_>) -> Result<SourceShape, StoreError> {
        let server = Server::read(client).await?;
        let role = Role::read(client).await?;
        let name = &config.source().slot;
        let slot = Slot::read(client, name, server.version).await?;
        let retained = match slot {
            Some(_) => retained_wal(client, name).await?,
            None => None,
        };
        let outboxes = Outboxes::read(client, config).await?;
        let mut rights = Vec::new();
        for (_, table) in config.table_outboxes() {
            rights.extend(TableRights::read(client, &table).await?);
        }
        Ok(SourceShape {
            server,
            role,
            slot,
            retained,
            outboxes,
            rights,
            emit: EmitRights::read(client).await?,
        })
    }
}

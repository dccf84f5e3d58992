//! What the source's grants let roles do to the outboxes: per table outbox, whether the
//! source role may read it and owns it, its replica identity, and who may write its
//! events (see `writers`); for message outboxes and heartbeats, who may execute
//! `pg_logical_emit_message`.

use tokio_postgres::Client;
use walfold_config::QualifiedName;
use walfold_pg::RowExt;
use walfold_store::StoreError;

use crate::writers::{definers, emitters, inserters, Definer, Writers};

/// Whether relation `$1` (quoted) exists.
const TABLE: &str = "select to_regclass($1) is not null as exists";

/// Whether the connected role may read relation `$1` (quoted) and owns it (or is in its
/// owner's role), and its replica identity.
const RIGHTS: &str = "select has_table_privilege($1, 'select') as select, \
     (select pg_has_role(c.relowner, 'usage') from pg_class c where c.oid = to_regclass($1)) as owned, \
     (select relreplident::text from pg_class where oid = $1::text::regclass) as identity";

/// The overloads of `pg_logical_emit_message` that take a text payload (heartbeats'),
/// as `pg_logical_emit_message(boolean, text, text)`, and whether the connected role may
/// execute each.
const HEARTBEAT_FUNCTIONS: &str =
    "select 'pg_logical_emit_message(' || oidvectortypes(p.proargtypes) || ')', \
     has_function_privilege(p.oid, 'execute') from pg_proc p \
     where p.proname = 'pg_logical_emit_message' \
     and p.pronamespace = 'pg_catalog'::regnamespace \
     and p.proargtypes[2] = 'text'::regtype order by p.oid";

/// A table outbox that exists, and its grants.
#[derive(Debug, Clone)]
pub struct TableRights {
    pub table: QualifiedName,
    /// The source role may read it (what `walfold backfill` needs).
    pub select: bool,
    /// The source role owns it (or is in its owner's role): it may publish it.
    pub owned: bool,
    /// `relreplident`: `d`, `n`, `f` or `i`.
    pub replica_identity: String,
    /// Who may insert into it (through a partition or a view too).
    pub writers: Writers,
    /// Security-definer functions that may insert into it for their callers.
    pub definers: Vec<Definer>,
}

/// Who may execute `pg_logical_emit_message`.
#[derive(Debug, Clone)]
pub struct EmitRights {
    /// Who may write a message outbox's events.
    pub emitters: Writers,
    /// The overloads heartbeats call, and whether the source role may execute each.
    pub heartbeat: Vec<(String, bool)>,
}

impl TableRights {
    /// `table`'s rights; `None`: no relation of that name.
    pub(crate) async fn read(
        client: &Client,
        table: &QualifiedName,
    ) -> Result<Option<TableRights>, StoreError> {
        let quoted = table.quoted();
        let db = || StoreError::db("reading the outbox's grants");
        let exists: bool = client
            .query_one(TABLE, &[&quoted])
            .await
            .map_err(db())?
            .of("pg_class")
            .col("exists")?;
        if !exists {
            return Ok(None);
        }
        let row = client.query_one(RIGHTS, &[&quoted]).await.map_err(db())?;
        let r = row.of("pg_class");
        Ok(Some(TableRights {
            table: table.clone(),
            select: r.col("select")?,
            owned: r.col::<Option<bool>>("owned")?.unwrap_or(true),
            replica_identity: r.col("identity")?,
            writers: inserters(client, &quoted).await?,
            definers: definers(client, &quoted).await?,
        }))
    }
}

impl EmitRights {
    pub(crate) async fn read(client: &Client) -> Result<EmitRights, StoreError> {
        let heartbeat = client
            .query(HEARTBEAT_FUNCTIONS, &[])
            .await
            .map_err(StoreError::db("reading pg_logical_emit_message's grants"))?
            .iter()
            .map(|row| {
                let r = row.of("pg_proc");
                Ok((r.col(0)?, r.col(1)?))
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(EmitRights {
            emitters: emitters(client).await?,
            heartbeat,
        })
    }
}

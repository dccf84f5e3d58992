//! The publication as the source's catalog has it: its settings and owner, the schemas
//! and tables added to it (`pg_publication_rel`, not `pg_publication_tables`, which
//! lists a partitioned table's partitions), whether each is filtered; the statements
//! that create it or add tables; its signature; the other publications of the outboxes.

use tokio_postgres::Client;
use walfold_config::{quote_ident, QualifiedName, SourceView};
use walfold_event::Lsn;
use walfold_pg::RowExt;
use walfold_store::StoreError;

/// How walfold creates its publication. Through the partition root: a partitioned
/// outbox's rows then arrive under the outbox's name (otherwise under each partition's),
/// including partitions attached later.
pub(crate) const PUBLISH: &str = "publish = 'insert, truncate', publish_via_partition_root = true";

/// Publication `$1`'s settings, and whether the connected role owns it (or is in its
/// owner's role).
const PUBLICATION: &str = "select puballtables, pubinsert, pubviaroot, \
     pubupdate or pubdelete as updates_or_deletes, pg_has_role(pubowner, 'usage') as owned \
     from pg_publication where pubname = $1";

/// The schemas publication `$1` publishes whole (PostgreSQL 15+).
const SCHEMAS: &str = "select n.nspname::text from pg_publication_namespace pn \
     join pg_namespace n on n.oid = pn.pnnspid \
     join pg_publication p on p.oid = pn.pnpubid where p.pubname = $1 order by 1";

/// The tables added to publication `$1`, and whether each has a row filter or a column
/// list (PostgreSQL 15+).
const MEMBERS_15: &str = "select n.nspname::text as schema, c.relname::text as name, \
     r.prqual is not null or r.prattrs is not null as filtered from pg_publication_rel r \
     join pg_class c on c.oid = r.prrelid join pg_namespace n on n.oid = c.relnamespace \
     join pg_publication p on p.oid = r.prpubid where p.pubname = $1 order by 1, 2";

/// [`MEMBERS_15`] before PostgreSQL 15, which filters nothing.
const MEMBERS: &str = "select n.nspname::text as schema, c.relname::text as name, \
     false as filtered from pg_publication_rel r \
     join pg_class c on c.oid = r.prrelid join pg_namespace n on n.oid = c.relnamespace \
     join pg_publication p on p.oid = r.prpubid where p.pubname = $1 order by 1, 2";

/// Every publication not FOR ALL TABLES, with the tables added to it as `schema.name`.
const ALL: &str = "select p.pubname::text, array(select n.nspname || '.' || c.relname \
       from pg_publication_rel r join pg_class c on c.oid = r.prrelid \
       join pg_namespace n on n.oid = c.relnamespace where r.prpubid = p.oid order by 1) \
     from pg_publication p where not p.puballtables order by 1";

/// For slot `$1` of this database: its `wal_status`, and whether publication `$2`'s row
/// and the rows that put each outbox table (`$3` schemas, `$4` names) in it are older
/// than every catalog snapshot the slot still decodes with (pgoutput reads the
/// membership as of each change too). An xid more than 2^31 old has a negative age:
/// older still. Null when a row is missing.
const SEEN_BY_SLOT: &str = "select s.wal_status, \
       (select (age(p.xmin) < 0 or age(p.xmin) > age(s.catalog_xmin)) \
          and coalesce((select bool_and(age(r.xmin) < 0 or age(r.xmin) > age(s.catalog_xmin)) \
                        from pg_publication_rel r \
                        join pg_class c on c.oid = r.prrelid \
                        join pg_namespace n on n.oid = c.relnamespace \
                        join unnest($3::text[], $4::text[]) as o(nspname, relname) \
                          using (nspname, relname) \
                        where r.prpubid = p.oid), true) \
        from pg_publication p where p.pubname = $2) as older \
     from pg_replication_slots s where s.slot_name = $1 and s.database = current_database()";

/// Publication `$1`, if it exists.
const NAMED: &str = "select pubname::text as publication from pg_publication where pubname = $1";

/// The publications other than `$3` that publish one of the tables (`$1` schemas, `$2`
/// names).
const PUBLISHING: &str =
    "select distinct p.pubname::text as publication from pg_publication_tables p \
     join unnest($1::text[], $2::text[]) as o(schemaname, tablename) \
       using (schemaname, tablename) where p.pubname <> $3 order by 1";

/// The xmins of publication `$1`'s `pg_publication` row and of its `pg_publication_rel`
/// rows (with their oids), which any rewrite of it changes; and slot `$2`'s confirmed
/// position.
const SIGNATURE: &str =
    "select p.xmin::text || '/' || coalesce((select string_agg(r.oid::text || ':' || \
       r.xmin::text, ',' order by r.oid) from pg_publication_rel r \
       where r.prpubid = p.oid), '') as signature, \
     (select s.confirmed_flush_lsn from pg_replication_slots s \
       where s.slot_name = $2) as confirmed \
     from pg_publication p where p.pubname = $1";

/// A publication.
#[derive(Debug, Clone)]
pub struct Publication {
    pub all_tables: bool,
    pub inserts: bool,
    pub via_root: bool,
    pub updates_or_deletes: bool,
    /// The connected role owns it (or is in its owner's role).
    pub owned: bool,
    /// The schemas it publishes whole (read unless it is FOR ALL TABLES).
    pub schemas: Vec<String>,
    /// The tables added to it (read unless it publishes all tables or schemas).
    pub members: Vec<Member>,
}

/// A table added to a publication.
#[derive(Debug, Clone)]
pub struct Member {
    pub table: QualifiedName,
    /// With a row filter or a column list.
    pub filtered: bool,
}

/// The slot and the publication, as a slot walfold read decodes them.
pub(crate) struct SeenBySlot {
    pub(crate) wal_status: Option<String>,
    /// Whether every change the slot holds sees the publication and its outbox tables in
    /// it; `None`: a row is missing.
    pub(crate) older: Option<bool>,
}

impl Publication {
    /// Publication `name` on a server of `version`; `None`: none.
    pub(crate) async fn read(
        client: &Client,
        name: &str,
        version: i32,
    ) -> Result<Option<Publication>, StoreError> {
        let db = StoreError::db("source");
        let Some(row) = client.query_opt(PUBLICATION, &[&name]).await.map_err(db)? else {
            return Ok(None);
        };
        let r = row.of("pg_publication");
        let mut publication = Publication {
            all_tables: r.col("puballtables")?,
            inserts: r.col("pubinsert")?,
            via_root: r.col("pubviaroot")?,
            updates_or_deletes: r.col("updates_or_deletes")?,
            owned: r.col("owned")?,
            schemas: Vec::new(),
            members: Vec::new(),
        };
        if publication.all_tables {
            return Ok(Some(publication));
        }
        // PostgreSQL 15 added schema publications, row filters and column lists.
        let pg15 = version >= 150_000;
        if pg15 {
            publication.schemas =
                strings(client, SCHEMAS, name, "pg_publication_namespace").await?;
            if !publication.schemas.is_empty() {
                return Ok(Some(publication));
            }
        }
        publication.members = client
            .query(if pg15 { MEMBERS_15 } else { MEMBERS }, &[&name])
            .await
            .map_err(StoreError::db("source"))?
            .iter()
            .map(|r| {
                let r = r.of("pg_publication_rel");
                Ok(Member {
                    table: QualifiedName {
                        schema: r.col("schema")?,
                        name: r.col("name")?,
                    },
                    filtered: r.col("filtered")?,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(Some(publication))
    }

    /// Whether `table` was added to it.
    pub fn has(&self, table: &QualifiedName) -> bool {
        self.members.iter().any(|m| m.table == *table)
    }
}

async fn strings(
    client: &Client,
    sql: &str,
    name: &str,
    of: &'static str,
) -> Result<Vec<String>, StoreError> {
    client
        .query(sql, &[&name])
        .await
        .map_err(StoreError::db("source"))?
        .iter()
        .map(|r| Ok(r.of(of).col(0)?))
        .collect()
}

/// The statement that creates `source.publication` over the table outboxes (message
/// outboxes need no table: the publication then starts empty).
pub fn create_publication(config: &SourceView<'_>) -> String {
    let tables: Vec<String> = config.table_outboxes().map(|(_, t)| t.quoted()).collect();
    let for_tables = if tables.is_empty() {
        String::new()
    } else {
        format!(" for table {}", tables.join(", "))
    };
    format!(
        "create publication {}{for_tables} with ({PUBLISH})",
        quote_ident(&config.source().publication)
    )
}

/// Creates `source.publication` ([`create_publication`]).
pub(crate) async fn create(client: &Client, config: &SourceView<'_>) -> Result<(), StoreError> {
    client
        .batch_execute(&create_publication(config))
        .await
        .map_err(StoreError::db("creating the publication"))
}

/// Adds `tables` to publication `name`.
pub(crate) async fn add_tables(
    client: &Client,
    name: &str,
    tables: &[QualifiedName],
) -> Result<(), StoreError> {
    let list: Vec<String> = tables.iter().map(QualifiedName::quoted).collect();
    client
        .batch_execute(&format!(
            "alter publication {} add table {}",
            quote_ident(name),
            list.join(", ")
        ))
        .await
        .map_err(StoreError::db("adding tables to the publication"))
}

/// Every publication not FOR ALL TABLES, with its tables as `schema.name`, by name.
pub async fn publications(client: &Client) -> Result<Vec<(String, Vec<String>)>, StoreError> {
    client
        .query(ALL, &[])
        .await
        .map_err(StoreError::db("reading the publications"))?
        .iter()
        .map(|r| {
            let r = r.of("pg_publication");
            Ok((r.col(0)?, r.col(1)?))
        })
        .collect()
}

/// The unzipped schemas and names of the config's table outboxes.
fn outbox_names(config: &SourceView<'_>) -> (Vec<String>, Vec<String>) {
    config
        .table_outboxes()
        .map(|(_, t)| (t.schema, t.name))
        .unzip()
}

/// [`SeenBySlot`] for the configured slot and publication; `None`: no such slot in this
/// database.
pub(crate) async fn seen_by_slot(
    client: &Client,
    config: &SourceView<'_>,
) -> Result<Option<SeenBySlot>, StoreError> {
    let (schemas, names) = outbox_names(config);
    let source = config.source();
    let row = client
        .query_opt(
            SEEN_BY_SLOT,
            &[&source.slot, &source.publication, &schemas, &names],
        )
        .await
        .map_err(StoreError::db("reading the slot and the publications"))?;
    row.map(|row| {
        let r = row.of("pg_replication_slots");
        Ok(SeenBySlot {
            wal_status: r.col("wal_status")?,
            older: r.col("older")?,
        })
    })
    .transpose()
}

/// `name`, if that publication exists.
pub(crate) async fn named(client: &Client, name: &str) -> Result<Vec<String>, StoreError> {
    publication_names(client, NAMED, &[&name]).await
}

/// The publications other than the configured one that publish an outbox table.
pub(crate) async fn publishing_outboxes(
    client: &Client,
    config: &SourceView<'_>,
) -> Result<Vec<String>, StoreError> {
    let (schemas, names) = outbox_names(config);
    let publication = &config.source().publication;
    publication_names(client, PUBLISHING, &[&schemas, &names, publication]).await
}

async fn publication_names(
    client: &Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<String>, StoreError> {
    client
        .query(sql, params)
        .await
        .map_err(StoreError::db("reading the slot and the publications"))?
        .iter()
        .map(|r| Ok(r.of("pg_publication").col("publication")?))
        .collect()
}

/// The publication's signature ([`SIGNATURE`]) and the slot's confirmed position;
/// `None`: no such publication.
pub(crate) async fn signature(
    client: &Client,
    config: &SourceView<'_>,
) -> Result<Option<(String, Option<Lsn>)>, StoreError> {
    let row = client
        .query_opt(
            SIGNATURE,
            &[&config.source().publication, &config.source().slot],
        )
        .await
        .map_err(StoreError::db("reading the publication's signature"))?;
    row.map(|r| {
        let r = r.of("pg_publication");
        let confirmed: Option<tokio_postgres::types::PgLsn> = r.col("confirmed")?;
        Ok((r.col("signature")?, confirmed.map(Lsn::from)))
    })
    .transpose()
}

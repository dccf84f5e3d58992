//! Tables as the source's catalog has them: each table outbox's relation (its kind, the
//! root of a partition, its columns), every table `walfold init` may follow, a read
//! model's columns and keys, a column's values, a table's estimated rows.

use tokio_postgres::Client;
use walfold_config::{QualifiedName, SourceView};
use walfold_pg::RowExt;
use walfold_store::StoreError;

/// The columns of the relation `c` (by position, dropped ones left out), as four arrays:
/// names, type oids, types without and with their modifiers.
macro_rules! with_columns {
    ($select:literal, $from:literal) => {
        concat!(
            $select,
            ", array(select a.attname::text from pg_attribute a where a.attrelid = c.oid \
               and a.attnum > 0 and not a.attisdropped order by a.attnum) as columns, \
             array(select a.atttypid::int8 from pg_attribute a where a.attrelid = c.oid \
               and a.attnum > 0 and not a.attisdropped order by a.attnum) as types, \
             array(select format_type(a.atttypid, null) from pg_attribute a where a.attrelid = c.oid \
               and a.attnum > 0 and not a.attisdropped order by a.attnum) as type_names, \
             array(select format_type(a.atttypid, a.atttypmod) from pg_attribute a \
               where a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped \
               order by a.attnum) as declared ",
            $from
        )
    };
}

/// The relation `$1.$2` (exact names): its kind, and the root of a partition.
const RELATION: &str = with_columns!(
    "select c.relkind::text as kind, c.relispartition as is_partition, \
     rn.nspname::text as root_schema, rc.relname::text as root_name",
    "from pg_class c join pg_namespace n on n.oid = c.relnamespace \
     left join pg_class rc on c.relispartition and rc.oid = pg_partition_root(c.oid) \
     left join pg_namespace rn on rn.oid = rc.relnamespace \
     where n.nspname = $1 and c.relname = $2"
);

/// A table named `$1.$2` but for case.
const SIMILAR: &str = "select n.nspname::text, c.relname::text from pg_class c \
     join pg_namespace n on n.oid = c.relnamespace \
     where lower(n.nspname) = lower($1) and lower(c.relname) = lower($2) \
     and c.relkind in ('r', 'p') limit 1";

/// Tables and partitioned tables (not partitions), outside the system schemas and
/// outside walfold's own schemas (its event log looks like an outbox).
const TABLES: &str = with_columns!(
    "select n.nspname::text as schema, c.relname::text as name",
    "from pg_class c join pg_namespace n on n.oid = c.relnamespace \
     where c.relkind in ('r', 'p') and not c.relispartition \
     and n.nspname not in ('pg_catalog', 'information_schema') \
     and n.nspname not like 'pg\\_%' \
     and not exists (select 1 from pg_class m where m.relnamespace = n.oid \
                     and m.relname = 'processed_message') \
     order by 1, 2"
);

/// Whether relation `$1` (quoted) exists; an error when its schema may not be used.
const EXISTS: &str = "select to_regclass($1) is not null";

/// The columns of table `$1` (quoted): name, type, generated or an identity.
const MODEL_COLUMNS: &str = "select a.attname::text, format_type(a.atttypid, null), \
     a.attgenerated <> '' or a.attidentity <> '' \
     from pg_attribute a where a.attrelid = $1::text::regclass \
     and a.attnum > 0 and not a.attisdropped order by a.attnum";

/// The columns of each unique index of table `$1` (quoted) without a predicate or an
/// expression, the primary key first.
const UNIQUE_KEYS: &str = "select array(select a.attname::text from unnest(i.indkey) k \
                   join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k) \
     from pg_index i where i.indrelid = $1::text::regclass and i.indisunique \
     and i.indpred is null and i.indexprs is null \
     order by i.indisprimary desc, i.indexrelid";

/// The planner's estimate of table `$1`'s (quoted) rows, its partitions summed, and
/// whether one was never analyzed (pg_partition_tree has no rows for a plain table).
const ROW_ESTIMATE: &str = "select coalesce(sum(greatest(c.reltuples, 0)), 0)::int8, \
     coalesce(bool_or(c.reltuples < 0), true) \
     from pg_class c where (c.oid = $1::text::regclass and c.relkind = 'r') \
     or c.oid in (select relid from pg_partition_tree($1::text::regclass) where isleaf)";

/// A column of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub type_oid: u32,
    /// Its type without modifiers: `character varying`, `timestamp without time zone`.
    pub type_name: String,
    /// Its type as declared: `character varying(255)`, `timestamp(3) without time zone`.
    pub declared: String,
}

/// A relation that a table outbox names.
#[derive(Debug, Clone)]
pub struct Relation {
    /// `relkind`: `r` a table, `p` a partitioned one.
    pub kind: String,
    /// For a partition: its partitioned table's root.
    pub root: Option<QualifiedName>,
    pub columns: Vec<Column>,
}

impl Relation {
    /// Its column names, in order.
    pub fn column_names(&self) -> Vec<&str> {
        self.columns.iter().map(|c| c.name.as_str()).collect()
    }
}

/// A table outbox of the config and what the catalog has under its name.
#[derive(Debug, Clone)]
pub struct OutboxTable {
    /// Its place among the config's `[[outbox]]`es.
    pub index: usize,
    pub name: QualifiedName,
    /// `None`: no relation of that name.
    pub relation: Option<Relation>,
    /// Without a relation: a table whose name differs only in case.
    pub similar: Option<QualifiedName>,
}

/// A table of the database with its columns.
#[derive(Debug, Clone)]
pub struct Table {
    pub schema: String,
    pub name: String,
    pub columns: Vec<Column>,
}

/// A table a read model may live in: its columns (name, type, whether generated) and
/// the column lists of its unique keys, the primary key first.
#[derive(Debug, Clone)]
pub struct ModelTable {
    pub columns: Vec<(String, String, bool)>,
    pub unique_keys: Vec<Vec<String>>,
}

fn columns(r: &walfold_pg::Columns<'_>) -> Result<Vec<Column>, StoreError> {
    let names: Vec<String> = r.col("columns")?;
    let types: Vec<i64> = r.col("types")?;
    let type_names: Vec<String> = r.col("type_names")?;
    let declared: Vec<String> = r.col("declared")?;
    Ok(names
        .into_iter()
        .zip(types)
        .zip(type_names.into_iter().zip(declared))
        .map(|((name, oid), (type_name, declared))| Column {
            name,
            type_oid: oid as u32,
            type_name,
            declared,
        })
        .collect())
}

/// Each of the config's table outboxes, in config order.
pub(crate) async fn outbox_tables(
    client: &Client,
    config: &SourceView<'_>,
) -> Result<Vec<OutboxTable>, StoreError> {
    let mut out = Vec::new();
    for (index, outbox) in config.outboxes().enumerate() {
        let Some(name) = outbox.table_name() else {
            continue;
        };
        let relation = relation(client, &name).await?;
        let similar = match relation {
            Some(_) => None,
            None => similar(client, &name).await?,
        };
        out.push(OutboxTable {
            index,
            name,
            relation,
            similar,
        });
    }
    Ok(out)
}

async fn relation(client: &Client, name: &QualifiedName) -> Result<Option<Relation>, StoreError> {
    let Some(row) = client
        .query_opt(RELATION, &[&name.schema, &name.name])
        .await
        .map_err(StoreError::db("source"))?
    else {
        return Ok(None);
    };
    let r = row.of("pg_class");
    let root = match r.col::<bool>("is_partition")? {
        true => Some(QualifiedName {
            schema: r.col("root_schema")?,
            name: r.col("root_name")?,
        }),
        false => None,
    };
    Ok(Some(Relation {
        kind: r.col("kind")?,
        root,
        columns: columns(&r)?,
    }))
}

async fn similar(
    client: &Client,
    name: &QualifiedName,
) -> Result<Option<QualifiedName>, StoreError> {
    client
        .query_opt(SIMILAR, &[&name.schema, &name.name])
        .await
        .map_err(StoreError::db("source"))?
        .map(|row| {
            let r = row.of("pg_class");
            Ok(QualifiedName {
                schema: r.col(0)?,
                name: r.col(1)?,
            })
        })
        .transpose()
}

/// Every table `walfold init` may follow, by schema and name.
pub async fn tables(client: &Client) -> Result<Vec<Table>, StoreError> {
    let rows = client
        .query(TABLES, &[])
        .await
        .map_err(StoreError::db("reading the catalog"))?;
    rows.iter()
        .map(|row| {
            let r = row.of("pg_class");
            Ok(Table {
                schema: r.col("schema")?,
                name: r.col("name")?,
                columns: columns(&r)?,
            })
        })
        .collect()
}

/// Table `name` as a read model would use it; `None`: no such table. An error when its
/// schema may not be used.
pub async fn model_table(
    client: &Client,
    name: &QualifiedName,
) -> Result<Option<ModelTable>, StoreError> {
    let quoted = name.quoted();
    let read = StoreError::db("reading the read model's table");
    let exists: bool = client
        .query_one(EXISTS, &[&quoted])
        .await
        .map_err(read)?
        .of("pg_class")
        .col(0)?;
    if !exists {
        return Ok(None);
    }
    let columns = client
        .query(MODEL_COLUMNS, &[&quoted])
        .await
        .map_err(StoreError::db("reading the read model's columns"))?
        .iter()
        .map(|r| {
            let r = r.of("pg_attribute");
            Ok((r.col(0)?, r.col(1)?, r.col(2)?))
        })
        .collect::<Result<_, StoreError>>()?;
    let unique_keys = client
        .query(UNIQUE_KEYS, &[&quoted])
        .await
        .map_err(StoreError::db("reading the read model's keys"))?
        .iter()
        .map(|r| r.of("pg_index").col(0))
        .collect::<Result<_, _>>()?;
    Ok(Some(ModelTable {
        columns,
        unique_keys,
    }))
}

/// The distinct values of `table`'s `column` as text (nulls left out), in order, at most
/// `limit`.
pub async fn column_values(
    client: &Client,
    table: &QualifiedName,
    column: &str,
    limit: i64,
) -> Result<Vec<String>, StoreError> {
    let quoted = walfold_config::quote_ident(column);
    let sql = format!(
        "select distinct {quoted}::text from {} where {quoted} is not null order by 1 limit $1",
        table.quoted()
    );
    client
        .query(&sql, &[&limit])
        .await
        .map_err(StoreError::db("reading a column's values"))?
        .iter()
        .map(|row| Ok(row.of("the table").col(0)?))
        .collect()
}

/// The distinct pairs of two columns' values in `table` (at most `limit`, in order):
/// which events' types each listener (or destination) of a table with one row per event
/// and per listener has rows of.
pub async fn column_pairs(
    client: &Client,
    table: &QualifiedName,
    columns: [&str; 2],
    limit: i64,
) -> Result<Vec<(String, String)>, StoreError> {
    let [a, b] = columns.map(walfold_config::quote_ident);
    let sql = format!(
        "select distinct {a}::text, {b}::text from {} where {a} is not null and {b} is not null \
         order by 1, 2 limit $1",
        table.quoted()
    );
    client
        .query(&sql, &[&limit])
        .await
        .map_err(StoreError::db("reading two columns' values"))?
        .iter()
        .map(|row| {
            let r = row.of("the table");
            Ok((r.col(0)?, r.col(1)?))
        })
        .collect()
}

/// The planner's estimate of `table`'s rows (a partitioned table's partitions summed);
/// `None` while it was never analyzed.
pub async fn row_estimate(
    client: &Client,
    table: &QualifiedName,
) -> Result<Option<u64>, StoreError> {
    let row = client
        .query_one(ROW_ESTIMATE, &[&table.quoted()])
        .await
        .map_err(StoreError::db("reading the table's estimated rows"))?;
    let row = row.of("pg_class");
    let (rows, unknown): (i64, bool) = (row.col(0)?, row.col(1)?);
    Ok((!unknown).then_some(rows.max(0) as u64))
}

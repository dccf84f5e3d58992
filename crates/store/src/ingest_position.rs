//! The ingest position read from outside the appender: how far walfold ingested
//! through each slot and through which publication (for `walfold doctor` and the
//! source's checks), and how many rows a slot's appends counted (a running backfill's
//! progress).

use tokio_postgres::{Client, Row};

use crate::error::StoreError;
use crate::schema::Schema;
use walfold_pg::{FromRow, RowExt};

/// Slot `$1`'s ingest position as text, once it is past 0/0.
const INGESTED: &str =
    "select lsn::text as lsn from {schema}.ingest_position where slot = $1 and lsn > '0/0'";

/// Every slot ingested through (past 0/0) with its position as text, by slot.
const SLOTS: &str = "select slot, lsn::text as lsn from {schema}.ingest_position \
     where lsn > '0/0' order by slot";

/// The publication slot `$1` was last read through.
const READ_THROUGH: &str = "select publication from {schema}.ingest_position where slot = $1";

/// The rows slot `$1`'s appends counted: appended, duplicates, ID conflicts, malformed.
const COUNTED: &str =
    "select coalesce(sum(appended + duplicates + id_conflicts + malformed), 0)::int8 as counted \
     from {schema}.ingest_position where slot = $1";

/// A slot walfold ingested through, and how far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestedSlot {
    pub slot: String,
    /// As PostgreSQL writes a `pg_lsn`.
    pub lsn: String,
}

/// How far walfold ingested through `slot` (as PostgreSQL writes a `pg_lsn`); `None`
/// before anything was.
pub async fn ingested_through(
    client: &Client,
    schema: &Schema,
    slot: &str,
) -> Result<Option<String>, StoreError> {
    Ok(client
        .query_opt(&schema.sql(INGESTED), &[&slot])
        .await
        .map_err(StoreError::db("reading the ingest position"))?
        .map(|r| r.of("ingest_position").col("lsn"))
        .transpose()?)
}

/// The publication `slot` was last read through (`None`: not recorded yet, as before
/// walfold recorded it, or no such slot).
pub async fn read_through(
    client: &Client,
    schema: &Schema,
    slot: &str,
) -> Result<Option<String>, StoreError> {
    Ok(client
        .query_opt(&schema.sql(READ_THROUGH), &[&slot])
        .await
        .map_err(StoreError::db("reading the slot's publication"))?
        .map(|r| r.of("ingest_position").col("publication"))
        .transpose()?
        .flatten())
}

/// Every slot walfold ingested through, by name.
pub async fn ingested_slots(
    client: &Client,
    schema: &Schema,
) -> Result<Vec<IngestedSlot>, StoreError> {
    let rows = client
        .query(&schema.sql(SLOTS), &[])
        .await
        .map_err(StoreError::db("reading the ingest positions"))?;
    Ok(IngestedSlot::from_rows(&rows)?)
}

impl FromRow for IngestedSlot {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("ingest_position");
        Ok(IngestedSlot {
            slot: r.col("slot")?,
            lsn: r.col("lsn")?,
        })
    }
}

/// The rows `slot`'s appends have counted so far (appended, duplicates, ID conflicts,
/// malformed); 0 without an ingest position.
pub async fn ingested_rows(
    client: &Client,
    schema: &Schema,
    slot: &str,
) -> Result<i64, StoreError> {
    Ok(client
        .query_one(&schema.sql(COUNTED), &[&slot])
        .await
        .map_err(StoreError::db("counting ingested rows"))?
        .of("ingest_position")
        .col("counted")?)
}

//! `projection_definition` and `definition_change`: what defines each subscriber's fold
//! (see `walfold_config::FoldDefinition`), recorded when it first runs, when a rebuild
//! starts under it, or when an operator accepts a change; and the trail of accepted
//! changes. The leader records (under its fence); every instance reads what its units'
//! subscribers fold with.

use tokio_postgres::{GenericClient, Row};
use walfold_config::FoldDefinition;

use crate::error::StoreError;
use crate::leader::Fence;
use crate::schema::Schema;
use walfold_pg::{FromRow, RowExt};

walfold_event::stored_enum! {
    /// How a definition came to be recorded: `projection_definition.origin`.
    pub enum DefinitionOrigin {
        /// The subscriber's first start (or its first under this release).
        First = "first",
        /// A rebuild's new subscriber, recorded with the rebuild.
        Rebuild = "rebuild",
        /// An operator's `on_definition_change = "accept"`.
        Accepted = "accepted",
    }
}

walfold_event::stored_enum! {
    /// What was done about a changed definition: `definition_change.action`.
    pub enum ChangeAction {
        Accepted = "accepted",
        Rebuild = "rebuild",
    }
}

/// The columns a [`RecordedDefinition`] is read from.
macro_rules! definition_columns {
    () => {
        "subscriber_id, projection, digest, definition, parts, origin, accepted_by, \
         previous_digest, extract(epoch from recorded_at)::float8 as recorded_at_unix"
    };
}

/// The definition subscriber `$1` folds with.
const RECORDED: &str = concat!(
    "select ",
    definition_columns!(),
    " from {schema}.projection_definition where subscriber_id = $1"
);

/// Every recorded definition.
const ALL: &str = concat!(
    "select ",
    definition_columns!(),
    " from {schema}.projection_definition order by subscriber_id"
);

/// Records (or replaces) the definition subscriber `$1` folds with.
const RECORD: &str = "insert into {schema}.projection_definition \
     (subscriber_id, projection, digest, definition, parts, origin, accepted_by, previous_digest) \
     values ($1, $2, $3, $4, $5, $6, $7, $8) \
     on conflict (subscriber_id) do update set projection = excluded.projection, \
     digest = excluded.digest, definition = excluded.definition, parts = excluded.parts, \
     origin = excluded.origin, accepted_by = excluded.accepted_by, \
     previous_digest = excluded.previous_digest, recorded_at = now()";

/// Records the definition of subscriber `$1` unless it has one.
const RECORD_FIRST: &str = "insert into {schema}.projection_definition \
     (subscriber_id, projection, digest, definition, parts, origin) \
     values ($1, $2, $3, $4, $5, $6) on conflict (subscriber_id) do nothing";

/// One line of the trail.
const CHANGED: &str = "insert into {schema}.definition_change \
     (projection, subscriber_id, action, from_digest, to_digest, diff, by_whom) \
     values ($1, $2, $3, $4, $5, $6, $7)";

/// The trail of subscriber `$1`, oldest first.
const CHANGES: &str = "select projection, subscriber_id, action, from_digest, to_digest, diff, \
     by_whom, extract(epoch from at)::float8 as at_unix \
     from {schema}.definition_change where subscriber_id = $1 order by id";

/// A subscriber's recorded definition.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RecordedDefinition {
    pub subscriber: String,
    pub projection: String,
    pub digest: String,
    /// The normalised text.
    pub text: String,
    /// The parts it is built from again; `None` when this release cannot read them.
    #[serde(skip)]
    pub parts: Option<FoldDefinition>,
    pub origin: DefinitionOrigin,
    pub accepted_by: Option<String>,
    pub previous_digest: Option<String>,
    pub recorded_at_unix: f64,
}

impl FromRow for RecordedDefinition {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("projection_definition");
        let parts: serde_json::Value = r.col("parts")?;
        Ok(RecordedDefinition {
            subscriber: r.col("subscriber_id")?,
            projection: r.col("projection")?,
            digest: r.col("digest")?,
            text: r.col("definition")?,
            parts: serde_json::from_value(parts).ok(),
            origin: r.col("origin")?,
            accepted_by: r.col("accepted_by")?,
            previous_digest: r.col("previous_digest")?,
            recorded_at_unix: r.col("recorded_at_unix")?,
        })
    }
}

/// An accepted change or a rebuild started for one.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DefinitionChange {
    pub projection: String,
    pub subscriber: String,
    pub action: ChangeAction,
    pub from_digest: String,
    pub to_digest: String,
    pub diff: String,
    pub by: String,
    pub at_unix: f64,
}

impl FromRow for DefinitionChange {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("definition_change");
        Ok(DefinitionChange {
            projection: r.col("projection")?,
            subscriber: r.col("subscriber_id")?,
            action: r.col("action")?,
            from_digest: r.col("from_digest")?,
            to_digest: r.col("to_digest")?,
            diff: r.col("diff")?,
            by: r.col("by_whom")?,
            at_unix: r.col("at_unix")?,
        })
    }
}

/// The definition `subscriber` folds with, if one is recorded.
pub async fn recorded(
    client: &impl GenericClient,
    schema: &Schema,
    subscriber: &str,
) -> Result<Option<RecordedDefinition>, StoreError> {
    let row = client
        .query_opt(&schema.sql(RECORDED), &[&subscriber])
        .await
        .map_err(StoreError::db("reading a projection's definition"))?;
    Ok(row.as_ref().map(RecordedDefinition::from_row).transpose()?)
}

/// Every recorded definition.
pub async fn all(
    client: &impl GenericClient,
    schema: &Schema,
) -> Result<Vec<RecordedDefinition>, StoreError> {
    let rows = client
        .query(&schema.sql(ALL), &[])
        .await
        .map_err(StoreError::db("reading the projections' definitions"))?;
    Ok(RecordedDefinition::from_rows(&rows)?)
}

/// The trail of accepted changes and rebuilds of `subscriber`.
pub async fn changes(
    client: &impl GenericClient,
    schema: &Schema,
    subscriber: &str,
) -> Result<Vec<DefinitionChange>, StoreError> {
    let rows = client
        .query(&schema.sql(CHANGES), &[&subscriber])
        .await
        .map_err(StoreError::db("reading the definition changes"))?;
    Ok(DefinitionChange::from_rows(&rows)?)
}

fn parts_of(definition: &FoldDefinition) -> serde_json::Value {
    serde_json::to_value(definition).unwrap_or(serde_json::Value::Null)
}

/// Records `definition` for `subscriber` unless one is recorded (its first start, or
/// its first under this release); whether it did.
pub async fn record_first(
    client: &impl GenericClient,
    schema: &Schema,
    subscriber: &str,
    projection: &str,
    definition: &FoldDefinition,
) -> Result<bool, StoreError> {
    let n = client
        .execute(
            &schema.sql(RECORD_FIRST),
            &[
                &subscriber,
                &projection,
                &definition.digest(),
                &definition.text(),
                &parts_of(definition),
                &DefinitionOrigin::First,
            ],
        )
        .await
        .map_err(StoreError::db("recording a projection's definition"))?;
    Ok(n == 1)
}

/// Records `definition` for a rebuild's new `subscriber`, in the transaction that
/// records the rebuild.
pub(crate) async fn record_rebuild(
    tx: &impl GenericClient,
    schema: &Schema,
    subscriber: &str,
    projection: &str,
    definition: &FoldDefinition,
) -> Result<(), StoreError> {
    tx.execute(
        &schema.sql(RECORD),
        &[
            &subscriber,
            &projection,
            &definition.digest(),
            &definition.text(),
            &parts_of(definition),
            &DefinitionOrigin::Rebuild,
            &None::<String>,
            &None::<String>,
        ],
    )
    .await
    .map_err(StoreError::db("recording a rebuild's definition"))?;
    Ok(())
}

/// Adds a line to the trail.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn changed(
    tx: &impl GenericClient,
    schema: &Schema,
    projection: &str,
    subscriber: &str,
    action: ChangeAction,
    from: &RecordedDefinition,
    to: &FoldDefinition,
    by: &str,
) -> Result<(), StoreError> {
    let diff = walfold_config::definition_diff(&from.text, &to.text());
    tx.execute(
        &schema.sql(CHANGED),
        &[
            &projection,
            &subscriber,
            &action,
            &from.digest,
            &to.digest(),
            &diff,
            &by,
        ],
    )
    .await
    .map_err(StoreError::db("recording a definition change"))?;
    Ok(())
}

/// Accepts `definition` as compatible with `from`, which `from.subscriber` folded with:
/// records it, with `by` and the time, in one transaction that proves the leader's
/// `fence`.
pub async fn accept(
    client: &mut tokio_postgres::Client,
    schema: &Schema,
    fence: &Fence,
    from: &RecordedDefinition,
    definition: &FoldDefinition,
    by: &str,
) -> Result<(), StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("accepting a definition"))?;
    fence.check(&tx).await?;
    tx.execute(
        &schema.sql(RECORD),
        &[
            &from.subscriber,
            &from.projection,
            &definition.digest(),
            &definition.text(),
            &parts_of(definition),
            &DefinitionOrigin::Accepted,
            &Some(by),
            &Some(&from.digest),
        ],
    )
    .await
    .map_err(StoreError::db("accepting a definition"))?;
    changed(
        &tx,
        schema,
        &from.projection,
        &from.subscriber,
        ChangeAction::Accepted,
        from,
        definition,
        by,
    )
    .await?;
    tx.commit()
        .await
        .map_err(StoreError::db("accepting a definition"))?;
    Ok(())
}

//! Strict-sequence projections: the last version applied per aggregate and subscriber,
//! read and written in the projector's transaction, so a version is recorded exactly
//! when its change commits.

use std::collections::HashMap;

use tokio_postgres::GenericClient;
use walfold_event::Aggregate;

use crate::error::StoreError;
use crate::schema::Schema;
use walfold_pg::RowExt;

/// The recorded version of each aggregate (types `$2`, IDs `$3`) for subscriber `$1`.
const APPLIED: &str = "select v.aggregate_type, v.aggregate_id, v.version \
     from unnest($2::text[], $3::text[]) as a(t, i) \
     join {schema}.aggregate_version v on v.subscriber_id = $1 \
       and v.aggregate_key = {schema}.aggregate_key(a.t, a.i)";

/// Records version `$4` of each aggregate (types `$2`, IDs `$3`) for subscriber `$1`.
const RECORD: &str = "insert into {schema}.aggregate_version as v (subscriber_id, aggregate_type, aggregate_id, version) \
     select $1, t, i, n from unnest($2::text[], $3::text[], $4::int8[]) as a(t, i, n) \
     on conflict (subscriber_id, aggregate_key) do update \
     set version = excluded.version, updated_at = now()";

/// Whether subscriber `$1` applied events but recorded no versions.
const RAN_WITHOUT: &str =
    "select exists (select 1 from {schema}.checkpoint where subscriber_id = $1 \
       and applied + stale > 0) \
     and not exists (select 1 from {schema}.aggregate_version where subscriber_id = $1) \
     as ran_without_versions";

/// The last applied version of each of `aggregates` that has one.
pub(crate) async fn applied_versions(
    tx: &impl GenericClient,
    schema: &Schema,
    subscriber: &str,
    aggregates: &[Aggregate],
) -> Result<HashMap<Aggregate, i64>, StoreError> {
    if aggregates.is_empty() {
        return Ok(HashMap::new());
    }
    let (types, ids): (Vec<&str>, Vec<&str>) = aggregates
        .iter()
        .map(|a| (a.kind.as_str(), a.id.as_str()))
        .unzip();
    let rows = tx
        .query(&schema.sql(APPLIED), &[&subscriber, &types, &ids])
        .await
        .map_err(StoreError::db("reading applied versions"))?;
    rows.iter()
        .map(|r| {
            let r = r.of("aggregate_version");
            Ok((
                Aggregate {
                    kind: r.col("aggregate_type")?,
                    id: r.col("aggregate_id")?,
                },
                r.col("version")?,
            ))
        })
        .collect()
}

/// Records the last applied version of each aggregate, in the caller's transaction.
pub(crate) async fn record_versions(
    tx: &impl GenericClient,
    schema: &Schema,
    subscriber: &str,
    versions: &[(Aggregate, i64)],
) -> Result<(), StoreError> {
    if versions.is_empty() {
        return Ok(());
    }
    let types: Vec<&str> = versions.iter().map(|(a, _)| a.kind.as_str()).collect();
    let ids: Vec<&str> = versions.iter().map(|(a, _)| a.id.as_str()).collect();
    let numbers: Vec<i64> = versions.iter().map(|(_, v)| *v).collect();
    tx.execute(&schema.sql(RECORD), &[&subscriber, &types, &ids, &numbers])
        .await
        .map_err(StoreError::db("recording applied versions"))?;
    Ok(())
}

/// Whether `subscriber` has applied events without recording versions (it ran in
/// `guard` mode): strict mode cannot know which versions those were.
pub async fn ran_without_versions(
    client: &impl GenericClient,
    schema: &Schema,
    subscriber: &str,
) -> Result<bool, StoreError> {
    Ok(client
        .query_one(&schema.sql(RAN_WITHOUT), &[&subscriber])
        .await
        .map_err(StoreError::db("reading applied versions"))?
        .of("aggregate_version")
        .col("ran_without_versions")?)
}

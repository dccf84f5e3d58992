//! The one place that decides which subscriber ID serves a projection's live storage.
//! It is the config's `subscriber` until a rebuild switches over to its new ID. An
//! edited `subscriber` in the config is the operator's new choice and wins, unless it
//! names the subscriber a rebuild replaced (a stale config) or one still rebuilding, or
//! the live storage holds what the recorded subscriber built: the new ID would apply
//! every event to it again (an empty table, or none yet, starts over safely).

use tokio_postgres::{Client, Transaction};
use walfold_config::QualifiedName;

use crate::error::StoreError;
use crate::rebuild::RebuildState;
use crate::refusal::Refusal;
use crate::schema::Schema;
use walfold_pg::RowExt;

/// Registers projection `$1` with subscriber `$2` unless it is registered.
const REGISTER: &str =
    "insert into {schema}.projection (name, subscriber_id, configured_subscriber) \
     values ($1, $2, $2) on conflict (name) do nothing";

/// Projection `$1`'s live and last configured subscriber, locked for the transaction.
const LOCK: &str = "select subscriber_id, configured_subscriber from {schema}.projection \
     where name = $1 for update";

/// What the latest rebuild of projection `$1` did with subscriber `$2`: `rebuilding`
/// (still replaying under it, states `$3`) or `replaced` (switched away, states `$4`).
const REBUILD_ROLE: &str =
    "select case when subscriber_id = $2 and state = any($3) then 'rebuilding' \
     when previous_subscriber = $2 and state = any($4) then 'replaced' end as role \
     from {schema}.rebuild where projection = $1 \
     and (subscriber_id = $2 or previous_subscriber = $2) \
     order by requested_at desc limit 1";

/// Makes `$2` projection `$1`'s live and configured subscriber.
const ADOPT: &str =
    "update {schema}.projection set subscriber_id = $2, configured_subscriber = $2, \
     updated_at = now() where name = $1";

/// Whether subscriber `$1` has passed any event.
const PROGRESSED: &str = "select exists (select from {schema}.checkpoint \
     where subscriber_id = $1 and position > 0) as progressed";

/// Every projection and its live subscriber.
const ALL: &str = "select name, subscriber_id from {schema}.projection";

/// The subscriber ID serving `projection` live, given the config's `configured` ID and
/// the live table, when the projection names one (`storage`).
pub async fn active_subscriber(
    client: &mut Client,
    schema: &Schema,
    projection: &str,
    configured: &str,
    storage: Option<&QualifiedName>,
) -> Result<String, StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("reading the projection registry"))?;
    tx.execute(&schema.sql(REGISTER), &[&projection, &configured])
        .await
        .map_err(StoreError::db("registering a projection"))?;
    let row = tx
        .query_one(&schema.sql(LOCK), &[&projection])
        .await
        .map_err(StoreError::db("reading the projection registry"))?;
    let row = row.of("projection");
    let (active, recorded): (String, String) =
        (row.col("subscriber_id")?, row.col("configured_subscriber")?);
    // What a rebuild of this projection did with the configured ID, if anything.
    let role: Option<String> = tx
        .query_opt(
            &schema.sql(REBUILD_ROLE),
            &[
                &projection,
                &configured,
                &RebuildState::REPLAYING,
                &[RebuildState::Switched, RebuildState::Finished].as_slice(),
            ],
        )
        .await
        .map_err(StoreError::db("reading rebuilds"))?
        .map(|r| r.of("rebuild").col("role"))
        .transpose()?
        .flatten();
    let active = if recorded == configured || role.as_deref() == Some("replaced") {
        // The config still names the subscriber a rebuild replaced: stale, not a choice.
        active
    } else if role.as_deref() == Some("rebuilding") {
        return Err(Refusal::SubscriberRebuilding {
            projection: projection.to_owned(),
            configured: configured.to_owned(),
            active,
        }
        .into());
    } else {
        if active != configured && built_by(&tx, schema, &active, storage).await? {
            return Err(Refusal::SubscriberBuiltOver {
                projection: projection.to_owned(),
                configured: configured.to_owned(),
                active,
                table: storage.cloned(),
                registry: schema.quoted().to_string(),
            }
            .into());
        }
        tx.execute(&schema.sql(ADOPT), &[&projection, &configured])
            .await
            .map_err(StoreError::db("updating the projection registry"))?;
        configured.to_owned()
    };
    tx.commit()
        .await
        .map_err(StoreError::db("reading the projection registry"))?;
    if active != configured {
        tracing::info!(projection, subscriber = %active, configured, "a rebuild switched this projection to a new subscriber; set `subscriber` in the config to it");
    }
    Ok(active)
}

/// Whether `storage` holds what `subscriber` built: it has passed events and the table
/// (when known) exists and is not empty.
async fn built_by(
    tx: &Transaction<'_>,
    schema: &Schema,
    subscriber: &str,
    storage: Option<&QualifiedName>,
) -> Result<bool, StoreError> {
    let progressed: bool = tx
        .query_one(&schema.sql(PROGRESSED), &[&subscriber])
        .await
        .map_err(StoreError::db("reading checkpoints"))?
        .of("checkpoint")
        .col("progressed")?;
    let Some(table) = storage else {
        return Ok(progressed);
    };
    if !progressed {
        return Ok(false);
    }
    let exists: bool = tx
        .query_one(
            "select to_regclass($1) is not null as exists",
            &[&table.quoted()],
        )
        .await
        .map_err(StoreError::db("looking up the projection's table"))?
        .of("pg_class")
        .col("exists")?;
    if !exists {
        return Ok(false);
    }
    Ok(tx
        .query_one(
            &format!("select exists (select from {}) as rows", table.quoted()),
            &[],
        )
        .await
        .map_err(StoreError::db("reading the projection's table"))?
        .of("projection table")
        .col("rows")?)
}

/// The registry as (projection name, active subscriber) pairs.
pub async fn active_projections(
    client: &Client,
    schema: &Schema,
) -> Result<Vec<(String, String)>, StoreError> {
    client
        .query(&schema.sql(ALL), &[])
        .await
        .map_err(StoreError::db("reading the projection registry"))?
        .iter()
        .map(|r| {
            let r = r.of("projection");
            Ok((r.col("name")?, r.col("subscriber_id")?))
        })
        .collect()
}

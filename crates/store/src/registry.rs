//! The one place that decides which subscriber ID serves a projection's live storage.
//! It is the config's `subscriber` until a rebuild switches over to its new ID. An
//! edited `subscriber` in the config is the operator's new choice and wins, unless it
//! names the subscriber a rebuild replaced (a stale config) or one still rebuilding.

use tokio_postgres::Client;

use crate::error::StoreError;
use crate::rebuild::RebuildState;
use walfold_config::quote_ident;

/// The subscriber ID serving `projection` live, given the config's `configured` ID.
pub async fn active_subscriber(
    client: &mut Client,
    schema: &str,
    projection: &str,
    configured: &str,
) -> Result<String, StoreError> {
    let s = quote_ident(schema);
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("reading the projection registry"))?;
    tx.execute(
        &format!(
            "insert into {s}.projection (name, subscriber_id, configured_subscriber) \
             values ($1, $2, $2) on conflict (name) do nothing"
        ),
        &[&projection, &configured],
    )
    .await
    .map_err(StoreError::db("registering a projection"))?;
    let row = tx
        .query_one(
            &format!(
                "select subscriber_id, configured_subscriber from {s}.projection \
                 where name = $1 for update"
            ),
            &[&projection],
        )
        .await
        .map_err(StoreError::db("reading the projection registry"))?;
    let (active, recorded): (String, String) = (row.get(0), row.get(1));
    // What a rebuild of this projection did with the configured ID, if anything.
    let role: Option<String> = tx
        .query_opt(
            &format!(
                "select case when subscriber_id = $2 and state = any($3) then 'rebuilding' \
                 when previous_subscriber = $2 and state = any($4) then 'replaced' end \
                 from {s}.rebuild where projection = $1 \
                 and (subscriber_id = $2 or previous_subscriber = $2) \
                 order by requested_at desc limit 1"
            ),
            &[
                &projection,
                &configured,
                &RebuildState::REPLAYING,
                &[RebuildState::Switched, RebuildState::Finished].as_slice(),
            ],
        )
        .await
        .map_err(StoreError::db("reading rebuilds"))?
        .and_then(|r| r.get(0));
    let active = if recorded == configured || role.as_deref() == Some("replaced") {
        // The config still names the subscriber a rebuild replaced: stale, not a choice.
        active
    } else if role.as_deref() == Some("rebuilding") {
        return Err(StoreError::Refused(format!(
            "the config names {configured} for {projection}, but a rebuild is replaying under \
             that ID; keep {active} until the rebuild has switched over"
        )));
    } else {
        tx.execute(
            &format!(
                "update {s}.projection set subscriber_id = $2, configured_subscriber = $2, \
                 updated_at = now() where name = $1"
            ),
            &[&projection, &configured],
        )
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

/// The subscriber IDs serving projections now.
pub async fn active_subscribers(client: &Client, schema: &str) -> Result<Vec<String>, StoreError> {
    Ok(client
        .query(
            &format!(
                "select subscriber_id from {}.projection",
                quote_ident(schema)
            ),
            &[],
        )
        .await
        .map_err(StoreError::db("reading the projection registry"))?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// The registry as (projection name, active subscriber) pairs.
pub async fn active_projections(
    client: &Client,
    schema: &str,
) -> Result<Vec<(String, String)>, StoreError> {
    Ok(client
        .query(
            &format!(
                "select name, subscriber_id from {}.projection",
                quote_ident(schema)
            ),
            &[],
        )
        .await
        .map_err(StoreError::db("reading the projection registry"))?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

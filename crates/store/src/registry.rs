//! The one place that decides which subscriber ID serves a projection's live storage.
//! It is the config's `subscriber` until a rebuild switches over to its new ID; an
//! edited `subscriber` in the config is the operator's new choice and wins.

use tokio_postgres::Client;

use crate::error::StoreError;
use crate::q;

/// The subscriber ID serving `projection` live, given the config's `configured` ID.
pub async fn active_subscriber(
    client: &mut Client,
    schema: &str,
    projection: &str,
    configured: &str,
) -> Result<String, StoreError> {
    let s = q(schema);
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
    let active = if recorded == configured {
        active
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

//! A projection written in Rust: account balances from `AccountCredited` /
//! `AccountDebited` events (the bank-credit scenario). The engine claims each event in
//! the same transaction, so a redelivered credit never credits twice; the version guard
//! keeps a late, older event from being applied after a newer one.

use futures::future::BoxFuture;
use tokio_postgres::Transaction;
use walfold_engine::{Applied, Event, Projection, ProjectionError};

/// `account_balance (account_id text primary key, balance_cents bigint, version bigint)`.
#[derive(Debug, Default)]
pub struct AccountBalance;

/// The read model's table.
pub const DDL: &str = "create table if not exists account_balance \
    (account_id text primary key, balance_cents bigint not null, version bigint not null)";

impl Projection for AccountBalance {
    fn apply<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        event: &'a Event,
    ) -> BoxFuture<'a, Result<Applied, ProjectionError>> {
        Box::pin(async move {
            let sign = match event.event_type.as_str() {
                "AccountCredited" => 1,
                "AccountDebited" => -1,
                _ => return Ok(Applied::Stale),
            };
            let cents = event
                .payload
                .get("amount_cents")
                .and_then(|v| v.as_i64())
                .ok_or_else(|| {
                    ProjectionError::Invalid("payload.amount_cents must be an integer".into())
                })?;
            let version = event
                .version
                .ok_or_else(|| ProjectionError::Invalid("event has no version".into()))?;
            let changed = tx
                .execute(
                    "insert into account_balance as a (account_id, balance_cents, version) \
                     values ($1, $2, $3) \
                     on conflict (account_id) do update \
                     set balance_cents = a.balance_cents + excluded.balance_cents, \
                         version = excluded.version \
                     where a.version < excluded.version",
                    &[&event.aggregate_id, &(sign * cents), &version],
                )
                .await?;
            Ok(if changed == 1 {
                Applied::Changed
            } else {
                Applied::Stale
            })
        })
    }
}

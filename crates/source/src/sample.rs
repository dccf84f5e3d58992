//! A few of a table outbox's rows made into events as `walfold run` would make them:
//! what `walfold init` reads to propose a field the table has no column for (the JSON
//! keys of the payloads that look like an aggregate's identity). Read-only: one select
//! of the newest rows, mapped by the outbox's [`Mapping`]; a row that is no event (a
//! dead letter, filtered out) is left out.

use tokio_postgres::Client;
use walfold_config::{quote_ident, OutboxConfig};
use walfold_pg::RowExt;
use walfold_pgoutput::{oid, Column, Tuple};
use walfold_store::StoreError;

use crate::error::SourceError;
use crate::outbox::{Mapping, TxContext};

/// One sampled event: its type and its payload (JSON).
#[derive(Debug, Clone)]
pub struct Sampled {
    pub event_type: String,
    pub payload: serde_json::Value,
    /// What the `payload` field gives before walfold reads it as JSON.
    pub payload_kind: PayloadKind,
}

/// What a payload field's column or expression gives: an expression over it reads a
/// JSON key by `->>` on JSON, after `::jsonb` on text, after `convert_from(…, 'UTF8')`
/// on bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    Json,
    Text,
    Bytes,
}

/// A sampled row as an expression reads it.
struct SampledRow<'a> {
    columns: &'a [(String, u32)],
    texts: &'a [Option<String>],
}

impl walfold_expr::Row for SampledRow<'_> {
    fn column(&self, name: &str) -> Option<walfold_expr::Input<'_>> {
        let i = self.columns.iter().position(|(n, _)| n == name)?;
        Some(walfold_expr::Input {
            type_oid: self.columns[i].1,
            text: self.texts[i].as_deref().map(str::as_bytes),
        })
    }
}

/// What `payload` (a column name or an expression) gives on `row`.
fn payload_kind(payload: &str, is_column: bool, row: &SampledRow<'_>) -> PayloadKind {
    let type_oid = if is_column {
        row.columns
            .iter()
            .find(|(n, _)| n == payload)
            .map_or(oid::TEXT, |(_, t)| *t)
    } else {
        match walfold_expr::parse(payload).and_then(|e| e.eval(row)) {
            Ok(walfold_expr::Value::Json(_)) => oid::JSONB,
            Ok(walfold_expr::Value::Bytes(_)) => oid::BYTEA,
            _ => oid::TEXT,
        }
    };
    match type_oid {
        oid::JSON | oid::JSONB => PayloadKind::Json,
        oid::BYTEA => PayloadKind::Bytes,
        _ => PayloadKind::Text,
    }
}

/// Up to `limit` rows of `outbox`'s table (the last ones in the heap first), as the
/// events they are.
pub async fn sample_events(
    client: &Client,
    outbox: &OutboxConfig,
    limit: i64,
) -> Result<Vec<Sampled>, SourceError> {
    let table = outbox
        .table_name()
        .ok_or_else(|| SourceError::MissingTable("a message outbox".into()))?;
    let (columns, relation) = crate::backfill::table_relation(client, &table).await?;
    let columns: Vec<(String, u32)> = columns.into_iter().map(|(n, t, _)| (n, t)).collect();
    let mapping = Mapping::new(outbox, &relation);
    if mapping.missing_required().is_some() || columns.is_empty() {
        return Ok(Vec::new());
    }
    // Each value's text as the stream sends it (a boolean's `t`, not `true`).
    let select: Vec<String> = columns
        .iter()
        .map(|(n, type_oid)| match *type_oid {
            oid::BOOL => format!(
                "case {c} when true then 't' when false then 'f' end",
                c = quote_ident(n)
            ),
            _ => format!("{}::text", quote_ident(n)),
        })
        .collect();
    let sql = format!(
        "select {} from {} order by ctid desc limit $1",
        select.join(", "),
        table.quoted()
    );
    let rows = client
        .query(&sql, &[&limit])
        .await
        .map_err(StoreError::db("sampling the outbox's rows"))?;
    let tx = TxContext {
        commit_lsn: walfold_event::Lsn::ZERO,
        commit_time: None,
    };
    let fields = outbox.fields();
    let Some(payload) = fields.iter().find(|f| f.key == "payload") else {
        return Ok(Vec::new());
    };
    let mut sampled = Vec::new();
    for row in &rows {
        let texts: Vec<Option<String>> = (0..columns.len())
            .map(|i| row.of("the outbox").col(i))
            .collect::<Result<_, _>>()
            .map_err(StoreError::from)?;
        let tuple = Tuple {
            columns: texts
                .iter()
                .map(|t| {
                    t.as_deref()
                        .map_or(Column::Null, |s| Column::Text(s.as_bytes()))
                })
                .collect(),
        };
        let kind = payload_kind(
            payload.value,
            payload.is_column(),
            &SampledRow {
                columns: &columns,
                texts: &texts,
            },
        );
        for event in mapping.map(&tuple, tx, None).into_iter().flatten() {
            sampled.push(Sampled {
                event_type: event.event_type,
                payload: event.payload.to_value(),
                payload_kind: kind,
            });
        }
    }
    Ok(sampled)
}

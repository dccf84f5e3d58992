//! Declarative projections: a compiled template (a `sql` projection, or the generated
//! guarded upsert of a `table` projection), its placeholders bound from the event.

use std::time::SystemTime;

use futures::future::{try_join_all, BoxFuture};
use serde_json::Value;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Transaction;
use walfold_config::{Placeholder, ProjectionKind, Template};
use walfold_store::Event;

use crate::error::ProjectionError;
use crate::projection::{Applied, Projection};

/// A projection defined by a SQL statement.
#[derive(Debug, Clone)]
pub struct SqlProjection {
    template: Template,
    types: Vec<Type>,
    /// `table` projections need a version for their guard.
    requires_version: bool,
}

impl SqlProjection {
    pub fn new(kind: &ProjectionKind) -> SqlProjection {
        let (template, requires_version) = match kind {
            ProjectionKind::Sql(t) => (t.clone(), false),
            ProjectionKind::Table(t) => (t.template.clone(), true),
        };
        let types = template.params.iter().map(pg_type).collect();
        SqlProjection {
            template,
            types,
            requires_version,
        }
    }

    fn bind(&self, event: &Event) -> Result<Vec<Param>, ProjectionError> {
        if self.requires_version && event.version.is_none() {
            return Err(ProjectionError::Invalid(
                "event has no version; a table projection needs one for its guard".into(),
            ));
        }
        Ok(self
            .template
            .params
            .iter()
            .map(|p| param(p, event))
            .collect())
    }
}

fn pg_type(p: &Placeholder) -> Type {
    use walfold_config::ParamType as P;
    match p.param_type() {
        P::Uuid => Type::UUID,
        P::Text => Type::TEXT,
        P::Int8 => Type::INT8,
        P::Jsonb => Type::JSONB,
        P::Timestamptz => Type::TIMESTAMPTZ,
    }
}

/// One bound value.
#[derive(Debug)]
enum Param {
    Uuid(uuid::Uuid),
    Text(Option<String>),
    Int(Option<i64>),
    Json(Option<Value>),
    Time(Option<SystemTime>),
}

impl Param {
    fn as_sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            Param::Uuid(v) => v,
            Param::Text(v) => v,
            Param::Int(v) => v,
            Param::Json(v) => v,
            Param::Time(v) => v,
        }
    }
}

fn param(p: &Placeholder, e: &Event) -> Param {
    match p {
        Placeholder::EventId => Param::Uuid(e.id),
        Placeholder::EventType => Param::Text(Some(e.event_type.clone())),
        Placeholder::AggregateType => Param::Text(Some(e.aggregate_type.clone())),
        Placeholder::AggregateId => Param::Text(Some(e.aggregate_id.clone())),
        Placeholder::Version => Param::Int(e.version),
        Placeholder::Sequence => Param::Int(Some(e.seq)),
        Placeholder::Payload => Param::Json(Some(e.payload.clone())),
        Placeholder::Headers => Param::Json(e.headers.clone()),
        Placeholder::PayloadPath(path) => Param::Text(lookup(Some(&e.payload), path)),
        Placeholder::HeadersPath(path) => Param::Text(lookup(e.headers.as_ref(), path)),
        Placeholder::OccurredAt => Param::Time(e.occurred_at),
    }
}

/// `:payload.a.b` → the value at that path as text (strings unquoted, other values as
/// JSON), `None` when missing or JSON null. A numeric segment indexes an array.
fn lookup(root: Option<&Value>, path: &[String]) -> Option<String> {
    let mut v = root?;
    for key in path {
        v = match v {
            Value::Object(map) => map.get(key)?,
            Value::Array(items) => items.get(key.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

impl SqlProjection {
    async fn run(
        &self,
        tx: &Transaction<'_>,
        params: &[Param],
    ) -> Result<Applied, ProjectionError> {
        let typed: Vec<(&(dyn ToSql + Sync), Type)> = params
            .iter()
            .zip(&self.types)
            .map(|(p, t)| (p.as_sql(), t.clone()))
            .collect();
        let rows = tx.execute_typed(&self.template.sql, &typed).await?;
        Ok(if rows > 0 {
            Applied::Changed
        } else {
            Applied::Stale
        })
    }
}

impl Projection for SqlProjection {
    fn apply<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        event: &'a Event,
    ) -> BoxFuture<'a, Result<Applied, ProjectionError>> {
        Box::pin(async move {
            let params = self.bind(event)?;
            self.run(tx, &params).await
        })
    }

    /// One statement per event, pipelined on the connection: the server runs them in
    /// order, so order per aggregate holds, without a round trip per event.
    fn apply_batch<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        events: &'a [&'a Event],
    ) -> BoxFuture<'a, Result<Vec<Applied>, ProjectionError>> {
        Box::pin(async move {
            let bound: Vec<Vec<Param>> = events
                .iter()
                .map(|e| self.bind(e))
                .collect::<Result<_, _>>()?;
            // Parsed and planned once per batch, not once per event.
            let statement = tx.prepare_typed(&self.template.sql, &self.types).await?;
            try_join_all(bound.iter().map(|params| {
                let statement = &statement;
                async move {
                    let values: Vec<&(dyn ToSql + Sync)> =
                        params.iter().map(Param::as_sql).collect();
                    let rows = tx.execute(statement, &values).await?;
                    Ok::<_, ProjectionError>(if rows > 0 {
                        Applied::Changed
                    } else {
                        Applied::Stale
                    })
                }
            }))
            .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::lookup;
    use serde_json::json;

    #[test]
    fn payload_paths_resolve_to_text_or_null() {
        let v = json!({"a": {"b": "x", "n": 12.5, "arr": [1, {"c": true}], "z": null}});
        let p = |s: &str| s.split('.').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(lookup(Some(&v), &p("a.b")).as_deref(), Some("x"));
        assert_eq!(lookup(Some(&v), &p("a.n")).as_deref(), Some("12.5"));
        assert_eq!(lookup(Some(&v), &p("a.arr.1.c")).as_deref(), Some("true"));
        assert_eq!(lookup(Some(&v), &p("a.z")), None);
        assert_eq!(lookup(Some(&v), &p("a.missing")), None);
        assert_eq!(lookup(None, &p("a")), None);
    }
}

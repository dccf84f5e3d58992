//! Declarative projections: a compiled template (a `sql` projection, or the generated
//! guarded upsert of a `table` projection), its placeholders bound from the event.
//!
//! A batch runs in one round trip: the statement is installed once as a PL/pgSQL
//! function in walfold's schema. It is given the batch's sequence numbers, reads each
//! event's values from the event log itself (so payloads never travel to walfold and
//! back, and event data stays bound values), and executes the statement once per event,
//! in order, with its plan cached. It returns each event's row count: 0 means the version
//! guard (or the statement) found nothing to change.

use futures::future::BoxFuture;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};
use walfold_config::{ParamType, Placeholder, ProjectionKind, Template};
use walfold_store::Event;

use crate::error::ProjectionError;
use crate::projection::{Applied, Projection};

/// A projection defined by a SQL statement.
#[derive(Debug, Clone)]
pub struct SqlProjection {
    schema: String,
    /// The function's name: `apply_` + a hash of its signature and body.
    name: String,
    /// `create function …`
    ddl: String,
    /// `select "schema"."apply_…"($1)`, given the batch's sequence numbers.
    call: String,
    /// `table` projections need a version for their guard.
    requires_version: bool,
}

const VAR: &str = "walfold_v";

impl SqlProjection {
    /// Compiles the projection's function for walfold's `schema`. `returns_rows`: the
    /// statement yields rows (see [`SqlProjection::returns_rows`]).
    pub fn new(
        kind: &ProjectionKind,
        schema: &str,
        returns_rows: bool,
    ) -> Result<SqlProjection, ProjectionError> {
        let (source, requires_version) = match kind {
            ProjectionKind::Sql(t) => (t.source.clone(), false),
            ProjectionKind::Table(t) => (t.template.source.clone(), true),
        };
        let template = Template::compile_with(&source, |n| format!("{VAR}{n}"))
            .map_err(|e| ProjectionError::Invalid(e.to_string()))?;
        let types: Vec<ParamType> = template
            .params
            .iter()
            .map(Placeholder::param_type)
            .collect();
        let statement = template.sql.trim().trim_end_matches(';').trim().to_owned();
        let args = "walfold_seqs int8[]";
        let declare: String = types
            .iter()
            .enumerate()
            .map(|(i, t)| format!("{VAR}{} {}; ", i + 1, sql_type(*t)))
            .collect();
        let assign: String = (1..=types.len())
            .map(|i| format!("{VAR}{i} := walfold_r.walfold_c{i}; "))
            .collect();
        let columns: String = template
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| format!(", {} as walfold_c{}", source_expr(p), i + 1))
            .collect();
        let quoted_schema = walfold_config::quote_ident(schema);
        // A statement that returns rows (RETURNING, SELECT) needs a destination in
        // PL/pgSQL; counting its rows gives the same count `execute` would.
        let run = if returns_rows {
            format!("with walfold_q as (\n{statement}\n) select count(*) into walfold_rows from walfold_q;")
        } else {
            format!("{statement}\n;\nget diagnostics walfold_rows = row_count;")
        };
        let body = format!(
            "#variable_conflict use_column\n\
             declare {declare}walfold_r record; walfold_rows int8; walfold_out int8[] := '{{}}';\n\
             begin\n\
               for walfold_r in select walfold_e.seq{columns} \
                 from {quoted_schema}.event_log walfold_e \
                 where walfold_e.seq between walfold_seqs[1] and walfold_seqs[cardinality(walfold_seqs)] \
                   and walfold_e.seq = any(walfold_seqs) \
                 order by walfold_e.seq loop\n\
                 {assign}\n\
                 {run}\n\
                 walfold_out := walfold_out || walfold_rows;\n\
               end loop;\n\
               return walfold_out;\n\
             end"
        );
        // Generic plans inside: the event read's custom plan always looks cheaper than its
        // generic one, so `auto` would plan it again on every call (+0.1 ms a call
        // measured with pgbench; that is most of a one-event batch).
        let settings = "set plan_cache_mode = force_generic_plan";
        let name = format!("apply_{:016x}", fnv64(&format!("{args}|{settings}|{body}")));
        let qualified = format!("{}.{}", walfold_config::quote_ident(schema), name);
        let tag = format!("$walfold_{name}$");
        if body.contains(&tag) {
            return Err(ProjectionError::Invalid(
                "the statement contains walfold's function quote tag".into(),
            ));
        }
        let ddl = format!(
            "create function {qualified}({args}) returns int8[] language plpgsql {settings} \
             as {tag}{body}{tag}"
        );
        let call = format!("select {qualified}($1)");
        Ok(SqlProjection {
            schema: schema.to_owned(),
            name,
            ddl,
            call,
            requires_version,
        })
    }

    /// Whether the statement yields rows, asked of the server. A statement that cannot
    /// be described yet (e.g. its table does not exist) is taken as returning none; it
    /// then fails per event and is dead-lettered, as any failing statement is.
    pub async fn returns_rows(client: &Client, kind: &ProjectionKind) -> bool {
        let template = match kind {
            ProjectionKind::Sql(t) => t,
            ProjectionKind::Table(t) => &t.template,
        };
        let types: Vec<Type> = template
            .params
            .iter()
            .map(|p| scalar_type(p.param_type()))
            .collect();
        client
            .prepare_typed(&template.sql, &types)
            .await
            .is_ok_and(|s| !s.columns().is_empty())
    }

    async fn run(
        &self,
        tx: &Transaction<'_>,
        events: &[&Event],
    ) -> Result<Vec<Applied>, ProjectionError> {
        if self.requires_version && events.iter().any(|e| e.version.is_none()) {
            return Err(ProjectionError::Invalid(
                "event has no version; a table projection needs one for its guard".into(),
            ));
        }
        let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
        // The function reads the range from the first to the last: events in log order.
        if seqs.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ProjectionError::Invalid(
                "a batch's events must be in log order".into(),
            ));
        }
        let row = tx
            .query_typed_one(&self.call, &[(&seqs, Type::INT8_ARRAY)])
            .await?;
        let counts: Vec<i64> = row.get(0);
        if counts.len() != events.len() {
            // Only when an event is no longer in the log (pruned under the projector).
            return Err(ProjectionError::Invalid(format!(
                "projection function found {} of {} events in the event log",
                counts.len(),
                events.len()
            )));
        }
        Ok(counts
            .into_iter()
            .map(|c| {
                if c > 0 {
                    Applied::Changed
                } else {
                    Applied::Stale
                }
            })
            .collect())
    }
}

fn sql_type(t: ParamType) -> &'static str {
    match t {
        ParamType::Uuid => "uuid",
        ParamType::Text => "text",
        ParamType::Int8 => "int8",
        ParamType::Jsonb => "jsonb",
        ParamType::Timestamptz => "timestamptz",
    }
}

fn scalar_type(t: ParamType) -> Type {
    match t {
        ParamType::Uuid => Type::UUID,
        ParamType::Text => Type::TEXT,
        ParamType::Int8 => Type::INT8,
        ParamType::Jsonb => Type::JSONB,
        ParamType::Timestamptz => Type::TIMESTAMPTZ,
    }
}

/// FNV-1a, 64 bit: a stable name for a function body.
fn fnv64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The SQL that reads a placeholder's value from the event log row `walfold_e`.
/// Paths resolve as `#>>` does: strings unquoted, other values as JSON text, missing
/// or JSON null as NULL; a numeric segment indexes an array.
fn source_expr(p: &Placeholder) -> String {
    let path = |column: &str, path: &[String]| {
        let keys: Vec<String> = path.iter().map(|k| sql_literal(k)).collect();
        format!(
            "(walfold_e.{column} #>> array[{}]::text[])",
            keys.join(", ")
        )
    };
    match p {
        Placeholder::EventId => "walfold_e.event_id".into(),
        Placeholder::EventType => "walfold_e.event_type".into(),
        Placeholder::AggregateType => "walfold_e.aggregate_type".into(),
        Placeholder::AggregateId => "walfold_e.aggregate_id".into(),
        Placeholder::Version => "walfold_e.version".into(),
        Placeholder::Sequence => "walfold_e.seq".into(),
        Placeholder::Payload => "walfold_e.payload".into(),
        Placeholder::Headers => "walfold_e.headers".into(),
        Placeholder::PayloadPath(p) => path("payload", p),
        Placeholder::HeadersPath(p) => path("headers", p),
        Placeholder::OccurredAt => "walfold_e.occurred_at".into(),
    }
}

/// A string literal, as `quote_literal` writes it (whatever `standard_conforming_strings`).
fn sql_literal(s: &str) -> String {
    let quoted = s.replace('\'', "''");
    if quoted.contains('\\') {
        format!("E'{}'", quoted.replace('\\', "\\\\"))
    } else {
        format!("'{quoted}'")
    }
}

impl Projection for SqlProjection {
    /// The function reads the values it binds from the event log.
    fn reads_event_data(&self) -> bool {
        false
    }

    /// Creates the projection's function unless it exists. Its name is a hash of its
    /// body, so an existing one is the same function: nothing is replaced (which would
    /// need the creating role and invalidate other sessions' plans). Concurrent
    /// installers are serialized by an advisory lock.
    fn install<'a>(&'a self, client: &'a mut Client) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(async move {
            let tx = client.transaction().await?;
            tx.execute("select pg_advisory_xact_lock(2003133030)", &[])
                .await?;
            let exists: bool = tx
                .query_one(
                    "select exists (select 1 from pg_proc p join pg_namespace n on n.oid = p.pronamespace \
                     where n.nspname = $1 and p.proname = $2)",
                    &[&self.schema, &self.name],
                )
                .await?
                .get(0);
            if !exists {
                tx.batch_execute(&self.ddl).await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    fn apply<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        event: &'a Event,
    ) -> BoxFuture<'a, Result<Applied, ProjectionError>> {
        Box::pin(async move {
            let applied = self.run(tx, &[event]).await?;
            Ok(applied[0])
        })
    }

    fn apply_batch<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        events: &'a [&'a Event],
    ) -> BoxFuture<'a, Result<Vec<Applied>, ProjectionError>> {
        Box::pin(self.run(tx, events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_function_reads_event_data_from_the_log_as_values() {
        let t = Template::compile(
            "insert into t values (:aggregate_id, ':payload.x', :payload.amount::numeric)",
        )
        .unwrap();
        let p = SqlProjection::new(&ProjectionKind::Sql(t), "walfold", false).unwrap();
        assert!(
            p.ddl
                .contains("values (walfold_v1, ':payload.x', walfold_v2::numeric)"),
            "{}",
            p.ddl
        );
        assert!(p.ddl.contains("(walfold_seqs int8[])"), "{}", p.ddl);
        assert!(
            p.ddl
                .contains("language plpgsql set plan_cache_mode = force_generic_plan as"),
            "{}",
            p.ddl
        );
        assert!(
            p.ddl.contains(
                "walfold_e.aggregate_id as walfold_c1, \
                 (walfold_e.payload #>> array['amount']::text[]) as walfold_c2"
            ),
            "{}",
            p.ddl
        );
        assert!(
            p.ddl.contains("from \"walfold\".event_log walfold_e where"),
            "{}",
            p.ddl
        );
        assert_eq!(p.call, format!("select \"walfold\".{}($1)", p.name));
        let select = Template::compile("select pg_notify('x', :event_type) -- trailing").unwrap();
        let p = SqlProjection::new(&ProjectionKind::Sql(select), "walfold", true).unwrap();
        assert!(
            p.ddl.contains(
                "with walfold_q as (\nselect pg_notify('x', walfold_v1) -- trailing\n) select count(*) into walfold_rows"
            ),
            "{}",
            p.ddl
        );
    }

    #[test]
    fn path_keys_are_quoted_as_literals() {
        assert_eq!(sql_literal("a"), "'a'");
        assert_eq!(sql_literal("it's"), "'it''s'");
        assert_eq!(sql_literal(r"a\b'"), r"E'a\\b'''");
        let p = Placeholder::HeadersPath(vec!["trace".into(), "0".into()]);
        assert_eq!(
            source_expr(&p),
            "(walfold_e.headers #>> array['trace', '0']::text[])"
        );
    }
}

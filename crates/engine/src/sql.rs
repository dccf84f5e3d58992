//! Declarative projections: a compiled template (a `sql` projection, or the generated
//! guarded upsert of a `table` projection), its placeholders bound from the event.
//!
//! A batch runs in one round trip: the statement is installed once as a PL/pgSQL
//! function in walfold's schema that loops over the batch's events (passed as arrays,
//! so event data stays bound values) and executes the statement once per event, in
//! order, with its plan cached. It returns each event's row count: 0 means the version
//! guard (or the statement) found nothing to change.
//!
//! Whether the statement returns rows decides the function's body, and only the server
//! can say: it is asked at install, and an install that cannot ask (the table is missing,
//! a right is revoked) fails with that error, so the projection pauses instead of
//! compiling a guess.
//!
//! A `table` projection also applies a batch in rounds ([`Rounds`]): round k holds the
//! k-th event of each key, so no key appears twice in a round, and one set-based upsert
//! applies a round, returning which events changed a row. Each key still sees its events
//! in log order behind the same guard, so outcomes are the per-event ones wherever
//! events of different keys cannot see each other. Install checks that from the catalog
//! against an allow-list ([`FITS_ROUNDS`]) and keeps the loop otherwise. A round that
//! fails fails the batch, which the projector then applies one event at a time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use futures::future::BoxFuture;
use serde_json::Value;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Transaction};
use uuid::Uuid;
use walfold_config::{ParamType, Placeholder, Statement, Template, Upsert};
use walfold_event::{Event, JsonText};
use walfold_pg::RowExt;
use walfold_store::Schema;

use crate::error::ProjectionError;
use crate::projection::{Applied, Projection};

/// A projection defined by a SQL statement.
#[derive(Debug)]
pub struct SqlProjection {
    schema: Schema,
    /// The statement as written, with numbered parameters (for the install probe).
    probe: String,
    probe_types: Vec<Type>,
    params: Vec<Placeholder>,
    /// The function for a statement that returns no rows, and for one that does.
    variants: [Compiled; 2],
    /// Which variant install chose: 0 none yet, 1 + the index otherwise.
    chosen: AtomicU8,
    call_types: Vec<Type>,
    /// `table` projections need a version for their guard.
    requires_version: bool,
    /// A `table` projection's upsert, for applying rounds set-based.
    upsert: Option<Upsert>,
    /// The round statement, when install found the table fit for it.
    rounds: RwLock<Option<Arc<Rounds>>>,
}

/// A round's statement: the upsert of many events with distinct keys at once, returning
/// the (1-based) positions of the events that changed a row.
#[derive(Debug)]
struct Rounds {
    sql: String,
    types: Vec<Type>,
    params: Vec<Placeholder>,
}

/// Rounds beyond this many (a key with more events in the batch) go through the loop.
const SET_ROUNDS: usize = 4;

/// One compiled apply function.
#[derive(Debug, Clone)]
struct Compiled {
    /// The function's name: `apply_` + a hash of its signature and body.
    name: String,
    /// `create function …`
    ddl: String,
    /// `select "schema"."apply_…"($1, $2::uuid[], …)`
    call: String,
}

const VAR: &str = "walfold_v";

impl SqlProjection {
    /// Compiles the projection's functions for walfold's `schema`.
    pub fn new(statement: &Statement, schema: &Schema) -> Result<SqlProjection, ProjectionError> {
        let (template, upsert) = match statement {
            Statement::Sql(t) => (t, None),
            Statement::Table(t) => (&t.template, Some(t.upsert.clone())),
        };
        let compiled = Template::compile_with(&template.source, |n| format!("{VAR}{n}"))
            .map_err(|e| ProjectionError::Invalid(e.to_string()))?;
        let types: Vec<ParamType> = compiled
            .params
            .iter()
            .map(Placeholder::param_type)
            .collect();
        let statement = compiled.sql.trim().trim_end_matches(';').trim().to_owned();
        let variants = [
            compile(schema, &types, &statement, false)?,
            compile(schema, &types, &statement, true)?,
        ];
        let call_types = std::iter::once(Type::INT4)
            .chain(types.iter().map(|t| array_type(*t)))
            .collect();
        Ok(SqlProjection {
            schema: schema.clone(),
            probe: template.sql.clone(),
            probe_types: types.iter().map(|t| scalar_type(*t)).collect(),
            params: compiled.params,
            variants,
            chosen: AtomicU8::new(0),
            call_types,
            requires_version: upsert.is_some(),
            upsert,
            rounds: RwLock::new(None),
        })
    }

    /// The statement as written, with numbered parameters and their types: what
    /// `install` asks the server to describe.
    pub fn probe(&self) -> (String, Vec<Type>) {
        (self.probe.clone(), self.probe_types.clone())
    }

    /// Whether the last install found the table fit to apply batches in rounds.
    pub fn applies_in_rounds(&self) -> bool {
        self.rounds.read().is_ok_and(|r| r.is_some())
    }

    fn installed(&self) -> Result<&Compiled, ProjectionError> {
        match self.chosen.load(Ordering::Acquire) {
            0 => Err(ProjectionError::NotInstalled),
            i => Ok(&self.variants[usize::from(i - 1)]),
        }
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
        let rounds = self.rounds.read().map(|r| r.clone()).unwrap_or(None);
        match rounds {
            Some(rounds) if !events.is_empty() => self.run_rounds(&rounds, tx, events).await,
            _ => self.run_loop(tx, events).await,
        }
    }

    /// The first [`SET_ROUNDS`] rounds set-based, then what is left through the loop, in
    /// log order: each key's events stay in order, each behind the guard.
    async fn run_rounds(
        &self,
        rounds: &Rounds,
        tx: &Transaction<'_>,
        events: &[&Event],
    ) -> Result<Vec<Applied>, ProjectionError> {
        let mut out = vec![Applied::Stale; events.len()];
        let (set_based, rest) = split_rounds(events);
        for members in set_based {
            let round: Vec<&Event> = members.iter().map(|&i| events[i]).collect();
            for position in rounds.apply(tx, &round).await? {
                let i = usize::try_from(position - 1)
                    .ok()
                    .and_then(|k| members.get(k))
                    .ok_or_else(|| {
                        ProjectionError::Invalid(format!(
                            "the round statement returned position {position} of {}",
                            round.len()
                        ))
                    })?;
                out[*i] = Applied::Changed;
            }
        }
        if !rest.is_empty() {
            let tail: Vec<&Event> = rest.iter().map(|&i| events[i]).collect();
            for (i, applied) in rest.into_iter().zip(self.run_loop(tx, &tail).await?) {
                out[i] = applied;
            }
        }
        Ok(out)
    }

    /// The batch through the installed function, one statement per event.
    async fn run_loop(
        &self,
        tx: &Transaction<'_>,
        events: &[&Event],
    ) -> Result<Vec<Applied>, ProjectionError> {
        let n = i32::try_from(events.len())
            .map_err(|_| ProjectionError::Invalid("batch too large".into()))?;
        let columns: Vec<Column> = self.params.iter().map(|p| column(p, events)).collect();
        let mut values: Vec<(&(dyn ToSql + Sync), Type)> = vec![(&n, self.call_types[0].clone())];
        for (c, t) in columns.iter().zip(&self.call_types[1..]) {
            values.push((c.as_sql(), t.clone()));
        }
        let row = tx.query_typed_one(&self.installed()?.call, &values).await?;
        let counts: Vec<i64> = row.of("the projection function").col(0)?;
        if counts.len() != events.len() {
            return Err(ProjectionError::Invalid(format!(
                "projection function returned {} results for {} events",
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

    /// Whether rounds may replace the loop for this table, from the catalog: only where
    /// events of different keys cannot observe each other's order. `None` keeps the loop.
    async fn rounds_for(
        &self,
        client: &Client,
        upsert: &Upsert,
    ) -> Result<Option<Rounds>, ProjectionError> {
        let calls = called_functions(&upsert.values[2..]);
        let Some(calls) = calls else {
            return Ok(None);
        };
        let row = match client
            .query_one(FITS_ROUNDS, &[&upsert.table, &upsert.key_column, &calls])
            .await
        {
            Ok(row) => row,
            Err(e) => {
                tracing::warn!(table = %upsert.table, error = %e, "could not read the table's catalog: applying events one statement each");
                return Ok(None);
            }
        };
        let obstacle: Option<String> = row.of("pg_class").col(0)?;
        if let Some(obstacle) = obstacle {
            tracing::info!(table = %upsert.table, %obstacle, "applying events one statement each");
            return Ok(None);
        }
        let rounds = Rounds::compile(upsert)?;
        // Types resolve differently in a select than in a values list: a statement the
        // server cannot plan keeps the loop.
        if let Err(e) = client.prepare_typed(&rounds.sql, &rounds.types).await {
            tracing::info!(table = %upsert.table, error = %e, "applying events one statement each");
            return Ok(None);
        }
        Ok(Some(rounds))
    }
}

/// The positions in `events` of each round applied set-based (round k: the k-th event of
/// each key, at most [`SET_ROUNDS`] rounds), and of the events after them, in log order.
fn split_rounds(events: &[&Event]) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(events.len());
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    let mut rest = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let k = seen.entry(e.aggregate_id.as_str()).or_insert(0);
        match rounds.get_mut(*k) {
            Some(round) => round.push(i),
            None if *k < SET_ROUNDS => rounds.push(vec![i]),
            None => rest.push(i),
        }
        *k += 1;
    }
    (rounds, rest)
}

/// What could make applying by rounds differ from applying in log order, for the table
/// `$1` (quoted name) with key column `$2` and the functions `$3` its columns call: the
/// first obstacle found, if any. An allow-list: a plain or
/// partitioned table whose key is `text` compared byte for byte (a type or collation that
/// folds two ids into one row would put them in one round), nothing that sees other rows
/// or the order of rows (triggers, row security, other unique indexes, a reference to
/// itself) and nothing evaluated per row that is not immutable (defaults, identity,
/// generated columns, check constraints, the columns' functions), except the
/// transaction's timestamp.
const FITS_ROUNDS: &str = "\
with tree as (select $1::text::regclass as relid \
              union select relid from pg_partition_tree($1::text::regclass)), \
key as (select a.* from pg_attribute a \
        where a.attrelid = $1::text::regclass and a.attname = $2 and not a.attisdropped), \
deterministic as (select 0::oid as oid union select oid from pg_collation where collisdeterministic), \
per_row as (select m[1]::oid as fn from ( \
              select ad.adbin::text as expr from pg_attrdef ad join tree on ad.adrelid = tree.relid \
              union all select c.conbin::text from pg_constraint c join tree on c.conrelid = tree.relid \
              where c.conbin is not null) e, \
            regexp_matches(e.expr, ':(?:funcid|opfuncid) (\\d+)', 'g') m) \
select case \
    when (select relkind from pg_class where oid = $1::text::regclass) not in ('r', 'p') \
      then 'not a table' \
    when not exists (select 1 from key where atttypid = 'text'::regtype \
                     and attcollation in (select oid from deterministic)) \
      then 'a key that is not text with a deterministic collation' \
    when exists (select 1 from pg_trigger t join tree on t.tgrelid = tree.relid \
                 where not t.tgisinternal) then 'a trigger' \
    when exists (select 1 from pg_class c join tree on c.oid = tree.relid \
                 where c.relrowsecurity) then 'row-level security' \
    when exists (select 1 from pg_index i join tree on i.indrelid = tree.relid \
                 where (i.indisunique or i.indisexclusion) and not ( \
                   i.indisunique and i.indnkeyatts = 1 and i.indexprs is null \
                   and i.indpred is null and i.indcollation[0] in (select oid from deterministic) \
                   and exists (select 1 from pg_attribute a \
                     where a.attrelid = i.indrelid and a.attnum = i.indkey[0] and a.attname = $2))) \
      then 'a unique index or exclusion constraint beyond the key' \
    when exists (select 1 from pg_constraint c where c.contype = 'f' \
                 and c.conrelid in (select relid from tree) \
                 and c.confrelid in (select relid from tree)) then 'a foreign key to itself' \
    when exists (select 1 from pg_attribute a join tree on a.attrelid = tree.relid \
                 where a.attidentity <> '' and not a.attisdropped) then 'an identity column' \
    when exists (select 1 from pg_proc p where (p.oid in (select fn from per_row) \
                   or p.proname = any($3::text[])) \
                 and p.provolatile <> 'i' and p.proname not in ('now', 'transaction_timestamp')) \
      then 'a function that is not immutable in a column, default or check' \
  end";

/// Words that start a subquery or a row source inside an expression.
const SUBQUERY: [&str; 4] = ["select", "table", "values", "with"];

/// The functions `expressions` call (names before `(`, outside quotes, lower-cased
/// unless quoted), or `None` when one holds a subquery or what this scan cannot read
/// for sure (a `$`: dollar quotes or parameters; a backslash: escapes).
fn called_functions(expressions: &[String]) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for expr in expressions {
        let chars: Vec<char> = expr.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c == '$' || c == '\\' {
                return None;
            }
            let (word, next) = if c == '\'' {
                let end = (i + 1..chars.len()).find(|&j| chars[j] == '\'')?;
                i = end + 1;
                continue;
            } else if c == '"' {
                let end = (i + 1..chars.len()).find(|&j| chars[j] == '"')?;
                (chars[i + 1..end].iter().collect::<String>(), end + 1)
            } else if c.is_alphabetic() || c == '_' {
                let end = (i..chars.len())
                    .find(|&j| !(chars[j].is_alphanumeric() || chars[j] == '_'))
                    .unwrap_or(chars.len());
                (chars[i..end].iter().collect::<String>().to_lowercase(), end)
            } else {
                i += 1;
                continue;
            };
            if c != '"' && SUBQUERY.contains(&word.as_str()) {
                return None;
            }
            let after = (next..chars.len()).find(|&j| !chars[j].is_whitespace());
            if after.is_some_and(|j| chars[j] == '(') {
                names.push(word);
            }
            i = next;
        }
    }
    Some(names)
}

impl Rounds {
    /// `with walfold_ins as (insert … select … from unnest(…) on conflict … returning key)
    /// select` the positions whose key came back (a `text` key: compared as written).
    fn compile(upsert: &Upsert) -> Result<Rounds, ProjectionError> {
        let values =
            Template::compile_with(&upsert.values.join(", "), |n| format!("walfold_u.{VAR}{n}"))
                .map_err(|e| ProjectionError::Invalid(e.to_string()))?;
        let key_param = values
            .params
            .iter()
            .position(|p| *p == Placeholder::AggregateId)
            .ok_or_else(|| ProjectionError::Invalid("the upsert has no key".into()))?;
        let types: Vec<ParamType> = values.params.iter().map(Placeholder::param_type).collect();
        let args: Vec<String> = types
            .iter()
            .enumerate()
            .map(|(i, t)| format!("${}::{}[]", i + 1, sql_type(*t)))
            .collect();
        let vars: Vec<String> = (1..=types.len()).map(|i| format!("{VAR}{i}")).collect();
        let sql = format!(
            "with walfold_ins as (insert into {table} as current_row ({names}) \
             select {values} from unnest({args}) with ordinality as walfold_u({vars}, walfold_ord) \
             order by walfold_u.walfold_ord {conflict} returning current_row.{key} as walfold_k) \
             select coalesce(array_agg(walfold_s.walfold_ord order by walfold_s.walfold_ord), '{{}}')::int8[] \
             from unnest(${k}::text[]) with ordinality as walfold_s(walfold_k, walfold_ord) \
             join walfold_ins on walfold_ins.walfold_k = walfold_s.walfold_k",
            table = upsert.table,
            names = upsert.names.join(", "),
            values = values.sql,
            args = args.join(", "),
            vars = vars.join(", "),
            conflict = upsert.conflict,
            key = upsert.key,
            k = key_param + 1,
        );
        Ok(Rounds {
            sql,
            types: types.iter().map(|t| array_type(*t)).collect(),
            params: values.params,
        })
    }

    /// Applies one round (no key twice): the 1-based positions of the events that changed
    /// a row; the others were stale.
    async fn apply(
        &self,
        tx: &Transaction<'_>,
        events: &[&Event],
    ) -> Result<Vec<i64>, ProjectionError> {
        let columns: Vec<Column> = self.params.iter().map(|p| column(p, events)).collect();
        let values: Vec<(&(dyn ToSql + Sync), Type)> = columns
            .iter()
            .zip(&self.types)
            .map(|(c, t)| (c.as_sql(), t.clone()))
            .collect();
        let row = tx.query_typed_one(&self.sql, &values).await?;
        Ok(row.of("the round").col(0)?)
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

fn array_type(t: ParamType) -> Type {
    match t {
        ParamType::Uuid => Type::UUID_ARRAY,
        ParamType::Text => Type::TEXT_ARRAY,
        ParamType::Int8 => Type::INT8_ARRAY,
        ParamType::Jsonb => Type::JSONB_ARRAY,
        ParamType::Timestamptz => Type::TIMESTAMPTZ_ARRAY,
    }
}

/// The apply function for `statement`: a loop over the batch that runs it once per event;
/// `returns_rows` counts the rows it yields instead of the rows it changed.
fn compile(
    schema: &Schema,
    types: &[ParamType],
    statement: &str,
    returns_rows: bool,
) -> Result<Compiled, ProjectionError> {
    let args: Vec<String> = std::iter::once("walfold_n int".to_owned())
        .chain(
            types
                .iter()
                .enumerate()
                .map(|(i, t)| format!("walfold_a{} {}[]", i + 1, sql_type(*t))),
        )
        .collect();
    let declare: String = types
        .iter()
        .enumerate()
        .map(|(i, t)| format!("{VAR}{} {}; ", i + 1, sql_type(*t)))
        .collect();
    let assign: String = (1..=types.len())
        .map(|i| format!("{VAR}{i} := walfold_a{i}[walfold_i]; "))
        .collect();
    // A statement that returns rows (RETURNING, SELECT) needs a destination in
    // PL/pgSQL; counting its rows gives the same count `execute` would.
    let run = if returns_rows {
        format!(
            "with walfold_q as (\n{statement}\n) select count(*) into walfold_rows from walfold_q;"
        )
    } else {
        format!("{statement}\n;\nget diagnostics walfold_rows = row_count;")
    };
    let body = format!(
        "#variable_conflict use_column\n\
         declare {declare}walfold_rows int8; walfold_out int8[] := '{{}}';\n\
         begin\n\
           for walfold_i in 1 .. walfold_n loop\n\
             {assign}\n\
             {run}\n\
             walfold_out := walfold_out || walfold_rows;\n\
           end loop;\n\
           return walfold_out;\n\
         end"
    );
    let name = format!(
        "apply_{:016x}",
        fnv64(&format!("{}|{body}", args.join(",")))
    );
    let qualified = format!("{}.{}", schema.quoted(), name);
    let tag = format!("$walfold_{name}$");
    if body.contains(&tag) {
        return Err(ProjectionError::Invalid(
            "the statement contains walfold's function quote tag".into(),
        ));
    }
    let ddl = format!(
        "create function {qualified}({}) returns int8[] language plpgsql as {tag}{body}{tag}",
        args.join(", ")
    );
    let call_args: Vec<String> = (1..=types.len() + 1).map(|i| format!("${i}")).collect();
    let call = format!("select {qualified}({})", call_args.join(", "));
    Ok(Compiled { name, ddl, call })
}

/// FNV-1a, 64 bit: a stable name for a function body.
fn fnv64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// One placeholder's values over a batch; payloads borrowed, never copied.
enum Column<'a> {
    Uuid(Vec<Uuid>),
    Text(Vec<Option<String>>),
    Int(Vec<Option<i64>>),
    Json(Vec<Option<&'a JsonText>>),
    Time(Vec<Option<SystemTime>>),
}

impl Column<'_> {
    fn as_sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            Column::Uuid(v) => v,
            Column::Text(v) => v,
            Column::Int(v) => v,
            Column::Json(v) => v,
            Column::Time(v) => v,
        }
    }
}

fn column<'a>(p: &Placeholder, events: &[&'a Event]) -> Column<'a> {
    let text =
        |f: &dyn Fn(&Event) -> Option<String>| Column::Text(events.iter().map(|e| f(e)).collect());
    match p {
        Placeholder::EventId => Column::Uuid(events.iter().map(|e| e.id).collect()),
        Placeholder::EventType => text(&|e| Some(e.event_type.clone())),
        Placeholder::AggregateType => text(&|e| Some(e.aggregate_type.clone())),
        Placeholder::AggregateId => text(&|e| Some(e.aggregate_id.clone())),
        Placeholder::Version => Column::Int(events.iter().map(|e| e.version).collect()),
        Placeholder::Sequence => Column::Int(events.iter().map(|e| Some(e.seq)).collect()),
        Placeholder::Source => text(&|e| Some(e.source.clone())),
        Placeholder::Payload => Column::Json(events.iter().map(|e| Some(&e.payload)).collect()),
        Placeholder::Headers => Column::Json(events.iter().map(|e| e.headers.as_ref()).collect()),
        Placeholder::PayloadPath(path) => text(&|e| lookup(Some(&e.payload), path)),
        Placeholder::HeadersPath(path) => text(&|e| lookup(e.headers.as_ref(), path)),
        Placeholder::OccurredAt => Column::Time(events.iter().map(|e| e.occurred_at).collect()),
    }
}

/// `:payload.a.b` → the value at that path as text (strings unquoted, other values as
/// JSON), `None` when missing or JSON null. A numeric segment indexes an array. Only
/// that part of the document is parsed.
fn lookup(root: Option<&JsonText>, path: &[String]) -> Option<String> {
    as_text(root?.pointer(path))
}

/// A value bound as text: strings unquoted, other values as JSON, null as null.
fn as_text(v: Option<Value>) -> Option<String> {
    match v? {
        Value::Null => None,
        Value::String(s) => Some(s),
        other => Some(other.to_string()),
    }
}

impl Projection for SqlProjection {
    /// The statement runs in the engine's transaction (what it calls is the user's:
    /// a sequence it advances stays advanced when a batch is rolled back).
    fn writes_only_through_tx(&self) -> bool {
        true
    }

    /// Asks the server whether the statement returns rows (it fails like the statement
    /// would when its table or a right is missing), then creates the matching function
    /// unless it exists. Its name is a hash of its body, so an existing one is the same
    /// function: nothing is replaced (which would need the creating role and invalidate
    /// other sessions' plans). Concurrent installers are serialized by an advisory lock.
    fn install<'a>(&'a self, client: &'a mut Client) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(async move {
            let described = client.prepare_typed(&self.probe, &self.probe_types).await?;
            let index = usize::from(!described.columns().is_empty());
            let compiled = &self.variants[index];
            let tx = client.transaction().await?;
            tx.execute("select pg_advisory_xact_lock(2003133030)", &[])
                .await?;
            let exists: bool = tx
                .query_one(
                    "select exists (select 1 from pg_proc p join pg_namespace n on n.oid = p.pronamespace \
                     where n.nspname = $1 and p.proname = $2)",
                    &[&self.schema.name(), &compiled.name],
                )
                .await?
                .of("pg_proc")
                .col(0)?;
            if !exists {
                tx.batch_execute(&compiled.ddl).await?;
            }
            tx.commit().await?;
            self.chosen.store(index as u8 + 1, Ordering::Release);
            let rounds = match &self.upsert {
                Some(upsert) => self.rounds_for(client, upsert).await?.map(Arc::new),
                None => None,
            };
            if let Ok(mut slot) = self.rounds.write() {
                *slot = rounds;
            }
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
    fn payload_paths_resolve_to_text_or_null() {
        let v =
            JsonText::parse(r#"{"a": {"b": "x", "n": 12.5, "arr": [1, {"c": true}], "z": null}}"#)
                .unwrap();
        let p = |s: &str| s.split('.').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(lookup(Some(&v), &p("a.b")).as_deref(), Some("x"));
        assert_eq!(lookup(Some(&v), &p("a.n")).as_deref(), Some("12.5"));
        assert_eq!(lookup(Some(&v), &p("a.arr.1.c")).as_deref(), Some("true"));
        assert_eq!(lookup(Some(&v), &p("a.z")), None);
        assert_eq!(lookup(Some(&v), &p("a.missing")), None);
        assert_eq!(lookup(None, &p("a")), None);
    }

    #[test]
    fn the_function_binds_event_data_as_arguments() {
        let t = Template::compile(
            "insert into t values (:aggregate_id, ':payload.x', :payload.amount::numeric)",
        )
        .unwrap();
        let p = SqlProjection::new(&Statement::Sql(t), &Schema::new("walfold")).unwrap();
        let plain = &p.variants[0];
        assert!(
            plain
                .ddl
                .contains("values (walfold_v1, ':payload.x', walfold_v2::numeric)"),
            "{}",
            plain.ddl
        );
        assert!(
            plain.ddl.contains("walfold_a1 text[], walfold_a2 text[]"),
            "{}",
            plain.ddl
        );
        assert!(
            plain.call.starts_with("select \"walfold\".apply_"),
            "{}",
            plain.call
        );
        assert_eq!(p.call_types.len(), 3);
        assert!(matches!(p.installed(), Err(ProjectionError::NotInstalled)));
        let select = Template::compile("select pg_notify('x', :event_type) -- trailing").unwrap();
        let p = SqlProjection::new(&Statement::Sql(select), &Schema::new("walfold")).unwrap();
        assert!(
            p.variants[1].ddl.contains(
                "with walfold_q as (\nselect pg_notify('x', walfold_v1) -- trailing\n) select count(*) into walfold_rows"
            ),
            "{}",
            p.variants[1].ddl
        );
    }
}

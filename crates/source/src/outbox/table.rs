//! A table outbox's rows as events: each field read from its column or evaluated as an
//! expression over the row, `where` and `expand` applied ([`Mapping`]).

use std::borrow::Cow;

use serde_json::{Map, Value};
use uuid::Uuid;
use walfold_config::{OutboxConfig, QualifiedName};
use walfold_event::{producer_event_id, DeadLetter, JsonText, NewEvent, Reason, RowOrigin};
use walfold_expr::{Expr, Input, Value as ExprValue};
use walfold_pgoutput::{oid, Column, Relation, Tuple};

use super::limits::{refuse_nul, too_large, unreadable_fix, unreadable_type, SMALL};
use super::{
    build, identity_of, kind, names, rejected, truncate, Fields, Names, TxContext, ID, OCCURRED_AT,
};

/// The pseudo-column an `expand` element is read by.
pub const ELEMENT: &str = "element";

/// The columns a field's value reads: itself when it is a column name, else its
/// expression's (`None`: it does not parse, which validation refuses first).
pub fn columns_read(value: &str, is_column: bool) -> Option<Vec<String>> {
    if is_column {
        return Some(vec![value.to_owned()]);
    }
    let expr = walfold_expr::parse(value).ok()?;
    Some(expr.columns().into_iter().map(str::to_owned).collect())
}

/// Where a field's value is read in a row.
#[derive(Debug, Clone)]
enum Source {
    /// Not in the table: an optional field left at its default name (or a required one
    /// whose column is gone: [`Mapping::missing_required`]).
    Absent,
    /// A column, by its index: read as it comes, nothing evaluated.
    Column(usize),
    /// An expression over the row's columns (and `element`).
    Expr(Box<Expr>),
    /// `aggregate_type` left out of a table without such a column: the table's name.
    Constant(String),
}

/// What a row becomes.
#[derive(Debug)]
pub enum Mapped {
    /// `where` is not true for it: no event, no dead letter.
    Filtered,
    /// One event, or the dead letter it is instead.
    One(Result<NewEvent, Box<DeadLetter>>),
    /// `expand`: one per element, in order (a dead letter for an element that is none).
    Each(Vec<Result<NewEvent, Box<DeadLetter>>>),
}

impl Mapped {
    /// The one outcome of a row that is neither filtered nor expanded.
    pub fn one(self) -> Option<Result<NewEvent, Box<DeadLetter>>> {
        match self {
            Mapped::One(r) => Some(r),
            Mapped::Filtered | Mapped::Each(_) => None,
        }
    }
}

impl IntoIterator for Mapped {
    type Item = Result<NewEvent, Box<DeadLetter>>;
    type IntoIter = std::iter::Chain<
        std::option::IntoIter<Result<NewEvent, Box<DeadLetter>>>,
        std::vec::IntoIter<Result<NewEvent, Box<DeadLetter>>>,
    >;

    fn into_iter(self) -> Self::IntoIter {
        let (one, each) = match self {
            Mapped::Filtered => (None, Vec::new()),
            Mapped::One(r) => (Some(r), Vec::new()),
            Mapped::Each(v) => (None, v),
        };
        one.into_iter().chain(each)
    }
}

/// How a table outbox's rows become events, compiled for one relation (as announced by
/// its Relation message, or read from the catalog).
#[derive(Debug, Clone)]
pub struct Mapping {
    pub table: QualifiedName,
    /// `table` as text: what derived event IDs are scoped to.
    scope: String,
    columns: Vec<(String, u32)>,
    /// Each field's source; `id` is `ids` (one, or a composite's parts).
    fields: [Source; 8],
    ids: Vec<Source>,
    /// `where` (a preset's, then the config's): rows for which one is not true are no
    /// events.
    filters: Vec<Expr>,
    /// `expand`: one event per element of the JSON array it gives.
    expand: Option<Box<Expr>>,
    names: Names,
    /// The config's text of each id part, for reasons.
    id_names: Vec<String>,
    keys: [&'static str; 8],
    /// A field set in the config (or required) whose column the table does not have:
    /// (config key, column).
    missing: Option<(&'static str, String)>,
    /// `pipeline.max_event_bytes`.
    max_bytes: usize,
    /// [`Mapping::unreadable`], found once: every row of the relation asks.
    unreadable: Option<crate::error::Refusal>,
}

impl Mapping {
    /// `config` is a table outbox (validated: its expressions parse).
    pub fn new(config: &OutboxConfig, relation: &Relation) -> Mapping {
        let columns: Vec<(String, u32)> = relation
            .columns
            .iter()
            .map(|c| (c.name.clone(), c.type_oid))
            .collect();
        let table = config.table_name().unwrap_or_else(|| QualifiedName {
            schema: relation.namespace.clone(),
            name: relation.name.clone(),
        });
        let position = |name: &str| columns.iter().position(|c| c.0 == name);
        let expanding = config.set("expand").is_some();
        let mut fields: [Source; 8] = std::array::from_fn(|_| Source::Absent);
        let mut ids = Vec::new();
        let mut id_names = Vec::new();
        let mut filters = Vec::new();
        let mut expand = None;
        for f in config.fields() {
            // `element` alone, with expand: the element itself, not a column.
            let element = expanding && f.key != "expand" && f.value == ELEMENT;
            let source = if f.is_column() && !element {
                match position(f.value) {
                    Some(i) => Source::Column(i),
                    None if f.key == "aggregate_type" && !f.set => {
                        // Left out, and the table has no such column: its name.
                        Source::Constant(table.name.clone())
                    }
                    None => Source::Absent,
                }
            } else {
                match walfold_expr::parse(f.value) {
                    Ok(expr) => Source::Expr(Box::new(expr)),
                    // Refused at load; a mapping made without validation reads nothing.
                    Err(_) => Source::Absent,
                }
            };
            match f.key {
                "id" => {
                    ids.push(source);
                    id_names.push(f.value.to_owned());
                }
                "where" | "expand" => {
                    let Source::Expr(e) = source else {
                        // A bare name: a boolean column, or a JSON array column.
                        let expr = walfold_expr::parse(&walfold_config::quote_ident(f.value))
                            .ok()
                            .map(Box::new);
                        if f.key == "where" {
                            filters.extend(expr.map(|e| *e));
                        } else {
                            expand = expr;
                        }
                        continue;
                    };
                    if f.key == "where" {
                        filters.push(*e);
                    } else {
                        expand = Some(e);
                    }
                }
                key => {
                    if let Some(i) = OutboxConfig::KEYS.iter().position(|k| *k == key) {
                        fields[i] = source;
                    }
                }
            }
        }
        // The first column a field cannot do without that the relation lacks.
        let column_names: Vec<&str> = columns.iter().map(|(n, _)| n.as_str()).collect();
        let reads = crate::field_columns::field_columns(config, &column_names);
        let missing = reads
            .iter()
            .find(|r| r.at.is_none() && r.required())
            .map(|r| (r.field.key, r.column.clone()));
        // A field whose column walfold cannot read (a large object's `oid`), whether the
        // field names it or an expression (`where`, `expand` included) reads it.
        let unreadable = reads.iter().find_map(|r| {
            let (column, type_oid) = &columns[r.at?];
            let why = unreadable_type(*type_oid)?;
            Some(crate::error::Refusal {
                problem: format!(
                    "outbox table {table} column `{column}` (outbox.{}) {why}",
                    r.field.key
                ),
                fix: unreadable_fix(&format!("outbox.{}", r.field.key)),
            })
        });
        Mapping {
            scope: config.id_scope(),
            table,
            columns,
            fields,
            ids,
            filters,
            expand,
            names: names(config),
            id_names,
            keys: OutboxConfig::KEYS,
            missing,
            max_bytes: usize::MAX,
            unreadable,
        }
    }

    /// A row larger than `max_bytes` becomes a `too_large` dead letter.
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Mapping {
        self.max_bytes = max_bytes;
        self
    }

    /// The relation's columns, for messages: `(id, kind, body)`.
    pub fn column_names(&self) -> String {
        let names: Vec<&str> = self.columns.iter().map(|(n, _)| n.as_str()).collect();
        format!("({})", names.join(", "))
    }

    /// A field whose column walfold cannot read (a large object's `oid`), whether the
    /// field names it or an expression (`where`, `expand` included) reads it: the
    /// refusal, naming the config key, the column and why.
    pub fn unreadable(&self) -> Option<crate::error::Refusal> {
        self.unreadable.clone()
    }

    /// A field set in the config (or required) that reads a column the table does not
    /// have: (config key, column).
    pub fn missing_required(&self) -> Option<(&'static str, String)> {
        self.missing.clone()
    }

    /// Maps an inserted row read at `origin`: no event (`where`), one, or one per
    /// element (`expand`); a row or element that cannot be an event comes back as a
    /// dead letter.
    pub fn map(&self, row: &Tuple<'_>, tx: TxContext, origin: Option<RowOrigin>) -> Mapped {
        let fields = RowFields {
            mapping: self,
            row,
            element: None,
        };
        let size: usize = row
            .columns
            .iter()
            .map(|c| match c {
                Column::Text(b) | Column::Binary(b) => b.len(),
                Column::Null | Column::Unchanged => 0,
            })
            .sum();
        if size > self.max_bytes {
            let error = too_large("row", size, self.max_bytes);
            let mut dead = rejected(&fields, error, self.raw(row, SMALL), tx, origin);
            dead.reason = Reason::TooLarge;
            return Mapped::One(Err(dead));
        }
        let reject = |f: &RowFields<'_, '_>, error: String, raw: Value, origin| {
            Err(rejected(f, error, raw, tx, origin))
        };
        for filter in &self.filters {
            let kept = filter
                .eval(&fields)
                .map_err(|e| format!("where (`{}`): {e}", filter.source()))
                .and_then(|v| match v {
                    ExprValue::Null => Ok(false),
                    v => v.as_bool().ok_or_else(|| {
                        format!(
                            "where (`{}`) is not a boolean: `{}`",
                            filter.source(),
                            truncate(&v.to_text().unwrap_or_default())
                        )
                    }),
                });
            match kept {
                Ok(true) => {}
                Ok(false) => return Mapped::Filtered,
                Err(error) => {
                    return Mapped::One(reject(&fields, error, self.raw(row, usize::MAX), origin))
                }
            }
        }
        let Some(expand) = &self.expand else {
            return Mapped::One(
                build(&fields, tx, origin)
                    .or_else(|error| reject(&fields, error, self.raw(row, usize::MAX), origin)),
            );
        };
        let elements = match expand
            .eval(&fields)
            .map_err(|e| format!("expand (`{}`): {e}", expand.source()))
            .and_then(|v| json_array(v).map_err(|e| format!("expand (`{}`) {e}", expand.source())))
        {
            Ok(elements) => elements,
            Err(error) => {
                return Mapped::One(reject(&fields, error, self.raw(row, usize::MAX), origin))
            }
        };
        Mapped::Each(
            elements
                .iter()
                .enumerate()
                .map(|(n, element)| {
                    let text = element.to_string();
                    let fields = RowFields {
                        mapping: self,
                        row,
                        element: Some(&text),
                    };
                    let origin = origin.map(|o| o.element(n));
                    build(&fields, tx, origin).or_else(|error| {
                        // The row without its large values (the array among them): the
                        // element is kept whole beside it. The whole row in each of its
                        // elements' letters grew with their count squared (a 440 KB row
                        // of 3000 bad elements wrote 1.3 GB of dead letters).
                        let mut raw = self.raw(row, SMALL);
                        if let Value::Object(m) = &mut raw {
                            m.insert(
                                ELEMENT.into(),
                                serde_json::json!({ "index": n, "value": element }),
                            );
                        }
                        reject(&fields, format!("element {n}: {error}"), raw, origin)
                    })
                })
                .collect(),
        )
    }

    /// The raw row as JSON (column → text), for dead letters; a value over `keep`
    /// bytes as its size only.
    fn raw(&self, row: &Tuple<'_>, keep: usize) -> Value {
        let mut map = Map::new();
        for (i, col) in row.columns.iter().enumerate() {
            let name = self
                .columns
                .get(i)
                .map_or_else(|| format!("column_{i}"), |(n, _)| n.clone());
            let value = match col {
                Column::Null => Value::Null,
                Column::Unchanged => Value::String("<unchanged toast>".into()),
                Column::Text(b) | Column::Binary(b) if b.len() > keep => {
                    Value::String(format!("<{} bytes, left out>", b.len()))
                }
                Column::Text(b) | Column::Binary(b) => {
                    Value::String(String::from_utf8_lossy(b).into_owned())
                }
            };
            map.insert(name, value);
        }
        Value::Object(map)
    }
}

/// The elements of an `expand` value: a JSON array (json, jsonb, or text or bytes
/// holding one).
fn json_array(value: ExprValue) -> Result<Vec<Value>, String> {
    let parsed = match value {
        ExprValue::Json(v) => v,
        ExprValue::Null => return Err("is null, not a JSON array".into()),
        other => {
            let text = match other {
                ExprValue::Bytes(b) => String::from_utf8(b).map_err(|_| "is not UTF-8")?,
                ExprValue::Other {
                    type_oid: oid::BYTEA,
                    text,
                } => String::from_utf8(bytea(&text)?).map_err(|_| "is not UTF-8")?,
                other => other.to_text().unwrap_or_default(),
            };
            walfold_event::json::parse(&text).map_err(|e| e.to_string())?
        }
    };
    match parsed {
        Value::Array(elements) => Ok(elements),
        other => Err(format!("is {}, not a JSON array", kind(&other))),
    }
}

/// A `bytea` value's text (`\x` hex, PostgreSQL's default `bytea_output`) as bytes.
fn bytea(text: &str) -> Result<Vec<u8>, String> {
    let hex = text
        .strip_prefix("\\x")
        .ok_or("is bytea not in hex format (set bytea_output = 'hex' for the replication role)")?;
    if hex.len() % 2 != 0 {
        return Err("is bytea with an odd number of hex digits".into());
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| "is not bytea hex".into()))
        .collect()
}

/// A row's fields, and the row as expressions read it ([`walfold_expr::Row`]).
struct RowFields<'a, 'r> {
    mapping: &'a Mapping,
    row: &'a Tuple<'r>,
    /// The `expand` element this event is made of, as JSON text.
    element: Option<&'a str>,
}

impl walfold_expr::Row for RowFields<'_, '_> {
    fn column(&self, name: &str) -> Option<Input<'_>> {
        if let (Some(element), ELEMENT) = (self.element, name) {
            return Some(Input {
                type_oid: oid::JSONB,
                text: Some(element.as_bytes()),
            });
        }
        let i = self.mapping.columns.iter().position(|(n, _)| n == name)?;
        let text = match self.row.columns.get(i)? {
            Column::Text(b) | Column::Binary(b) => Some(*b),
            Column::Null | Column::Unchanged => None,
        };
        Some(Input {
            type_oid: self.mapping.columns[i].1,
            text,
        })
    }
}

impl RowFields<'_, '_> {
    fn source(&self, field: usize) -> &Source {
        &self.mapping.fields[field]
    }

    /// A column's text; `None` for null.
    fn column_text(&self, i: usize, describe: impl Fn() -> String) -> Result<Option<&str>, String> {
        match self.row.columns.get(i) {
            None => Err(format!(
                "row has {} columns, expected more",
                self.row.columns.len()
            )),
            Some(Column::Null) => Ok(None),
            Some(Column::Unchanged) => Err("column value not sent (unchanged TOAST)".into()),
            Some(Column::Text(b)) | Some(Column::Binary(b)) => std::str::from_utf8(b)
                .map(Some)
                .map_err(|_| format!("{} is not UTF-8", describe())),
        }
    }

    fn eval(&self, e: &Expr, describe: impl Fn() -> String) -> Result<ExprValue, String> {
        e.eval(self).map_err(|err| format!("{}: {err}", describe()))
    }

    /// One part of the producer's ID as text; `None` for null.
    fn id_part(&self, part: usize) -> Result<Option<String>, String> {
        let describe = || self.describe_id(part);
        match &self.mapping.ids[part] {
            Source::Column(i) => Ok(self.column_text(*i, describe)?.map(str::to_owned)),
            Source::Expr(e) => Ok(self.eval(e, describe)?.to_text()),
            Source::Constant(c) => Ok(Some(c.clone())),
            Source::Absent => Err(format!(
                "the outbox table has no column `{}`",
                self.mapping.id_names[part]
            )),
        }
    }

    fn describe_id(&self, part: usize) -> String {
        let name = &self.mapping.id_names[part];
        let key = if self.mapping.ids.len() > 1 {
            format!("id[{part}]")
        } else {
            "id".into()
        };
        match &self.mapping.ids[part] {
            Source::Expr(_) => format!("{key} (`{name}`)"),
            _ if key == "id" => format!("column `{name}`"),
            _ => format!("{key} column `{name}`"),
        }
    }
}

impl Fields for RowFields<'_, '_> {
    fn scope(&self) -> &str {
        &self.mapping.scope
    }

    fn describe(&self, field: usize) -> String {
        if field == ID {
            return self.describe_id(0);
        }
        let (key, name) = (self.mapping.keys[field], &self.mapping.names[field]);
        match self.source(field) {
            Source::Expr(_) => format!("{key} (`{name}`)"),
            Source::Constant(_) => format!("{key} (the table's name)"),
            Source::Column(_) | Source::Absent => format!("column `{name}`"),
        }
    }

    /// A column missing from the table is an error for required fields.
    fn text(&self, field: usize, required: bool) -> Result<Option<String>, String> {
        let describe = || self.describe(field);
        match self.source(field) {
            Source::Absent if required => Err(format!(
                "the outbox table has no column `{}`",
                self.mapping.names[field]
            )),
            Source::Absent => Ok(None),
            Source::Constant(c) => Ok(Some(c.clone())),
            Source::Column(i) => Ok(self.column_text(*i, describe)?.map(str::to_owned)),
            Source::Expr(e) => Ok(self.eval(e, describe)?.to_text()),
        }
    }

    fn text_ref(&self, field: usize, required: bool) -> Result<Option<Cow<'_, str>>, String> {
        match self.source(field) {
            Source::Column(i) => Ok(self
                .column_text(*i, || self.describe(field))?
                .map(Cow::Borrowed)),
            _ => Ok(self.text(field, required)?.map(Cow::Owned)),
        }
    }

    fn json(&self, field: usize, required: bool) -> Result<Option<(JsonText, bool)>, String> {
        let describe = || self.describe(field);
        let text = match self.source(field) {
            Source::Column(i) => {
                let Some(text) = self.column_text(*i, describe)? else {
                    return Ok(None);
                };
                if self.mapping.columns[*i].1 == oid::BYTEA {
                    utf8_json(bytea(text).map_err(|e| format!("{} {e}", describe()))?)
                        .map_err(|e| format!("{} {e}", describe()))?
                } else {
                    // The common case in one pass: JSON jsonb stores as written (no
                    // `\u0000`, valid, storable), what the checks below would each find.
                    match JsonText::storable(text.to_owned()) {
                        Ok(json) => return Ok(Some((json, true))),
                        Err(text) => text,
                    }
                }
            }
            Source::Expr(e) => match self.eval(e, describe)? {
                ExprValue::Null => return Ok(None),
                ExprValue::Json(v) => v.to_string(),
                ExprValue::Bytes(b) => utf8_json(b).map_err(|e| format!("{} {e}", describe()))?,
                ExprValue::Other {
                    type_oid: oid::BYTEA,
                    text,
                } => utf8_json(bytea(&text).map_err(|e| format!("{} {e}", describe()))?)
                    .map_err(|e| format!("{} {e}", describe()))?,
                other => other.to_text().unwrap_or_default(),
            },
            Source::Absent | Source::Constant(_) => {
                return self.text(field, required)?.map_or(Ok(None), |t| {
                    JsonText::parse(t)
                        .map(|j| Some((j, false)))
                        .map_err(|e| format!("{} {e}", describe()))
                })
            }
        };
        refuse_nul(&text, describe)?;
        JsonText::parse(text)
            .map(|j| Some((j, false)))
            .map_err(|e| format!("{} {e}", describe()))
    }

    fn naive_time_is_utc(&self) -> bool {
        match self.source(OCCURRED_AT) {
            Source::Column(i) => matches!(self.mapping.columns.get(*i), Some((_, oid::TIMESTAMP))),
            // An expression's text without an offset: UTC, as walfold's sessions have it.
            _ => true,
        }
    }

    fn identity(&self) -> Result<(Uuid, Option<String>), String> {
        if let [Source::Column(i)] = self.mapping.ids[..] {
            // A UUID column, the common case: read in place (anything else as below).
            if let Ok(Some(text)) = self.column_text(i, || self.describe_id(0)) {
                if let Ok(id) = Uuid::try_parse(text.trim()) {
                    return Ok((id, None));
                }
            }
        }
        if self.mapping.ids.len() == 1 {
            let text = self
                .id_part(0)?
                .ok_or_else(|| format!("{} is null", self.describe_id(0)))?;
            return identity_of(text, &self.mapping.scope, || self.describe_id(0));
        }
        // A composite: the JSON array of its parts' texts, always derived.
        let mut parts = Vec::with_capacity(self.mapping.ids.len());
        for part in 0..self.mapping.ids.len() {
            let text = self
                .id_part(part)?
                .ok_or_else(|| format!("{} is null", self.describe_id(part)))?;
            parts.push(text);
        }
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        let id = producer_event_id(&self.mapping.scope, &refs);
        let text = Value::Array(parts.into_iter().map(Value::String).collect()).to_string();
        Ok((id, Some(text)))
    }
}

/// Bytes holding JSON, as text.
fn utf8_json(bytes: Vec<u8>) -> Result<String, String> {
    String::from_utf8(bytes).map_err(|_| "is bytes that are not UTF-8 (JSON expected)".into())
}

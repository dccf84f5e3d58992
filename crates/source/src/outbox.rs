//! Outbox mapping: an inserted outbox row, or a transactional logical decoding message,
//! becomes a [`NewEvent`] with the producer's ID or, when it cannot, a dead letter with
//! the reason and the raw content. One rule for both ([`build`]). Pure: no I/O.
//!
//! A table outbox's field is a column (read as it comes, nothing evaluated: the fast
//! path) or an expression ([`walfold_expr`]) evaluated over the row; `where` filters
//! rows, `expand` makes one event per element of a JSON array. Each is compiled once
//! per relation (its Relation message, or the catalog for a backfill), so a streamed
//! row and a backfilled one are mapped by the same [`Mapping`] to the same event IDs.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use uuid::Uuid;
use walfold_config::{OutboxConfig, QualifiedName};
use walfold_event::{producer_event_id, DeadLetter, JsonText, Lsn, NewEvent, Reason, RowOrigin};
use walfold_expr::{Expr, Input, Value as ExprValue};
use walfold_pgoutput::{oid, parse_time, Column, Relation, Tuple};

/// The fields of an event, indexes into [`OutboxConfig::KEYS`].
const ID: usize = 0;
const AGGREGATE_TYPE: usize = 1;
const AGGREGATE_ID: usize = 2;
const EVENT_TYPE: usize = 3;
const VERSION: usize = 4;
const PAYLOAD: usize = 5;
const HEADERS: usize = 6;
const OCCURRED_AT: usize = 7;

/// `bytea`: a payload stored as bytes, sent as `\x` hex text.
const BYTEA: u32 = 17;

/// The pseudo-column an `expand` element is read by.
pub const ELEMENT: &str = "element";

/// `oid`: the type of a large object's reference (`lo_import`, JPA's `@Lob` on
/// PostgreSQL). Logical decoding sends the reference's number, never the object, so a
/// field read from such a column would fold a number where the content belongs.
pub const LARGE_OBJECT_OID: u32 = 26;

/// Why a field cannot be read from a column of type `type_oid`, if it cannot.
pub fn unreadable_type(type_oid: u32) -> Option<&'static str> {
    (type_oid == LARGE_OBJECT_OID).then_some(
        "is of type oid: a large object's reference, and logical decoding cannot read large \
         objects (walfold would see the object's number, not its content)",
    )
}

/// The fix for a field read from a large object's column.
pub fn unreadable_fix(key: &str) -> String {
    format!(
        "store the content in the row instead (alter the column to jsonb, json, text or bytea \
         holding UTF-8 JSON, and have the application write it there), or set {key} to a \
         column that holds it"
    )
}

/// The columns a field's value reads: itself when it is a column name, else its
/// expression's (`None`: it does not parse, which validation refuses first).
pub fn columns_read(value: &str, is_column: bool) -> Option<Vec<String>> {
    if is_column {
        return Some(vec![value.to_owned()]);
    }
    let expr = walfold_expr::parse(value).ok()?;
    Some(expr.columns().into_iter().map(str::to_owned).collect())
}

/// The column (or key) name of each field, as configured (the first part of a composite
/// `id`).
type Names = [String; 8];

fn names(config: &OutboxConfig) -> Names {
    let fields = config.fields();
    OutboxConfig::KEYS.map(|key| {
        fields
            .iter()
            .find(|f| f.key == key)
            .map_or_else(String::new, |f| f.value.to_owned())
    })
}

/// Where an event's fields are read from: a row's columns or a message's JSON keys.
trait Fields {
    /// A field as a reason names it: ``column `id` ``, ``key `id` ``, or for an
    /// expression ``aggregate_id (`split_part(stream_name, '-', 1)`)``.
    fn describe(&self, field: usize) -> String;
    /// What a derived event ID is scoped to: the outbox (`public.tickets`, or
    /// `message_prefix:orders`), so equal values of two outboxes are two events.
    fn scope(&self) -> &str;
    /// A field's text; `None` for null, or for an optional field that is absent.
    fn text(&self, field: usize, required: bool) -> Result<Option<String>, String>;
    /// [`Fields::text`], borrowed where it can be (a column's text): for fields read,
    /// not kept.
    fn text_ref(&self, field: usize, required: bool) -> Result<Option<Cow<'_, str>>, String> {
        Ok(self.text(field, required)?.map(Cow::Owned))
    }
    /// A JSON field (payload, headers), as its text, and whether one pass found it
    /// storable as written (then [`JsonText::check_jsonb`] has nothing to find).
    fn json(&self, field: usize, required: bool) -> Result<Option<(JsonText, bool)>, String>;
    /// A time without an offset is UTC (a `timestamp without time zone` column).
    fn naive_time_is_utc(&self) -> bool;

    /// The event ID, and the producer's value when it is no UUID.
    fn identity(&self) -> Result<(Uuid, Option<String>), String> {
        let text = self
            .text(ID, true)?
            .ok_or_else(|| format!("{} is null", self.describe(ID)))?;
        identity_of(text, self.scope(), || self.describe(ID))
    }
}

/// A producer's value as an event ID: a UUID is the ID itself; anything else is
/// derived from the outbox's scope and its text ([`producer_event_id`]), the text kept
/// as the producer's ID.
fn identity_of(
    text: String,
    scope: &str,
    describe: impl FnOnce() -> String,
) -> Result<(Uuid, Option<String>), String> {
    if text.trim().is_empty() {
        return Err(format!("{} is empty", describe()));
    }
    Ok(match Uuid::try_parse(text.trim()) {
        Ok(id) => (id, None),
        Err(_) => (producer_event_id(scope, &[&text]), Some(text)),
    })
}

/// The source transaction an insert belongs to.
#[derive(Debug, Clone, Copy)]
pub struct TxContext {
    pub commit_lsn: Lsn,
    pub commit_time: Option<SystemTime>,
}

/// The one rule that makes an event of an outbox row or message.
fn build<F: Fields>(f: &F, tx: TxContext, origin: Option<RowOrigin>) -> Result<NewEvent, String> {
    let required = |field: usize| -> Result<String, String> {
        let text = f
            .text(field, true)?
            .ok_or_else(|| format!("{} is null", f.describe(field)))?;
        if text.trim().is_empty() {
            return Err(format!("{} is empty", f.describe(field)));
        }
        Ok(text)
    };
    let (id, producer_id) = f.identity()?;
    let aggregate_type = required(AGGREGATE_TYPE)?;
    let aggregate_id = required(AGGREGATE_ID)?;
    let event_type = required(EVENT_TYPE)?;
    let version = match f.text_ref(VERSION, false)? {
        None => None,
        Some(v) => Some(v.trim().parse::<i64>().map_err(|_| {
            format!(
                "{} is not an integer: `{}`",
                f.describe(VERSION),
                truncate(&v)
            )
        })?),
    };
    let (payload, payload_storable) = f
        .json(PAYLOAD, true)?
        .filter(|(p, _)| p.as_str().trim() != "null")
        .ok_or_else(|| format!("{} is null", f.describe(PAYLOAD)))?;
    let headers = f.json(HEADERS, false)?;
    // Valid JSON that jsonb refuses would fail the event log's insert: set aside here.
    let headers_checked = headers.as_ref().map(|(h, storable)| (h, *storable));
    for (field, value) in [
        (PAYLOAD, Some((&payload, payload_storable))),
        (HEADERS, headers_checked),
    ] {
        if let Some((value, false)) = value {
            value
                .check_jsonb()
                .map_err(|e| format!("{} {e}", f.describe(field)))?;
        }
    }
    let headers = headers.map(|(h, _)| h);
    let occurred_at = match f.text_ref(OCCURRED_AT, false)? {
        None => None,
        Some(t) => match parse_time(&t, f.naive_time_is_utc()) {
            // PostgreSQL's infinities are no time an event occurred, and no SystemTime.
            Ok(i64::MIN) | Ok(i64::MAX) => {
                return Err(format!(
                    "{} is {}, not a time an event occurred",
                    f.describe(OCCURRED_AT),
                    t.trim()
                ))
            }
            Ok(us) => Some(unix_micros(us)),
            // A valid timestamptz, but before year 1: no time an event occurred either.
            Err(walfold_pgoutput::ValueError::BcTimestamptz) => {
                return Err(format!(
                    "{} is a BC date, not a time an event occurred: `{}`",
                    f.describe(OCCURRED_AT),
                    truncate(&t)
                ))
            }
            Err(_) => {
                return Err(format!(
                    "{} is not a timestamptz: `{}`",
                    f.describe(OCCURRED_AT),
                    truncate(&t)
                ))
            }
        },
    };
    Ok(NewEvent {
        id,
        producer_id,
        aggregate_type,
        aggregate_id,
        event_type,
        version,
        payload,
        headers,
        occurred_at,
        source_lsn: tx.commit_lsn,
        origin,
        committed_at: tx.commit_time,
    })
}

/// A dead letter for content that could not be an event, with what could be read of it.
fn rejected(
    f: &impl Fields,
    error: String,
    raw: Value,
    tx: TxContext,
    origin: Option<RowOrigin>,
) -> Box<DeadLetter> {
    let text = |field| f.text(field, true).ok().flatten();
    Box::new(DeadLetter {
        subscriber_id: None,
        event_id: f.identity().ok().map(|(id, _)| id),
        seq: None,
        aggregate_type: text(AGGREGATE_TYPE),
        aggregate_id: text(AGGREGATE_ID),
        reason: Reason::Malformed,
        error,
        raw: Some(raw),
        existing: None,
        attempts: 1,
        source_lsn: Some(tx.commit_lsn),
        origin,
    })
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
    /// `where`: rows for which it is not true are no events.
    filter: Option<Box<Expr>>,
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
        let mut filter = None;
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
                            filter = expr;
                        } else {
                            expand = expr;
                        }
                        continue;
                    };
                    if f.key == "where" {
                        filter = Some(e);
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
            scope: table.to_string(),
            table,
            columns,
            fields,
            ids,
            filter,
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
        if let Some(filter) = &self.filter {
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
                    type_oid: BYTEA,
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
                if self.mapping.columns[*i].1 == BYTEA {
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
                    type_oid: BYTEA,
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

/// A message outbox: transactional `pg_logical_emit_message` calls under one prefix,
/// each a JSON object whose keys are the configured field names.
#[derive(Debug, Clone)]
pub struct MessageMapping {
    pub prefix: String,
    /// `message_prefix:<prefix>`: what derived event IDs are scoped to.
    scope: String,
    names: Names,
    /// `pipeline.max_event_bytes`.
    max_bytes: usize,
}

impl MessageMapping {
    /// `None` for a table outbox.
    pub fn new(config: &OutboxConfig) -> Option<MessageMapping> {
        let prefix = config.message_prefix.clone()?;
        Some(MessageMapping {
            scope: format!("message_prefix:{prefix}"),
            prefix,
            names: names(config),
            max_bytes: usize::MAX,
        })
    }

    /// A message larger than `max_bytes` becomes a `too_large` dead letter.
    pub fn with_max_bytes(mut self, max_bytes: usize) -> MessageMapping {
        self.max_bytes = max_bytes;
        self
    }

    /// Maps a message's content read at `origin`. Content that cannot be an event comes
    /// back as a dead letter.
    pub fn map(
        &self,
        content: &[u8],
        tx: TxContext,
        origin: Option<RowOrigin>,
    ) -> Result<NewEvent, Box<DeadLetter>> {
        let raw = |content: Value| self.raw(content);
        if content.len() > self.max_bytes {
            let fields = JsonFields {
                object: &Object::new(),
                names: &self.names,
                scope: &self.scope,
            };
            let error = too_large("message", content.len(), self.max_bytes);
            let left_out = Value::String(format!("<{} bytes, left out>", content.len()));
            let mut dead = rejected(&fields, error, raw(left_out), tx, origin);
            dead.reason = Reason::TooLarge;
            return Err(dead);
        }
        let object = match parse_message(content) {
            Ok(object) => object,
            Err(error) => {
                let text = Value::String(String::from_utf8_lossy(content).into_owned());
                let fields = JsonFields {
                    object: &Object::new(),
                    names: &self.names,
                    scope: &self.scope,
                };
                return Err(rejected(&fields, error, raw(text), tx, origin));
            }
        };
        let fields = JsonFields {
            object: &object,
            names: &self.names,
            scope: &self.scope,
        };
        build(&fields, tx, origin).map_err(|error| {
            // The content as a tree, for the dead letter only.
            let text = String::from_utf8_lossy(content);
            let content = walfold_event::json::parse(&text)
                .unwrap_or_else(|_| Value::String(text.into_owned()));
            rejected(&fields, error, raw(content), tx, origin)
        })
    }
}

impl MessageMapping {
    /// A non-transactional message under an outbox's prefix is sent even when its
    /// transaction rolls back, so it is never an event: a dead letter that says so.
    pub fn reject_nontransactional(&self, content: &[u8], tx: TxContext) -> Box<DeadLetter> {
        let origin = Some(RowOrigin::Wal {
            lsn: tx.commit_lsn,
            index: 0,
            element: 0,
        });
        let problem = "emitted non-transactional (pg_logical_emit_message(false, …)): such a \
                       message is sent even when its transaction rolls back, so it cannot be an \
                       event; emit it with true";
        match self.map(content, tx, origin) {
            Err(mut dead) => {
                dead.error = format!("{problem}; also: {}", dead.error);
                dead
            }
            Ok(event) => {
                let fields = JsonFields {
                    object: &Object::new(),
                    names: &self.names,
                    scope: &self.scope,
                };
                let mut dead = rejected(
                    &fields,
                    problem.into(),
                    self.raw(Value::String(String::from_utf8_lossy(content).into_owned())),
                    tx,
                    origin,
                );
                dead.event_id = Some(event.id);
                dead.aggregate_type = Some(event.aggregate_type);
                dead.aggregate_id = Some(event.aggregate_id);
                dead
            }
        }
    }

    fn raw(&self, content: Value) -> Value {
        let mut map = Map::new();
        map.insert("message_prefix".into(), Value::String(self.prefix.clone()));
        map.insert("content".into(), content);
        Value::Object(map)
    }
}

/// A message's keys, each value as its text: a payload is not made a tree.
type Object<'a> = HashMap<String, &'a RawValue>;

fn parse_message(content: &[u8]) -> Result<Object<'_>, String> {
    let text = std::str::from_utf8(content).map_err(|_| "message content is not UTF-8")?;
    refuse_nul(text, || "the message".into())?;
    walfold_event::json::validate(content).map_err(|e| format!("message content {e}"))?;
    let kind = match text.trim_start().as_bytes().first() {
        Some(b'{') => None,
        Some(b'[') => Some("an array"),
        Some(b'"') => Some("a string"),
        Some(b't' | b'f') => Some("a boolean"),
        Some(b'n') => Some("null"),
        _ => Some("a number"),
    };
    if let Some(kind) = kind {
        return Err(format!("message content must be a JSON object, not {kind}"));
    }
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    Object::deserialize(&mut de).map_err(|e| format!("message content is not JSON: {e}"))
}

struct JsonFields<'a> {
    object: &'a Object<'a>,
    names: &'a Names,
    scope: &'a str,
}

impl JsonFields<'_> {
    /// A field's value as text, `None` when absent or null.
    fn raw(&self, field: usize, required: bool) -> Result<Option<&str>, String> {
        let name = &self.names[field];
        match self.object.get(name) {
            None if required => Err(format!("key `{name}` is missing")),
            None => Ok(None),
            Some(raw) if raw.get() == "null" => Ok(None),
            Some(raw) => Ok(Some(raw.get())),
        }
    }

    fn value(&self, field: usize, required: bool) -> Result<Option<Value>, String> {
        self.raw(field, required)?
            .map(|raw| {
                walfold_event::json::parse(raw)
                    .map_err(|e| format!("key `{}` {e}", self.names[field]))
            })
            .transpose()
    }
}

impl Fields for JsonFields<'_> {
    fn scope(&self) -> &str {
        self.scope
    }

    fn describe(&self, field: usize) -> String {
        format!("key `{}`", self.names[field])
    }

    fn text(&self, field: usize, required: bool) -> Result<Option<String>, String> {
        match self.value(field, required)? {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => Ok(Some(v.to_string())),
            Some(other) => Err(format!(
                "key `{}` must be a string or a number, not {}",
                self.names[field],
                kind(&other)
            )),
        }
    }

    fn json(&self, field: usize, required: bool) -> Result<Option<(JsonText, bool)>, String> {
        self.raw(field, required)?
            .map(|raw| {
                JsonText::parse(raw)
                    .map(|j| (j, false))
                    .map_err(|e| format!("key `{}` {e}", self.names[field]))
            })
            .transpose()
    }

    /// As for a `timestamp` column: a time without an offset is UTC.
    fn naive_time_is_utc(&self) -> bool {
        true
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// PostgreSQL epoch (2000-01-01) microseconds → `SystemTime`.
pub fn pg_time(pg_micros: i64) -> Option<SystemTime> {
    const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;
    pg_micros.checked_add(PG_EPOCH_UNIX_MICROS).map(unix_micros)
}

fn unix_micros(us: i64) -> SystemTime {
    if us >= 0 {
        UNIX_EPOCH + Duration::from_micros(us as u64)
    } else {
        UNIX_EPOCH - Duration::from_micros(us.unsigned_abs())
    }
}

/// jsonb cannot hold `\u0000`; a `json` or `text` column can. Such a row would make the
/// event-log insert fail, so it is rejected here with its reason.
fn refuse_nul(text: &str, what: impl FnOnce() -> String) -> Result<(), String> {
    if has_nul_escape(text) {
        Err(format!(
            "{} contains \\u0000, which jsonb cannot store",
            what()
        ))
    } else {
        Ok(())
    }
}

/// Whether JSON text holds a `\u0000` escape. Only a backslash that is not itself escaped
/// starts one: `"\\u0000"` (an escaped backslash, then `u0000`) is six ordinary characters,
/// so the run of backslashes before `u0000` must be odd.
fn has_nul_escape(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        let run = bytes[i..].iter().take_while(|&&b| b == b'\\').count();
        i += run;
        if run % 2 == 1 && bytes[i..].starts_with(b"u0000") {
            return true;
        }
    }
    false
}

/// Values of a too large row kept in its dead letter: its IDs and names, not its payload.
const SMALL: usize = 1024;

fn too_large(what: &str, size: usize, max: usize) -> String {
    format!("the {what} is {size} bytes, over pipeline.max_event_bytes ({max}): not an event")
}

fn truncate(s: &str) -> String {
    if s.chars().count() > 64 {
        format!("{}…", s.chars().take(64).collect::<String>())
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use walfold_pgoutput::RelationColumn;

    /// A row that is one event or one dead letter, read as the `Result` it is.
    trait One {
        fn unwrap(self) -> NewEvent;
        fn unwrap_err(self) -> Box<DeadLetter>;
        fn made_event(self) -> bool;
    }

    impl One for Mapped {
        fn unwrap(self) -> NewEvent {
            self.one().expect("one outcome").expect("an event")
        }
        fn unwrap_err(self) -> Box<DeadLetter> {
            match self.one().expect("one outcome") {
                Ok(e) => panic!("an event, not a dead letter: {e:?}"),
                Err(d) => d,
            }
        }
        fn made_event(self) -> bool {
            matches!(self.one(), Some(Ok(_)))
        }
    }

    fn relation(cols: &[(&str, u32)]) -> Relation {
        Relation {
            xid: None,
            id: 1,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: cols
                .iter()
                .map(|(n, t)| RelationColumn {
                    flags: 0,
                    name: (*n).into(),
                    type_oid: *t,
                    type_modifier: -1,
                })
                .collect(),
        }
    }

    fn config() -> OutboxConfig {
        let c = walfold_config::Config::from_toml(
            "[source]\nurl = \"postgresql://h/db\"\n[[outbox]]\ntable = \"outbox\"\n",
            vec![],
        )
        .unwrap();
        c.outbox[0].clone()
    }

    const COLS: &[(&str, u32)] = &[
        ("id", oid::UUID),
        ("aggregate_type", oid::TEXT),
        ("aggregate_id", oid::TEXT),
        ("event_type", oid::TEXT),
        ("version", oid::INT8),
        ("payload", oid::JSONB),
        ("occurred_at", oid::TIMESTAMPTZ),
    ];

    fn tx() -> TxContext {
        TxContext {
            commit_lsn: Lsn(42),
            commit_time: None,
        }
    }

    fn row<'a>(vals: &[Option<&'a str>]) -> Tuple<'a> {
        Tuple {
            columns: vals
                .iter()
                .map(|v| v.map_or(Column::Null, |s| Column::Text(s.as_bytes())))
                .collect(),
        }
    }

    const ID: &str = "8c9d2f0e-2f6a-4a57-9d3c-2c1b7e5f9a10";

    #[test]
    fn a_good_row_becomes_an_event() {
        let m = Mapping::new(&config(), &relation(COLS));
        let e = m
            .map(
                &row(&[
                    Some(ID),
                    Some("order"),
                    Some("o-1"),
                    Some("OrderPaid"),
                    Some("3"),
                    Some(r#"{"amount": "12.50"}"#),
                    Some("2026-11-30 02:25:48.5+00"),
                ]),
                tx(),
                None,
            )
            .unwrap();
        assert_eq!(e.id.to_string(), ID);
        assert_eq!(e.version, Some(3));
        assert_eq!(e.payload.get("amount").unwrap(), "12.50");
        assert_eq!(e.source_lsn, Lsn(42));
        assert_eq!(
            e.occurred_at
                .unwrap()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_micros(),
            1_796_005_548_500_000
        );
        assert_eq!(e.headers, None);
    }

    #[test]
    fn a_row_over_the_size_limit_is_a_too_large_dead_letter_without_its_payload() {
        let payload = format!(r#"{{"blob": "{}"}}"#, "x".repeat(5000));
        let values = [
            Some(ID),
            Some("order"),
            Some("o-1"),
            Some("OrderPaid"),
            Some("3"),
            Some(payload.as_str()),
            None,
        ];
        let m = Mapping::new(&config(), &relation(COLS)).with_max_bytes(4096);
        let dead = m.map(&row(&values), tx(), None).unwrap_err();
        assert_eq!(dead.reason, Reason::TooLarge);
        assert_eq!(dead.event_id.unwrap().to_string(), ID);
        assert_eq!(dead.aggregate_id.as_deref(), Some("o-1"));
        assert!(
            dead.error.contains("over pipeline.max_event_bytes (4096)"),
            "{}",
            dead.error
        );
        let raw = dead.raw.unwrap();
        assert_eq!(raw["payload"], "<5012 bytes, left out>");
        assert_eq!(raw["aggregate_id"], "o-1");
        // Within the limit it is an event.
        let m = Mapping::new(&config(), &relation(COLS)).with_max_bytes(8192);
        assert!(m.map(&row(&values), tx(), None).made_event());
        // A message too.
        let c = walfold_config::Config::from_toml(
            "[source]\nurl = \"postgresql://h/db\"\n[[outbox]]\nmessage_prefix = \"m\"\n",
            vec![],
        )
        .unwrap();
        // Within it, the payload is taken as written.
        let m = MessageMapping::new(&c.outbox[0]).unwrap();
        let content = format!(
            r#"{{"id": "{ID}", "aggregate_type": "order", "aggregate_id": "o-1",
               "event_type": "Paid", "payload": {{ "a" : 1.50, "b": [1,2] }}}}"#
        );
        let e = m.map(content.as_bytes(), tx(), None).unwrap();
        assert_eq!(e.payload.as_str(), r#"{ "a" : 1.50, "b": [1,2] }"#);
        let m = MessageMapping::new(&c.outbox[0])
            .unwrap()
            .with_max_bytes(100);
        let dead = m.map(payload.as_bytes(), tx(), None).unwrap_err();
        assert_eq!(dead.reason, Reason::TooLarge);
        assert_eq!(dead.raw.unwrap()["content"], "<5012 bytes, left out>");
    }

    #[test]
    fn numbers_keep_every_digit() {
        let m = Mapping::new(&config(), &relation(COLS));
        let e = m
            .map(
                &row(&[
                    Some(ID),
                    Some("account"),
                    Some("a-1"),
                    Some("Credited"),
                    None,
                    Some(r#"{"amount": 12345678901234567890.123456789012, "n": 1e400}"#),
                    None,
                ]),
                tx(),
                None,
            )
            .unwrap();
        assert_eq!(
            e.payload.get("amount").unwrap().to_string(),
            "12345678901234567890.123456789012"
        );
        assert_eq!(
            e.payload.get("n").unwrap().to_string(),
            "1e+400",
            "the value, not an f64 infinity"
        );
        assert_eq!(e.version, None);
    }

    #[test]
    fn malformed_rows_become_dead_letters_with_reasons() {
        let m = Mapping::new(&config(), &relation(COLS));
        let cases: &[(&[Option<&str>], &str)] = &[
            (
                &[
                    None,
                    Some("a"),
                    Some("1"),
                    Some("T"),
                    Some("1"),
                    Some("{}"),
                    None,
                ],
                "`id` is null",
            ),
            (
                &[
                    Some(" "),
                    Some("a"),
                    Some("1"),
                    Some("T"),
                    Some("1"),
                    Some("{}"),
                    None,
                ],
                "column `id` is empty",
            ),
            (
                &[
                    Some(ID),
                    Some("a"),
                    Some("1"),
                    Some("T"),
                    Some("1.5"),
                    Some("{}"),
                    None,
                ],
                "not an integer",
            ),
            (
                &[
                    Some(ID),
                    Some("a"),
                    None,
                    Some("T"),
                    Some("1"),
                    Some("{}"),
                    None,
                ],
                "`aggregate_id` is null",
            ),
            (
                &[
                    Some(ID),
                    Some("a"),
                    Some("1"),
                    Some("T"),
                    Some("1"),
                    Some("{x"),
                    None,
                ],
                "not JSON",
            ),
            (
                &[
                    Some(ID),
                    Some("a"),
                    Some("1"),
                    Some(" "),
                    Some("1"),
                    Some("{}"),
                    None,
                ],
                "`event_type` is empty",
            ),
            (
                &[
                    Some(ID),
                    Some(""),
                    Some("1"),
                    Some("T"),
                    Some("1"),
                    Some("{}"),
                    None,
                ],
                "`aggregate_type` is empty",
            ),
            (
                &[
                    Some(ID),
                    Some("a"),
                    Some("1"),
                    Some("T"),
                    Some("1"),
                    Some("null"),
                    None,
                ],
                "`payload` is null",
            ),
            (
                &[
                    Some(ID),
                    Some("a"),
                    Some("1"),
                    Some("T"),
                    Some("1"),
                    Some("{}"),
                    Some("0044-03-15 12:00:00+00 BC"),
                ],
                "`occurred_at` is a BC date",
            ),
        ];
        for (vals, reason) in cases {
            let dl = m.map(&row(vals), tx(), None).unwrap_err();
            assert_eq!(dl.reason, Reason::Malformed);
            assert!(dl.error.contains(reason), "{} vs {reason}", dl.error);
            assert!(dl.raw.as_ref().unwrap().get("payload").is_some());
        }
    }

    #[test]
    fn only_a_real_nul_escape_is_refused() {
        // As JSON text: a NUL escape, with escaped backslashes before it, or not one at all.
        assert!(has_nul_escape(r#"{"a": "\u0000"}"#));
        assert!(
            has_nul_escape(r#"{"a": "x\\\u0000"}"#),
            "an escaped backslash, then an escape"
        );
        assert!(has_nul_escape(r#"{"\u0000": 1}"#));
        assert!(
            !has_nul_escape(r#"{"a": "\\u0000"}"#),
            "an escaped backslash, then u0000"
        );
        assert!(!has_nul_escape(r#"{"a": "\\\\u0000"}"#));
        assert!(!has_nul_escape(r#"{"a": "\u0001"}"#));
        assert!(!has_nul_escape(r#"{"a": "u0000\\"}"#));
        assert!(!has_nul_escape(""));

        let m = Mapping::new(&config(), &relation(COLS));
        let with = |payload: &'static str| {
            row(&[
                Some(ID),
                Some("a"),
                Some("1"),
                Some("T"),
                Some("1"),
                Some(payload),
                None,
            ])
        };
        let e = m
            .map(&with(r#"{"path": "C:\\u0000"}"#), tx(), None)
            .unwrap();
        assert_eq!(e.payload.get("path").unwrap(), "C:\\u0000");
        let dl = m
            .map(&with(r#"{"path": "\u0000"}"#), tx(), None)
            .unwrap_err();
        assert!(dl.error.contains("jsonb cannot store"), "{}", dl.error);
    }

    fn message_outbox() -> MessageMapping {
        let c = walfold_config::Config::from_toml(
            "[source]\nurl = \"postgresql://h/db\"\n[[outbox]]\nmessage_prefix = \"orders\"\naggregate_id = \"aggregateId\"\n",
            vec![],
        )
        .unwrap();
        MessageMapping::new(&c.outbox[0]).unwrap()
    }

    #[test]
    fn a_message_maps_by_its_keys() {
        let m = message_outbox();
        let e = m
            .map(
                format!(r#"{{"id": "{ID}", "aggregate_type": "order", "aggregateId": 12, "event_type": "Paid", "version": "3", "payload": {{"amount": 1.50}}, "headers": null, "occurred_at": "2026-11-30T02:25:48.5Z"}}"#).as_bytes(),
                tx(),
                None,
            )
            .unwrap();
        assert_eq!(e.id.to_string(), ID);
        assert_eq!(e.aggregate_id, "12");
        assert_eq!(e.version, Some(3));
        assert_eq!(e.payload.get("amount").unwrap().to_string(), "1.50");
        assert_eq!(e.headers, None);
        assert!(e.occurred_at.is_some());
    }

    #[test]
    fn a_message_that_is_no_event_is_a_dead_letter_with_what_could_be_read() {
        let m = message_outbox();
        let cases = [
            ("{", "message content is not JSON"),
            ("\"x\"", "must be a JSON object, not a string"),
            (r#"{"aggregate_type": "a"}"#, "key `id` is missing"),
            (
                &format!(
                    r#"{{"id": "{ID}", "aggregate_type": "a", "aggregateId": "1", "event_type": "T", "payload": null}}"#
                ),
                "key `payload` is null",
            ),
            (
                &format!(
                    r#"{{"id": "{ID}", "aggregate_type": ["a"], "aggregateId": "1", "event_type": "T", "payload": {{}}}}"#
                ),
                "key `aggregate_type` must be a string or a number, not an array",
            ),
        ];
        for (content, error) in cases {
            let dl = m.map(content.as_bytes(), tx(), None).unwrap_err();
            assert!(dl.error.contains(error), "{content}: {}", dl.error);
            assert_eq!(dl.raw.as_ref().unwrap()["message_prefix"], "orders");
        }
        let dl = m
            .map(
                format!(r#"{{"id": "{ID}", "aggregateId": "o-1"}}"#).as_bytes(),
                tx(),
                None,
            )
            .unwrap_err();
        assert_eq!(dl.event_id.map(|u| u.to_string()).as_deref(), Some(ID));
        assert_eq!(dl.aggregate_id.as_deref(), Some("o-1"));
        assert_eq!(dl.raw.unwrap()["content"]["aggregateId"], "o-1");
        let good = format!(
            r#"{{"id": "{ID}", "aggregate_type": "a", "aggregateId": "1", "event_type": "T", "payload": {{}}}}"#
        );
        let dl = m.reject_nontransactional(good.as_bytes(), tx());
        assert!(
            dl.error.starts_with("emitted non-transactional"),
            "{}",
            dl.error
        );
        assert_eq!(dl.event_id.map(|u| u.to_string()).as_deref(), Some(ID));
    }

    #[test]
    fn a_timestamp_without_time_zone_column_is_read_as_utc() {
        let mut cols = COLS.to_vec();
        cols[6].1 = oid::TIMESTAMP;
        let m = Mapping::new(&config(), &relation(&cols));
        let e = m
            .map(
                &row(&[
                    Some(ID),
                    Some("a"),
                    Some("1"),
                    Some("T"),
                    None,
                    Some("{}"),
                    Some("2026-11-30 02:25:48.5"),
                ]),
                tx(),
                None,
            )
            .unwrap();
        let us = e
            .occurred_at
            .unwrap()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros();
        assert_eq!(us, 1_796_005_548_500_000);
    }

    /// A table outbox mapped by `fields` (TOML lines), over `cols`.
    fn mapping(fields: &str, cols: &[(&str, u32)]) -> Mapping {
        let c = walfold_config::Config::from_toml(
            &format!(
                "[source]\nurl = \"postgresql://h/db\"\n[[outbox]]\ntable = \"outbox\"\n{fields}\n"
            ),
            vec![],
        )
        .unwrap_or_else(|e| panic!("{fields}: {e}"));
        Mapping::new(&c.outbox[0], &relation(cols))
    }

    const TEXT_COLS: &[(&str, u32)] = &[
        ("MessageId", oid::VARCHAR),
        ("stream", oid::TEXT),
        ("kind", oid::TEXT),
        ("body", BYTEA),
        ("position", oid::INT8),
        ("keep", oid::BOOL),
    ];

    /// `body` as pgoutput sends a bytea: `\x` and hex.
    fn hex(text: &str) -> String {
        format!(
            "\\x{}",
            text.bytes().map(|b| format!("{b:02x}")).collect::<String>()
        )
    }

    const TEXT_FIELDS: &str = "id = \"MessageId\"\naggregate_id = \"stream\"\nevent_type = \"kind\"\npayload = \"body\"\nversion = \"position\"";

    #[test]
    fn an_id_that_is_no_uuid_is_derived_and_kept_as_the_producers() {
        let m = mapping(TEXT_FIELDS, TEXT_COLS);
        let body = hex(r#"{"n": 1}"#);
        let map = |id: &str| {
            let values = [
                Some(id),
                Some("s-1"),
                Some("Made"),
                Some(body.as_str()),
                Some("7"),
                None,
            ];
            m.map(&row(&values), tx(), None).unwrap()
        };
        let e = map("4b81771282e2cebe-db34f0492c9853ef");
        assert_eq!(
            e.id,
            producer_event_id("public.outbox", &["4b81771282e2cebe-db34f0492c9853ef"])
        );
        assert_eq!(
            e.producer_id.as_deref(),
            Some("4b81771282e2cebe-db34f0492c9853ef")
        );
        assert_eq!(
            map("4b81771282e2cebe-db34f0492c9853ef").id,
            e.id,
            "the same value, the same ID"
        );
        assert_ne!(map("4b81771282e2cebe-db34f0492c9853f0").id, e.id);
        // A UUID in text is the ID itself, as before.
        let u = map(ID);
        assert_eq!(u.id.to_string(), ID);
        assert_eq!(u.producer_id, None);
        // Read from bytea: UTF-8 JSON.
        assert_eq!(e.payload.get("n").unwrap(), 1);
        // aggregate_type left out, no such column: the table's name.
        assert_eq!(e.aggregate_type, "outbox");
        assert_eq!(e.version, Some(7));
    }

    #[test]
    fn a_composite_id_is_the_json_array_of_its_parts_and_a_null_part_is_a_dead_letter() {
        let m = mapping(
            "id = [\"stream\", \"position\"]\naggregate_id = \"stream\"\nevent_type = \"kind\"\npayload = \"body\"\naggregate_type = \"'stream'\"",
            TEXT_COLS,
        );
        let body = hex("{}");
        let e = m
            .map(
                &row(&[
                    None,
                    Some("s-1"),
                    Some("Made"),
                    Some(&body),
                    Some("3"),
                    None,
                ]),
                tx(),
                None,
            )
            .unwrap();
        assert_eq!(e.producer_id.as_deref(), Some(r#"["s-1","3"]"#));
        assert_eq!(e.id, producer_event_id("public.outbox", &["s-1", "3"]));
        assert_eq!(e.aggregate_type, "stream", "a constant");
        // No part's text can make another composite's: ["a-b","c"] is not ["a","b-c"].
        let dl = m
            .map(
                &row(&[None, Some("s-1"), Some("Made"), Some(&body), None, None]),
                tx(),
                None,
            )
            .unwrap_err();
        assert!(
            dl.error.contains("id[1] column `position` is null"),
            "{}",
            dl.error
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_json_are_a_dead_letter_saying_so() {
        let m = mapping(TEXT_FIELDS, TEXT_COLS);
        for (body, error) in [
            ("\\xff00".to_owned(), "not UTF-8"),
            (hex("not json"), "not JSON"),
            ("plain".to_owned(), "not in hex format"),
        ] {
            let dl = m
                .map(
                    &row(&[Some(ID), Some("s"), Some("K"), Some(&body), None, None]),
                    tx(),
                    None,
                )
                .unwrap_err();
            assert!(dl.error.contains("column `body`"), "{}", dl.error);
            assert!(dl.error.contains(error), "{} vs {error}", dl.error);
        }
    }

    #[test]
    fn where_keeps_the_rows_it_is_true_for() {
        let m = mapping(&format!("{TEXT_FIELDS}\nwhere = \"keep\""), TEXT_COLS);
        let body = hex("{}");
        let with = |keep: Option<&'static str>| {
            m.map(
                &row(&[Some(ID), Some("s"), Some("K"), Some(&body), None, keep]),
                tx(),
                None,
            )
        };
        assert!(with(Some("t")).made_event());
        assert!(matches!(with(Some("f")), Mapped::Filtered));
        assert!(matches!(with(None), Mapped::Filtered), "null is not true");
        // A where that is no boolean dead-letters the row, never drops it.
        let m = mapping(&format!("{TEXT_FIELDS}\nwhere = \"stream\""), TEXT_COLS);
        let dl = m
            .map(
                &row(&[Some(ID), Some("s"), Some("K"), Some(&body), None, None]),
                tx(),
                None,
            )
            .unwrap_err();
        assert!(
            dl.error.contains("where (`\"stream\"`) is not a boolean"),
            "{}",
            dl.error
        );
    }

    #[test]
    fn a_bad_elements_dead_letter_keeps_the_element_not_the_whole_array_again() {
        let cols = &[("ref", oid::TEXT), ("ops", oid::JSONB)];
        let m = mapping(
            "expand = \"ops\"\nid = \"element->>'id'\"\naggregate_id = \"'a-1'\"\naggregate_type = \"'a'\"\nevent_type = \"'E'\"\npayload = \"element\"",
            cols,
        );
        let ops = serde_json::to_string(
            &(0..500)
                .map(|n| serde_json::json!({ "n": n }))
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let out: Vec<_> = m
            .map(&row(&[Some("r-1"), Some(&ops)]), tx(), None)
            .into_iter()
            .collect();
        assert_eq!(out.len(), 500);
        let raw_bytes: usize = out
            .iter()
            .map(|o| {
                o.as_ref()
                    .unwrap_err()
                    .raw
                    .as_ref()
                    .unwrap()
                    .to_string()
                    .len()
            })
            .sum();
        // Linear in the row: each letter holds its element and the row's small values.
        assert!(raw_bytes < 200 * 500, "{raw_bytes} bytes of raw rows");
        let raw = out[7].as_ref().unwrap_err().raw.clone().unwrap();
        assert_eq!(raw["ref"], "r-1");
        assert_eq!(raw["element"]["index"], 7);
        assert_eq!(raw["element"]["value"], serde_json::json!({ "n": 7 }));
        assert!(
            raw["ops"].as_str().unwrap().ends_with("bytes, left out>"),
            "{raw}"
        );
    }

    #[test]
    fn expand_makes_one_event_per_element_and_a_bad_element_loses_no_other() {
        let cols = &[("ops", oid::JSONB), ("at", oid::TIMESTAMPTZ)];
        let m = mapping(
            "expand = \"ops\"\nid = \"element\"\naggregate_id = \"'a-1'\"\naggregate_type = \"'a'\"\nevent_type = \"'E'\"\npayload = \"element\"",
            cols,
        );
        let ops = format!(r#"["{ID}", 42, null, "x"]"#);
        let origin = RowOrigin::Wal {
            lsn: Lsn(7),
            index: 2,
            element: 0,
        };
        let out: Vec<_> = m
            .map(&row(&[Some(&ops), None]), tx(), Some(origin))
            .into_iter()
            .collect();
        assert_eq!(out.len(), 4);
        let e0 = out[0].as_ref().unwrap();
        // `element` is jsonb: its text form is JSON, as `element::text` in PostgreSQL.
        assert_eq!(
            e0.producer_id.as_deref(),
            Some(format!("\"{ID}\"").as_str())
        );
        assert_eq!(out[1].as_ref().unwrap().producer_id.as_deref(), Some("42"));
        let dl = out[2].as_ref().unwrap_err();
        assert!(dl.error.starts_with("element 2: "), "{}", dl.error);
        assert_eq!(dl.raw.as_ref().unwrap()["element"]["index"], 2);
        assert!(out[3].is_ok());
        // Each element has an origin of its own: their dead letters are recorded apart.
        let origins: Vec<_> = out
            .iter()
            .map(|o| match o {
                Ok(e) => e.origin,
                Err(d) => d.origin,
            })
            .collect();
        assert_eq!(
            origins[2],
            Some(RowOrigin::Wal {
                lsn: Lsn(7),
                index: 2,
                element: 2
            })
        );
        assert_ne!(origins[0], origins[1]);
        // Not an array: the row is one dead letter.
        for (ops, error) in [
            (r#"{"a": 1}"#, "is an object, not a JSON array"),
            ("[1", "invalid input syntax for type json"),
        ] {
            let dl = m.map(&row(&[Some(ops), None]), tx(), None).unwrap_err();
            assert!(dl.error.contains(error), "{} vs {error}", dl.error);
            assert!(dl.error.starts_with("expand (`\"ops\"`)"), "{}", dl.error);
        }
        // Null: no elements to make events of, said as for any other value.
        let dl = m.map(&row(&[None, None]), tx(), None).unwrap_err();
        assert!(
            dl.error.contains("is null, not a JSON array"),
            "{}",
            dl.error
        );
        // An empty array: no events.
        assert_eq!(
            m.map(&row(&[Some("[]"), None]), tx(), None)
                .into_iter()
                .count(),
            0
        );
    }

    #[test]
    fn an_expression_reading_a_column_the_table_lacks_is_missing_not_a_dead_letter() {
        let m = mapping(
            &format!("{TEXT_FIELDS}\naggregate_type = '\"Kind\"'"),
            TEXT_COLS,
        );
        assert_eq!(
            m.missing_required(),
            Some(("aggregate_type", "Kind".into()))
        );
        let m = mapping(TEXT_FIELDS, TEXT_COLS);
        assert_eq!(m.missing_required(), None);
        // An expression reading a large object is refused like a column.
        let mut cols = TEXT_COLS.to_vec();
        cols[1].1 = LARGE_OBJECT_OID;
        let m = mapping(
            "id = \"MessageId\"\naggregate_id = '\"stream\"'\nevent_type = \"kind\"\npayload = \"body\"",
            &cols,
        );
        let refusal = m.unreadable().unwrap();
        assert!(
            refusal
                .problem
                .contains("column `stream` (outbox.aggregate_id)"),
            "{}",
            refusal.problem
        );
    }

    #[test]
    fn expressions_read_where_each_field_sits_and_a_failing_one_dead_letters_its_row() {
        let cols = &[
            ("stream_name", oid::TEXT),
            ("type", oid::TEXT),
            ("Body", oid::TEXT),
            ("data64", oid::TEXT),
            ("position", oid::INT8),
        ];
        let m = mapping(
            r#"id = ["stream_name", "position"]
aggregate_type = "message_store.category(stream_name)"
aggregate_id = "split_part(stream_name, '-', 2)"
event_type = "\"Body\"::jsonb->'message'->>'kind'"
version = "position::bigint"
payload = "convert_from(decode(data64, 'base64'), 'UTF8')"
headers = "\"Body\"::jsonb->'headers'"
where = "type <> 'Ignored'""#,
            cols,
        );
        assert_eq!(m.missing_required(), None);
        let body = r#"{"message": {"kind": "Paid"}, "headers": {"h": 1}}"#;
        let e = m
            .map(
                &row(&[
                    Some("account-123"),
                    Some("T"),
                    Some(body),
                    Some("eyJuIjogMX0="),
                    Some("4"),
                ]),
                tx(),
                None,
            )
            .unwrap();
        assert_eq!(
            (
                e.aggregate_type.as_str(),
                e.aggregate_id.as_str(),
                e.event_type.as_str()
            ),
            ("account", "123", "Paid")
        );
        assert_eq!(e.version, Some(4));
        assert_eq!(e.payload.get("n").unwrap(), 1);
        assert_eq!(e.headers.unwrap().get("h").unwrap(), 1);
        assert_eq!(e.producer_id.as_deref(), Some(r#"["account-123","4"]"#));
        assert!(matches!(
            m.map(
                &row(&[
                    Some("account-123"),
                    Some("Ignored"),
                    Some(body),
                    Some("e30="),
                    Some("4")
                ]),
                tx(),
                None
            ),
            Mapped::Filtered
        ));
        // Invalid base64 and invalid JSON: the row's dead letter names the key, the
        // expression and what failed.
        let dl = m
            .map(
                &row(&[
                    Some("account-1"),
                    Some("T"),
                    Some(body),
                    Some("%%%"),
                    Some("4"),
                ]),
                tx(),
                None,
            )
            .unwrap_err();
        assert!(
            dl.error
                .starts_with("payload (`convert_from(decode(data64, 'base64'), 'UTF8')`): "),
            "{}",
            dl.error
        );
        let dl = m
            .map(
                &row(&[
                    Some("account-1"),
                    Some("T"),
                    Some("{oops"),
                    Some("e30="),
                    Some("4"),
                ]),
                tx(),
                None,
            )
            .unwrap_err();
        assert!(
            dl.error
                .contains("event_type (`\"Body\"::jsonb->'message'->>'kind'`): "),
            "{}",
            dl.error
        );
        assert_eq!(
            dl.aggregate_id.as_deref(),
            Some("1"),
            "what could be read is kept"
        );
    }

    #[test]
    fn expand_reads_each_element_by_the_pseudo_column() {
        let cols = &[("MessageId", oid::VARCHAR), ("Operations", oid::JSONB)];
        let m = mapping(
            r#"expand = '"Operations"'
id = "element->>'MessageId'"
aggregate_type = "'sales'"
aggregate_id = "element->'Headers'->>'Order'"
event_type = "element->>'MessageType'"
payload = "convert_from(decode(element->>'Body', 'base64'), 'UTF8')""#,
            cols,
        );
        assert_eq!(m.missing_required(), None);
        let ops = r#"[
            {"MessageId": "m-1", "MessageType": "Placed", "Headers": {"Order": "o-1"}, "Body": "eyJhIjogMX0="},
            {"MessageId": "m-2", "MessageType": "Billed", "Headers": {"Order": "o-1"}, "Body": "bm90IGpzb24="}
        ]"#;
        let out: Vec<_> = m
            .map(&row(&[Some("outer"), Some(ops)]), tx(), None)
            .into_iter()
            .collect();
        let e = out[0].as_ref().unwrap();
        assert_eq!(e.producer_id.as_deref(), Some("m-1"));
        assert_eq!(
            (e.aggregate_id.as_str(), e.event_type.as_str()),
            ("o-1", "Placed")
        );
        assert_eq!(e.payload.get("a").unwrap(), 1);
        let dl = out[1].as_ref().unwrap_err();
        assert!(dl.error.starts_with("element 1: payload"), "{}", dl.error);
        assert!(dl.error.contains("not JSON"), "{}", dl.error);
        assert_eq!(
            dl.event_id,
            Some(producer_event_id("public.outbox", &["m-2"]))
        );
    }

    #[test]
    fn a_field_read_from_a_large_object_is_refused_not_folded() {
        let mut cols = COLS.to_vec();
        assert!(Mapping::new(&config(), &relation(&cols))
            .unreadable()
            .is_none());
        cols[5].1 = LARGE_OBJECT_OID;
        let refusal = Mapping::new(&config(), &relation(&cols))
            .unreadable()
            .unwrap();
        assert!(
            refusal
                .problem
                .contains("column `payload` (outbox.payload) is of type oid"),
            "{}",
            refusal.problem
        );
        assert!(refusal.fix.contains("bytea"), "{}", refusal.fix);
    }

    #[test]
    fn a_missing_required_column_is_a_dead_letter_not_a_crash() {
        let m = Mapping::new(&config(), &relation(&COLS[..3]));
        let dl = m
            .map(&row(&[Some(ID), Some("a"), Some("1")]), tx(), None)
            .unwrap_err();
        assert!(
            dl.error.contains("has no column `event_type`"),
            "{}",
            dl.error
        );
        assert_eq!(
            m.missing_required(),
            Some(("event_type", "event_type".into()))
        );
        let full = Mapping::new(&config(), &relation(COLS));
        assert_eq!(full.missing_required(), None);
    }
}

//! Outbox mapping: an inserted outbox row, or a transactional logical decoding message,
//! becomes a [`NewEvent`] with the producer's ID or, when it cannot, a dead letter with
//! the reason and the raw content. One rule for both ([`build`]), here; pure: no I/O.
//!
//! A table outbox's field is a column (read as it comes, nothing evaluated: the fast
//! path) or an expression ([`walfold_expr`]) evaluated over the row; `where` filters
//! rows, `expand` makes one event per element of a JSON array. Each is compiled once
//! per relation (its Relation message, or the catalog for a backfill), so a streamed
//! row and a backfilled one are mapped by the same [`Mapping`] to the same event IDs.
//!
//! The parts: `table.rs` reads a row ([`Mapping`]), `message.rs` a message's JSON keys
//! ([`MessageMapping`]), `limits.rs` what neither can take (too large, a large object's
//! column, `\u0000` that jsonb cannot store).

mod limits;
mod message;
mod table;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use uuid::Uuid;
use walfold_config::OutboxConfig;
use walfold_event::{producer_event_id, DeadLetter, JsonText, Lsn, NewEvent, Reason, RowOrigin};
use walfold_pgoutput::parse_time;

pub use limits::{unreadable_fix, unreadable_type};
pub use message::MessageMapping;
pub use table::{columns_read, Mapped, Mapping, ELEMENT};

/// The fields of an event, indexes into [`OutboxConfig::KEYS`].
const ID: usize = 0;
const AGGREGATE_TYPE: usize = 1;
const AGGREGATE_ID: usize = 2;
const EVENT_TYPE: usize = 3;
const VERSION: usize = 4;
const PAYLOAD: usize = 5;
const HEADERS: usize = 6;
const OCCURRED_AT: usize = 7;

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

fn truncate(s: &str) -> String {
    if s.chars().count() > 64 {
        format!("{}…", s.chars().take(64).collect::<String>())
    } else {
        s.to_owned()
    }
}

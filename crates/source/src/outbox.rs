//! Outbox mapping: an inserted outbox row becomes an [`NewEvent`] with the producer's ID,
//! or, when it cannot, a dead letter with the reason and the raw row. Pure: no I/O.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use uuid::Uuid;
use walfold_config::{OutboxConfig, QualifiedName};
use walfold_pgoutput::{oid, parse_text, Column, Relation, Tuple, Value as PgValue};
use walfold_store::{DeadLetter, Lsn, NewEvent, Reason, RowOrigin};

/// Where each mapped column sits in a relation (as announced by its Relation message).
#[derive(Debug, Clone)]
pub struct Mapping {
    pub table: QualifiedName,
    columns: Vec<(String, u32)>,
    id: Option<usize>,
    aggregate_type: Option<usize>,
    aggregate_id: Option<usize>,
    event_type: Option<usize>,
    version: Option<usize>,
    payload: Option<usize>,
    headers: Option<usize>,
    occurred_at: Option<usize>,
    names: [String; 8],
}

/// The source transaction an insert belongs to.
#[derive(Debug, Clone, Copy)]
pub struct TxContext {
    pub commit_lsn: Lsn,
    pub commit_time: Option<SystemTime>,
}

impl Mapping {
    pub fn new(config: &OutboxConfig, relation: &Relation) -> Mapping {
        let find = |name: &str| relation.columns.iter().position(|c| c.name == name);
        Mapping {
            table: config.table_name(),
            columns: relation
                .columns
                .iter()
                .map(|c| (c.name.clone(), c.type_oid))
                .collect(),
            id: find(&config.id),
            aggregate_type: find(&config.aggregate_type),
            aggregate_id: find(&config.aggregate_id),
            event_type: find(&config.event_type),
            version: find(&config.version),
            payload: find(&config.payload),
            headers: find(&config.headers),
            occurred_at: find(&config.occurred_at),
            names: [
                config.id.clone(),
                config.aggregate_type.clone(),
                config.aggregate_id.clone(),
                config.event_type.clone(),
                config.version.clone(),
                config.payload.clone(),
                config.headers.clone(),
                config.occurred_at.clone(),
            ],
        }
    }

    /// Maps an inserted row read at `origin`. A row that cannot be an event comes back
    /// as a dead letter.
    pub fn map(
        &self,
        row: &Tuple<'_>,
        tx: TxContext,
        origin: Option<RowOrigin>,
    ) -> Result<NewEvent, Box<DeadLetter>> {
        self.try_map(row, tx, origin).map_err(|error| {
            Box::new(DeadLetter {
                subscriber_id: None,
                event_id: self
                    .text(row, self.id)
                    .ok()
                    .flatten()
                    .and_then(|s| Uuid::try_parse(&s).ok()),
                seq: None,
                aggregate_type: self.text(row, self.aggregate_type).ok().flatten(),
                aggregate_id: self.text(row, self.aggregate_id).ok().flatten(),
                reason: Reason::Malformed,
                error,
                raw: Some(self.raw(row)),
                existing: None,
                attempts: 1,
                source_lsn: Some(tx.commit_lsn),
                origin,
            })
        })
    }

    fn try_map(
        &self,
        row: &Tuple<'_>,
        tx: TxContext,
        origin: Option<RowOrigin>,
    ) -> Result<NewEvent, String> {
        let required = |idx: Option<usize>, name: &str| -> Result<String, String> {
            match self.text(row, idx) {
                Ok(Some(v)) => Ok(v),
                Ok(None) => Err(format!("column `{name}` is null")),
                Err(e) => Err(e),
            }
        };
        let [id_col, at_col, aid_col, et_col, v_col, p_col, h_col, o_col] = &self.names;
        let id_text = required(self.id, id_col)?;
        let id = Uuid::try_parse(id_text.trim())
            .map_err(|_| format!("column `{id_col}` is not a UUID: `{}`", truncate(&id_text)))?;
        let aggregate_type = required(self.aggregate_type, at_col)?;
        let aggregate_id = required(self.aggregate_id, aid_col)?;
        let event_type = required(self.event_type, et_col)?;
        let version =
            match self.optional(row, self.version)? {
                None => None,
                Some(v) => Some(v.trim().parse::<i64>().map_err(|_| {
                    format!("column `{v_col}` is not an integer: `{}`", truncate(&v))
                })?),
            };
        let payload_text = required(self.payload, p_col)?;
        refuse_nul(&payload_text, p_col)?;
        let payload: Value = serde_json::from_str(&payload_text)
            .map_err(|e| format!("column `{p_col}` is not JSON: {e}"))?;
        let headers = match self.optional(row, self.headers)? {
            None => None,
            Some(h) => {
                refuse_nul(&h, h_col)?;
                Some(
                    serde_json::from_str(&h)
                        .map_err(|e| format!("column `{h_col}` is not JSON: {e}"))?,
                )
            }
        };
        let occurred_at = match self.optional(row, self.occurred_at)? {
            None => None,
            Some(t) => match parse_text(oid::TIMESTAMPTZ, t.as_bytes()) {
                Ok(PgValue::Timestamptz(us)) => Some(unix_micros(us)),
                _ => {
                    return Err(format!(
                        "column `{o_col}` is not a timestamptz: `{}`",
                        truncate(&t)
                    ))
                }
            },
        };
        Ok(NewEvent {
            id,
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

    /// A column's text, `None` for SQL null. A column missing from the table is an error
    /// for required columns, handled by the caller for optional ones.
    fn text(&self, row: &Tuple<'_>, idx: Option<usize>) -> Result<Option<String>, String> {
        let Some(i) = idx else {
            return Err("a required column is missing from the outbox table".into());
        };
        match row.columns.get(i) {
            None => Err(format!(
                "row has {} columns, expected more",
                row.columns.len()
            )),
            Some(Column::Null) => Ok(None),
            Some(Column::Unchanged) => Err("column value not sent (unchanged TOAST)".into()),
            Some(Column::Text(b)) | Some(Column::Binary(b)) => std::str::from_utf8(b)
                .map(|s| Some(s.to_owned()))
                .map_err(|_| "column value is not UTF-8".into()),
        }
    }

    /// An optional column: absent from the table or null is `None`.
    fn optional(&self, row: &Tuple<'_>, idx: Option<usize>) -> Result<Option<String>, String> {
        match idx {
            None => Ok(None),
            some => self.text(row, some),
        }
    }

    /// The raw row as JSON (column → text), for dead letters.
    fn raw(&self, row: &Tuple<'_>) -> Value {
        let mut map = Map::new();
        for (i, col) in row.columns.iter().enumerate() {
            let name = self
                .columns
                .get(i)
                .map_or_else(|| format!("column_{i}"), |(n, _)| n.clone());
            let value = match col {
                Column::Null => Value::Null,
                Column::Unchanged => Value::String("<unchanged toast>".into()),
                Column::Text(b) | Column::Binary(b) => {
                    Value::String(String::from_utf8_lossy(b).into_owned())
                }
            };
            map.insert(name, value);
        }
        Value::Object(map)
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
fn refuse_nul(text: &str, column: &str) -> Result<(), String> {
    if has_nul_escape(text) {
        Err(format!(
            "column `{column}` contains \\u0000, which jsonb cannot store"
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
        assert_eq!(e.payload["amount"], "12.50");
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
            e.payload["amount"].to_string(),
            "12345678901234567890.123456789012"
        );
        assert_eq!(
            e.payload["n"].to_string(),
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
                    Some("nope"),
                    Some("a"),
                    Some("1"),
                    Some("T"),
                    Some("1"),
                    Some("{}"),
                    None,
                ],
                "not a UUID",
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
        assert_eq!(e.payload["path"], "C:\\u0000");
        let dl = m
            .map(&with(r#"{"path": "\u0000"}"#), tx(), None)
            .unwrap_err();
        assert!(dl.error.contains("jsonb cannot store"), "{}", dl.error);
    }

    #[test]
    fn a_missing_required_column_is_a_dead_letter_not_a_crash() {
        let m = Mapping::new(&config(), &relation(&COLS[..3]));
        let dl = m
            .map(&row(&[Some(ID), Some("a"), Some("1")]), tx(), None)
            .unwrap_err();
        assert!(dl.error.contains("missing"), "{}", dl.error);
    }
}

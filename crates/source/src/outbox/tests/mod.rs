//! The outbox mapping's tests, by part (a table's rows, messages, limits), and the rows,
//! relations and configs they share.

mod limits;
mod message;
mod table;

use walfold_config::OutboxConfig;
use walfold_event::{DeadLetter, Lsn, NewEvent};
use walfold_pgoutput::{oid, Column, Relation, RelationColumn, Tuple};

use super::{Mapped, TxContext};

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

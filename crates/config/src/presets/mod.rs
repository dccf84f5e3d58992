//! Named mappings for the outbox and event tables frameworks create (`preset = "marten"`
//! in an `[[outbox]]`): each field's column or expression as that framework writes the
//! table, and the columns `walfold init` recognises it by. A field the config sets
//! explicitly wins over its preset's.
//!
//! One file per framework; each cites where its table's DDL comes from.

mod akka_jdbc;
mod axon;
mod commanded;
mod debezium;
mod emmett;
mod eventsourcing;
mod eventuate_local;
mod eventuate_tram;
mod eventuous;
mod marten;
mod masstransit;
mod message_db;
mod nservicebus;
mod rails_event_store;
mod spatie;
mod spring_modulith;
mod watermill;
mod wolverine;

/// One framework's table and where each event field sits in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    /// `preset = "…"` in the config, e.g. `message_db`.
    pub name: &'static str,
    /// For people: `Eventide Message DB`.
    pub framework: &'static str,
    /// Where the DDL was read: repository and path.
    pub ddl_source: &'static str,
    /// Why the preset's `aggregate_id` is a stand-in, where the framework's rows carry
    /// no aggregate (Spring Modulith, Wolverine, Watermill): a read model keyed on it
    /// gets a row per message, not per aggregate. `None`: it is the aggregate's.
    pub aggregate_stand_in: Option<&'static str>,
    /// The table as the framework names it by default (`message_store.messages`).
    pub table: &'static str,
    /// The columns (as the framework spells them) a table must have to be recognised
    /// as this framework's by `walfold init`, compared without case.
    pub columns: &'static [&'static str],
    /// The producer's event ID: one expression, or several for a composite identity.
    pub id: &'static [&'static str],
    /// The other `[[outbox]]` keys this preset sets (`aggregate_type`, `aggregate_id`,
    /// `event_type`, `version`, `payload`, `headers`, `occurred_at`, `where`,
    /// `expand`), as (key, column or expression).
    pub fields: &'static [(&'static str, &'static str)],
}

/// Every preset, in the order `walfold init` tries them (most specific shape first).
pub const PRESETS: &[Preset] = &[
    message_db::MESSAGE_DB,
    marten::MARTEN,
    emmett::EMMETT,
    eventuous::EVENTUOUS,
    masstransit::MASSTRANSIT,
    nservicebus::NSERVICEBUS,
    eventuate_tram::EVENTUATE_TRAM,
    eventuate_local::EVENTUATE_LOCAL,
    spring_modulith::SPRING_MODULITH,
    wolverine::WOLVERINE,
    watermill::WATERMILL,
    axon::AXON,
    akka_jdbc::AKKA_JDBC,
    eventsourcing::EVENTSOURCING,
    spatie::SPATIE,
    rails_event_store::RAILS_EVENT_STORE,
    commanded::COMMANDED,
    debezium::DEBEZIUM,
];

impl Preset {
    /// What it sets for `key` (one of the `[[outbox]]` keys but `id`).
    pub fn field(&self, key: &str) -> Option<&'static str> {
        self.fields.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    /// Its `aggregate_id` when that is a stand-in, with why.
    pub fn stand_in(&self) -> Option<(&'static str, &'static str)> {
        Some((self.field("aggregate_id")?, self.aggregate_stand_in?))
    }
}

/// The preset named `name`.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A field set to a bare column the table lacks is refused at start: every column a
    /// preset names must be one `walfold init` recognises its table by.
    #[test]
    fn every_column_a_preset_names_is_one_its_table_is_recognised_by() {
        let bare = |v: &str| v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        let mut missing = Vec::new();
        for p in PRESETS {
            let named = p.id.iter().copied().chain(
                p.fields
                    .iter()
                    .filter(|(k, _)| !matches!(*k, "where" | "expand"))
                    .map(|(_, v)| *v),
            );
            for column in named.filter(|v| bare(v)) {
                if !p.columns.iter().any(|c| c.eq_ignore_ascii_case(column)) {
                    missing.push(format!("{}: {column}", p.name));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "not among the columns recognised: {missing:?}"
        );
    }
}

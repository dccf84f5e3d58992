//! How `walfold init` maps a table: a framework's table by its preset's columns, else
//! each `[[outbox]]` key to the column named and typed like it under the spellings ORMs
//! use; and a read model's `table` projection from its key and version columns.

use walfold_config::presets::{Preset, PRESETS};
use walfold_config::QualifiedName;
use walfold_source::shape::ModelTable;

use crate::Failure;

/// One mapped key of `[[outbox]]`: the spellings looked for (compared without case and
/// underscores) and the column types accepted.
pub(super) struct Key {
    pub(super) key: &'static str,
    pub(super) spellings: &'static [&'static str],
    types: fn(&str) -> bool,
    pub(super) required: bool,
}

pub(super) fn text_like(t: &str) -> bool {
    matches!(t, "text" | "character varying" | "character")
}
fn id_type(t: &str) -> bool {
    t == "uuid" || text_like(t)
}
fn any_type(_: &str) -> bool {
    true
}
pub(super) fn integer(t: &str) -> bool {
    matches!(t, "smallint" | "integer" | "bigint")
}
fn json_like(t: &str) -> bool {
    matches!(t, "json" | "jsonb") || text_like(t)
}
fn json_only(t: &str) -> bool {
    matches!(t, "json" | "jsonb")
}
fn timestamptz(t: &str) -> bool {
    t == "timestamp with time zone"
}

/// In the config's order. `id` prefers a uuid column (Rails and Django keep a bigint
/// `id` beside a uuid `event_id`).
pub(super) const KEYS: &[Key] = &[
    Key {
        key: "id",
        spellings: &["id", "eventid", "uuid", "messageid"],
        types: id_type,
        required: true,
    },
    Key {
        key: "aggregate_type",
        spellings: &["aggregatetype"],
        types: any_type,
        required: true,
    },
    Key {
        key: "aggregate_id",
        spellings: &["aggregateid"],
        types: any_type,
        required: true,
    },
    Key {
        key: "event_type",
        spellings: &["eventtype", "type"],
        types: any_type,
        required: true,
    },
    Key {
        key: "version",
        spellings: &["version", "sequence", "aggregateversion", "seq"],
        types: integer,
        required: false,
    },
    Key {
        key: "payload",
        spellings: &["payload", "data", "body"],
        types: json_like,
        required: true,
    },
    Key {
        key: "headers",
        spellings: &["headers", "metadata"],
        types: json_only,
        required: false,
    },
    Key {
        key: "occurred_at",
        spellings: &["occurredat", "createdat", "timestamp"],
        types: timestamptz,
        required: false,
    },
];

pub(super) fn normalized(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

/// The config's rule for names: 1-63 ASCII letters, digits and `_`, not starting with
/// a digit (anything else is refused at load).
pub(super) fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit()
}

/// A table of the database with its columns (name, type).
pub(super) struct Table {
    pub(super) name: QualifiedName,
    pub(super) columns: Vec<(String, String)>,
}

/// A table's mapping: (key, column) for each mapped key, or what is missing.
pub(super) struct Mapped {
    pub(super) table: QualifiedName,
    pub(super) columns: Vec<(&'static str, String)>,
    /// Optional keys whose default column name exists with a type walfold cannot read:
    /// mapped away from it, with the reason.
    pub(super) unmapped: Vec<(&'static str, String)>,
    /// A framework's table: its preset (then `columns` and `unmapped` are empty).
    pub(super) preset: Option<Recognised>,
}

impl Mapped {
    /// Whether its events carry a version (a column or the preset's expression).
    pub(super) fn versioned(&self) -> bool {
        match &self.preset {
            Some(r) => {
                r.preset.fields.iter().any(|(k, _)| *k == "version")
                    || r.columns.iter().any(|c| c == "version")
            }
            None => self.columns.iter().any(|(k, _)| *k == "version"),
        }
    }
}

/// A table recognised as a framework's.
pub(super) struct Recognised {
    pub(super) preset: &'static Preset,
    /// The table's columns (as the database spells them).
    pub(super) columns: Vec<String>,
    /// For a table with one row per event and per value of a column: that column and
    /// what the table holds of it (see [`ONE_ROW_PER`]).
    pub(super) one_row_per: Option<OneRowPer>,
    /// What `aggregate_id` is written as.
    pub(super) aggregate: Aggregate,
    /// `--where`: the rows that are events, as the operator said.
    pub(super) chosen_where: Option<String>,
}

/// Presets whose table holds one row per event *and* per value of a column (Spring
/// Modulith: one per listener), and the column of the event's type: one value's rows
/// of a type are each event of that type once, so init keeps, for each type, one
/// value's rows (`where`).
pub(super) const ONE_ROW_PER: &[(&str, &str, &str)] = &[
    ("spring_modulith", "listener_id", "event_type"),
    ("wolverine", "destination", "message_type"),
];

/// A table with one row per event and per value of `column`.
pub(super) struct OneRowPer {
    pub(super) column: String,
    pub(super) type_column: String,
    /// The (value, event type) pairs the table holds, in order.
    pub(super) pairs: Vec<(String, String)>,
}

impl OneRowPer {
    /// The values, in order, once each.
    pub(super) fn values(&self) -> Vec<&str> {
        let mut values: Vec<&str> = self.pairs.iter().map(|(v, _)| v.as_str()).collect();
        values.dedup();
        values
    }

    /// The event types, once each.
    fn types(&self) -> Vec<&str> {
        let mut types: Vec<&str> = self.pairs.iter().map(|(_, t)| t.as_str()).collect();
        types.sort_unstable();
        types.dedup();
        types
    }

    /// The rows that are each event once: one value's, when one value has rows of every
    /// type the table holds; else, per type, the first value's rows of it (`None`: the
    /// table holds no rows).
    pub(super) fn filter(&self, quote: impl Fn(&str) -> String) -> Option<Filter> {
        let literal = |v: &str| format!("'{}'", v.replace('\'', "''"));
        let (column, type_column) = (quote(&self.column), quote(&self.type_column));
        let types = self.types();
        let covers = |value: &str| {
            types
                .iter()
                .all(|t| self.pairs.iter().any(|(v, pt)| v == value && pt == t))
        };
        if let Some(value) = self.values().into_iter().find(|v| covers(v)) {
            return Some(Filter::One(
                value.to_owned(),
                format!("{column} = {}", literal(value)),
            ));
        }
        let per_type: Vec<(String, String)> = types
            .iter()
            .filter_map(|t| {
                let (v, _) = self.pairs.iter().find(|(_, pt)| pt == t)?;
                Some((t.to_string(), v.clone()))
            })
            .collect();
        (!per_type.is_empty()).then(|| {
            let expr = per_type
                .iter()
                .map(|(t, v)| {
                    format!(
                        "({type_column} = {} and {column} = {})",
                        literal(t),
                        literal(v)
                    )
                })
                .collect::<Vec<_>>()
                .join(" or ");
            Filter::PerType(per_type, expr)
        })
    }
}

/// The `where` init writes for a [`OneRowPer`] table.
pub(super) enum Filter {
    /// One value's rows have every type: (the value, the expression).
    One(String, String),
    /// No value has: per type (type, value), and the expression.
    PerType(Vec<(String, String)>, String),
}

/// What init writes for `aggregate_id`.
pub(super) enum Aggregate {
    /// The preset's: the framework's rows carry their aggregate.
    Preset,
    /// `--aggregate-id`, as given.
    Given(String),
    /// The preset's is a stand-in; proposed instead from a JSON key of the sampled
    /// payloads.
    Proposed(Proposal),
    /// The preset's is a stand-in and nothing better was found: written, marked.
    StandIn {
        value: &'static str,
        why: &'static str,
    },
}

/// An `aggregate_id` read from the payload's key `key`.
pub(super) struct Proposal {
    pub(super) expression: String,
    pub(super) key: String,
    /// Events whose payload has it, of those sampled.
    pub(super) seen: usize,
    pub(super) sampled: usize,
    /// Other keys that look like an identity, best first.
    pub(super) others: Vec<String>,
}

/// Whether a JSON key looks like an identity (`orderId`, `order_id`, `OrderId`, `id`,
/// `article_uuid`).
fn identity_like(key: &str) -> bool {
    normalized(key).ends_with("id")
}

/// A key's name without its identity suffix (`article_uuid`: `article`).
fn identity_stem(key: &str) -> String {
    let n = normalized(key);
    n.strip_suffix("uuid")
        .or_else(|| n.strip_suffix("id"))
        .unwrap_or(&n)
        .to_owned()
}

/// The last word of an event type (`com.example.order.OrderCompleted`:
/// `ordercompleted`), lower case.
fn type_word(event_type: &str) -> String {
    event_type
        .rsplit(['.', ':', '+', '/', '$'])
        .next()
        .unwrap_or(event_type)
        .to_lowercase()
}

/// The key of the sampled payloads that most looks like their aggregate's identity: a
/// string or number under a key like an identity, in every payload if one is, the one
/// whose name starts the event types (`orderId` of `OrderCompleted`) first, then the
/// one seen most, a plain `id` last. `samples`: (event type, payload).
pub(super) fn aggregate_key(
    samples: &[(&str, &serde_json::Value)],
) -> Option<(String, usize, Vec<String>)> {
    struct Seen {
        key: String,
        count: usize,
        named: usize,
        first: usize,
    }
    let mut seen: Vec<Seen> = Vec::new();
    let mut objects = 0;
    for (event_type, payload) in samples {
        let Some(object) = payload.as_object() else {
            continue;
        };
        objects += 1;
        let word = type_word(event_type);
        for (key, value) in object {
            if !identity_like(key) || !(value.is_string() || value.is_number()) {
                continue;
            }
            let stem = identity_stem(key);
            let named = usize::from(!stem.is_empty() && word.starts_with(&stem));
            match seen.iter_mut().find(|s| s.key == *key) {
                Some(s) => {
                    s.count += 1;
                    s.named += named;
                }
                None => {
                    let first = seen.len();
                    seen.push(Seen {
                        key: key.clone(),
                        count: 1,
                        named,
                        first,
                    });
                }
            }
        }
    }
    seen.sort_by_key(|s| {
        (
            s.count < objects,
            std::cmp::Reverse(s.named),
            std::cmp::Reverse(s.count),
            normalized(&s.key) == "id",
            s.first,
        )
    });
    let mut keys = seen.into_iter();
    let best = keys.next()?;
    Some((best.key, best.count, keys.map(|s| s.key).collect()))
}

/// An expression reading `key` of the JSON that `payload` (a column or an expression)
/// gives as `kind`.
pub(super) fn json_key_expression(
    payload: &str,
    is_column: bool,
    kind: walfold_source::PayloadKind,
    key: &str,
) -> String {
    use walfold_source::PayloadKind as K;
    let base = if is_column {
        super::render::column_in_expression(payload)
    } else {
        format!("({payload})")
    };
    let json = match kind {
        K::Json if is_column => base,
        K::Json if payload.contains(' ') => base,
        K::Json => payload.to_owned(),
        K::Text if !is_column && payload.ends_with("::jsonb") => payload.to_owned(),
        K::Text => format!("{base}::jsonb"),
        K::Bytes if is_column => format!("convert_from({base}, 'UTF8')::jsonb"),
        K::Bytes => format!("convert_from({payload}, 'UTF8')::jsonb"),
    };
    format!("{json}->>'{}'", key.replace('\'', "''"))
}

/// The presets whose columns the table has (compared without case), in `PRESETS`
/// order: a framework's table is its first.
pub(super) fn presets_of<'a>(
    columns: impl Iterator<Item = &'a str> + Clone,
) -> Vec<&'static Preset> {
    PRESETS
        .iter()
        .filter(|p| {
            p.columns.iter().all(|wanted| {
                columns
                    .clone()
                    .any(|c| c.to_lowercase() == wanted.to_lowercase())
            })
        })
        .collect()
}

pub(super) fn map_table(t: &Table) -> Result<Mapped, Vec<String>> {
    if let Some(preset) = presets_of(t.columns.iter().map(|(n, _)| n.as_str()))
        .first()
        .copied()
    {
        return Ok(Mapped {
            table: t.name.clone(),
            columns: Vec::new(),
            unmapped: Vec::new(),
            preset: Some(Recognised {
                preset,
                columns: t.columns.iter().map(|(n, _)| n.clone()).collect(),
                one_row_per: None,
                aggregate: Aggregate::Preset,
                chosen_where: None,
            }),
        });
    }
    map_columns(t)
}

/// The mapping of a table no preset recognises, from its columns' names and types.
fn map_columns(t: &Table) -> Result<Mapped, Vec<String>> {
    let mut columns = Vec::new();
    let mut missing = Vec::new();
    let mut unmapped = Vec::new();
    for k in KEYS {
        let candidates = t.columns.iter().filter(|(name, ty)| {
            valid_name(name) && (k.types)(ty) && k.spellings.contains(&normalized(name).as_str())
        });
        // The earliest spelling wins; for the ID a uuid column before a text one.
        let best = candidates.min_by_key(|(name, ty)| {
            let rank = k
                .spellings
                .iter()
                .position(|s| *s == normalized(name))
                .unwrap_or(usize::MAX);
            (k.key == "id" && ty != "uuid", rank)
        });
        match best {
            Some((name, _)) => columns.push((k.key, name.clone())),
            None if k.required => missing.push(format!("{} ({})", k.key, k.spellings.join("/"))),
            None => {
                // walfold would read a column named like the key's default by itself.
                if let Some((_, ty)) = t.columns.iter().find(|(n, _)| n == k.key) {
                    unmapped.push((k.key, ty.clone()));
                }
            }
        }
    }
    if missing.is_empty() {
        Ok(Mapped {
            table: t.name.clone(),
            columns,
            unmapped,
            preset: None,
        })
    } else {
        Err(missing)
    }
}

/// A `table` projection for a read-model table: its key (a one-column primary key or
/// unique index), its version column, and the other columns from the payload field of
/// the same name (cast to the column's type).
pub(super) struct ReadModel {
    pub(super) table: QualifiedName,
    pub(super) key: String,
    pub(super) key_type: String,
    pub(super) version: String,
    pub(super) columns: Vec<(String, String)>,
}

/// The `table` projection of table `name` as the catalog describes it (`table`).
pub(super) fn read_model(name: &QualifiedName, table: ModelTable) -> Result<ReadModel, Failure> {
    let ModelTable {
        columns,
        unique_keys: keys,
    } = table;
    let key = keys.iter().find(|k| k.len() == 1).map(|k| k[0].clone());
    let Some(key) = key else {
        return Err(Failure::config(format!(
            "--read-model {name}: a `table` projection needs a one-column primary key or unique \
             index (its key, filled from the aggregate ID); this table has none"
        )));
    };
    let Some(version) = version_column(&columns, &key) else {
        return Err(Failure::config(format!(
            "--read-model {name}: a `table` projection needs an integer version column (the \
             guard: a row is updated only by a higher version); none of its columns is named \
             like one (version, last_version, sequence)"
        )));
    };
    let key_type = columns
        .iter()
        .find(|(n, _, _)| *n == key)
        .map(|(_, t, _)| t.clone())
        .unwrap_or_default();
    let mapped = columns
        .iter()
        .filter(|(n, _, generated)| *n != key && *n != version && !generated && valid_name(n))
        .map(|(n, t, _)| {
            let expr = if text_like(t) {
                format!(":payload.{n}")
            } else {
                format!(":payload.{n}::{t}")
            };
            (n.clone(), expr)
        })
        .collect();
    Ok(ReadModel {
        table: name.clone(),
        key,
        key_type,
        version,
        columns: mapped,
    })
}

/// The read model's version column: an integer one (not the key) named like a version,
/// the best-known spelling first.
fn version_column(columns: &[(String, String, bool)], key: &str) -> Option<String> {
    let version_names = [
        "version",
        "lastversion",
        "aggregateversion",
        "sequence",
        "seq",
    ];
    columns
        .iter()
        .filter(|(n, t, _)| *n != key && integer(t))
        .min_by_key(|(n, _, _)| {
            let n = normalized(n);
            version_names
                .iter()
                .position(|v| *v == n)
                .unwrap_or(if n.ends_with("version") {
                    100
                } else {
                    usize::MAX
                })
        })
        .filter(|(n, _, _)| {
            let n = normalized(n);
            version_names.contains(&n.as_str()) || n.ends_with("version")
        })
        .map(|(n, _, _)| n.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str, cols: &[(&str, &str)]) -> Table {
        Table {
            name: QualifiedName::parse(name).unwrap(),
            columns: cols
                .iter()
                .map(|(n, t)| (n.to_string(), t.to_string()))
                .collect(),
        }
    }

    fn mapping(m: &Mapped) -> Vec<String> {
        m.columns.iter().map(|(k, c)| format!("{k}={c}")).collect()
    }

    #[test]
    fn conventions_map_to_their_columns() {
        let prisma = table(
            "OutboxEvent",
            &[
                ("id", "text"),
                ("aggregateType", "text"),
                ("aggregateId", "text"),
                ("eventType", "text"),
                ("payload", "jsonb"),
                ("createdAt", "timestamp without time zone"),
            ],
        );
        assert_eq!(
            mapping(&map_table(&prisma).unwrap()),
            [
                "id=id",
                "aggregate_type=aggregateType",
                "aggregate_id=aggregateId",
                "event_type=eventType",
                "payload=payload"
            ]
        );
        let rails = table(
            "app_outboxevent",
            &[
                ("id", "bigint"),
                ("event_id", "uuid"),
                ("aggregate_type", "character varying"),
                ("aggregate_id", "character varying"),
                ("event_type", "character varying"),
                ("payload", "jsonb"),
                ("created_at", "timestamp with time zone"),
            ],
        );
        let m = map_table(&rails).unwrap();
        assert!(mapping(&m).contains(&"id=event_id".to_owned()));
        assert!(mapping(&m).contains(&"occurred_at=created_at".to_owned()));
        let debezium = table(
            "outboxevent",
            &[
                ("id", "uuid"),
                ("aggregatetype", "character varying"),
                ("aggregateid", "character varying"),
                ("type", "character varying"),
                ("payload", "jsonb"),
            ],
        );
        assert!(mapping(&map_table(&debezium).unwrap()).contains(&"event_type=type".to_owned()));
        let not = table("users", &[("id", "bigint"), ("name", "text")]);
        assert!(map_table(&not).is_err());
        // A default-named optional column of a type walfold cannot read is mapped away.
        let odd = table(
            "outbox",
            &[
                ("id", "uuid"),
                ("aggregate_type", "text"),
                ("aggregate_id", "text"),
                ("event_type", "text"),
                ("payload", "jsonb"),
                ("occurred_at", "timestamp without time zone"),
            ],
        );
        assert_eq!(map_table(&odd).unwrap().unmapped.len(), 1);
    }

    /// A table with exactly `preset`'s columns, spelled in `case`.
    fn framework_table(preset: &Preset, case: fn(&str) -> String) -> Table {
        Table {
            name: QualifiedName::parse(preset.table).unwrap_or_else(|_| {
                QualifiedName::parse(&format!("public.{}", preset.name)).unwrap()
            }),
            columns: preset
                .columns
                .iter()
                .map(|c| (case(c), "text".to_owned()))
                .collect(),
        }
    }

    #[test]
    fn each_framework_table_is_recognised_as_its_preset_without_case() {
        assert!(!PRESETS.is_empty());
        for p in PRESETS {
            for case in [
                |c: &str| c.to_owned(),
                |c: &str| c.to_lowercase(),
                |c: &str| c.to_uppercase(),
            ] {
                let t = framework_table(p, case);
                let m = map_table(&t).unwrap_or_else(|e| panic!("{}: {e:?}", p.name));
                assert_eq!(
                    m.preset.as_ref().map(|r| r.preset.name),
                    Some(p.name),
                    "{}",
                    p.name
                );
            }
            // One recognising column missing: not this framework's table.
            let mut t = framework_table(p, |c| c.to_owned());
            t.columns.pop();
            assert!(
                !presets_of(t.columns.iter().map(|(n, _)| n.as_str())).contains(&p),
                "{}: recognised without all its columns",
                p.name
            );
        }
    }

    #[test]
    fn no_two_presets_claim_the_same_table() {
        let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "preset names repeat: {names:?}");
        for p in PRESETS {
            // A table with p's columns (and so any table of p's shape) is p's alone: no
            // other preset's columns are a subset of p's.
            let claims: Vec<&str> = presets_of(p.columns.iter().copied())
                .iter()
                .map(|q| q.name)
                .collect();
            assert_eq!(claims, [p.name], "{} is claimed by {claims:?}", p.name);
        }
    }

    #[test]
    fn the_payload_key_like_the_aggregates_identity_is_proposed() {
        let completed = serde_json::json!({"customerId": "c-1", "orderId": "o-1", "total": 3});
        let shipped = serde_json::json!({"orderId": "o-1", "carrier": "dhl"});
        let samples = [
            ("com.example.order.OrderCompleted", &completed),
            ("com.example.order.OrderShipped", &shipped),
        ];
        let (key, seen, others) = aggregate_key(&samples).unwrap();
        assert_eq!((key.as_str(), seen), ("orderId", 2));
        assert_eq!(others, ["customerId"]);
        // A plain `id` only when nothing else looks like one; no identity at all: none.
        let card = serde_json::json!({"id": "gc-1", "amount": 3});
        assert_eq!(aggregate_key(&[("IssuedEvt", &card)]).unwrap().0, "id");
        let published = serde_json::json!({"author_uuid": "a-1", "article_uuid": "b-1"});
        assert_eq!(
            aggregate_key(&[("Elixir.Conduit.Blog.Events.ArticlePublished", &published)])
                .unwrap()
                .0,
            "article_uuid"
        );
        let none = serde_json::json!({"amount": 3, "paid": true});
        assert!(aggregate_key(&[("Paid", &none)]).is_none());
        assert!(aggregate_key(&[]).is_none());
        use walfold_source::PayloadKind as K;
        assert_eq!(
            json_key_expression("serialized_event", true, K::Text, "orderId"),
            "serialized_event::jsonb->>'orderId'"
        );
        assert_eq!(
            json_key_expression("payload", true, K::Json, "order_id"),
            "payload->>'order_id'"
        );
        assert_eq!(
            json_key_expression("Body", true, K::Bytes, "o'k"),
            "convert_from(\"Body\", 'UTF8')::jsonb->>'o''k'"
        );
        assert_eq!(
            json_key_expression("substring(body from 3)", false, K::Bytes, "OrderId"),
            "convert_from(substring(body from 3), 'UTF8')::jsonb->>'OrderId'"
        );
    }

    #[test]
    fn a_walfold_shaped_outbox_keeps_its_column_mapping() {
        let outbox = table(
            "outbox",
            &[
                ("id", "uuid"),
                ("aggregate_type", "text"),
                ("aggregate_id", "text"),
                ("event_type", "text"),
                ("version", "bigint"),
                ("payload", "jsonb"),
            ],
        );
        let m = map_table(&outbox).unwrap();
        assert!(m.preset.is_none());
        assert!(mapping(&m).contains(&"aggregate_type=aggregate_type".to_owned()));
    }
}

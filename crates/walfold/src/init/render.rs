//! The config `walfold init` writes: every section commented, each outbox's mapping (a
//! framework's preset written out field by field), the grants message outboxes need,
//! and one example projection.

use walfold_config::QualifiedName;

use super::mapping::text_like;
use super::mapping::{Aggregate, Filter, Mapped, OneRowPer, ReadModel, Recognised, KEYS};

/// A TOML basic string (JSON's escapes are TOML's).
pub(super) fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// A column in an expression: bare when PostgreSQL would fold it to itself, else quoted.
pub(super) fn column_in_expression(column: &str) -> String {
    let plain = column
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !column.as_bytes()[0].is_ascii_digit();
    if plain {
        column.to_owned()
    } else {
        walfold_config::quote_ident(column)
    }
}

/// `text` in lines of at most `width` characters, broken between words only (a word
/// longer than `width`, a path, is a line of its own).
fn wrapped(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.len() + 1 + word.len() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_owned()),
        }
    }
    lines
}

/// The `[[outbox]]` keys of a framework's table: the preset and each of its fields,
/// written out so the user sees and can change every one.
fn render_preset(t: &mut String, table: &QualifiedName, r: &Recognised) {
    let p = r.preset;
    t.push_str(&format!(
        "# {}: recognised by its columns. Its table as the framework creates it:\n",
        p.framework
    ));
    for line in wrapped(p.ddl_source, 84) {
        t.push_str(&format!("#   {line}\n"));
    }
    t.push_str(
        "# Every field below is the preset's, written out: change any (a field set here wins).\n",
    );
    t.push_str(&format!("preset = {}\n", toml_str(p.name)));
    match p.id {
        [one] => t.push_str(&format!("id = {}\n", toml_str(one))),
        parts => {
            let parts: Vec<String> = parts.iter().map(|v| toml_str(v)).collect();
            t.push_str(&format!(
                "# A composite identity: the event ID is derived from these parts together.\n\
                 id = [{}]\n",
                parts.join(", ")
            ));
        }
    }
    let field = |key: &str| p.fields.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    for key in KEYS.iter().map(|k| k.key).filter(|k| *k != "id") {
        if key == "aggregate_id" && !matches!(r.aggregate, Aggregate::Preset) {
            aggregate_id(t, &r.aggregate);
        } else if let Some(v) = field(key) {
            t.push_str(&format!("{key} = {}\n", toml_str(v)));
        } else if r.columns.iter().any(|c| c == key) {
            t.push_str(&format!(
                "# Not the preset's: the column of walfold's default name.\n{key} = {}\n",
                toml_str(key)
            ));
        } else {
            t.push_str(&match key {
                "aggregate_type" => format!(
                    "# aggregate_type: not in this table: it is the table's name (`{}`), or set a\n\
                     # constant: aggregate_type = \"'order'\"\n",
                    table.name
                ),
                "version" => {
                    "# version: none in this table (optional; `table` projections and version \
                              guards need it).\n"
                        .to_owned()
                }
                _ => format!("# {key}: none in this table (optional).\n"),
            });
        }
    }
    if let Some(v) = field("where") {
        t.push_str(&format!("where = {}\n", toml_str(v)));
    } else if let Some(w) = &r.chosen_where {
        t.push_str(&format!(
            "# The rows that are events (--where).\nwhere = {}\n",
            toml_str(w)
        ));
    } else if let Some(o) = &r.one_row_per {
        one_row_per(t, o);
    }
    if let Some(v) = field("expand") {
        t.push_str(&format!(
            "# One event per element of this JSON array; the fields read it as `element`.\n\
             expand = {}\n",
            toml_str(v)
        ));
    }
}

/// `aggregate_id` when the preset's is a stand-in: what init proposes instead, or the
/// stand-in, marked.
fn aggregate_id(t: &mut String, a: &Aggregate) {
    match a {
        Aggregate::Preset => {}
        Aggregate::Given(v) => {
            t.push_str(&format!(
                "# aggregate_id: as given (--aggregate-id).\naggregate_id = {}\n",
                toml_str(v)
            ));
        }
        Aggregate::Proposed(p) => {
            t.push_str(&format!(
                "# aggregate_id: the framework's rows carry no aggregate. PROPOSED by walfold init\n\
                 # from the payload key `{}` ({} of {} sampled payloads have it): check it.{}\n\
                 aggregate_id = {}\n",
                p.key,
                p.seen,
                p.sampled,
                if p.others.is_empty() {
                    String::new()
                } else {
                    format!("\n# Also like an identity: {}.", p.others.join(", "))
                },
                toml_str(&p.expression)
            ));
        }
        Aggregate::StandIn { value, why } => {
            t.push_str(&format!(
                "# STAND-IN: aggregate_id is {why}. No sampled payload had a key like an\n\
                 # aggregate's identity. A read model keyed on :aggregate_id gets one row per\n\
                 # message: set aggregate_id to your events' own field (an expression over the\n\
                 # payload) before folding per aggregate. `walfold doctor` warns while it is this.\n\
                 aggregate_id = {}\n",
                toml_str(value)
            ));
        }
    }
}

/// `where` for a table with one row per event and per value of a column: for each
/// event type, one value's rows.
fn one_row_per(t: &mut String, o: &OneRowPer) {
    let column = &o.column;
    match o.filter(column_in_expression) {
        Some(Filter::One(value, expr)) => {
            t.push_str(&format!(
                "# One row per event and per {column}: the rows of this {column}, which has rows\n\
                 # of every event type the table holds, are each event once:\n#   {value}\n"
            ));
            let others: Vec<&str> = o.values().into_iter().filter(|v| *v != value).collect();
            if !others.is_empty() {
                t.push_str(&format!("# The table also holds rows of {column}:\n"));
                for other in others {
                    t.push_str(&format!("#   {other}\n"));
                }
            }
            t.push_str(&format!("where = {}\n", toml_str(&expr)));
        }
        Some(Filter::PerType(per_type, expr)) => {
            t.push_str(&format!(
                "# One row per event and per {column}, and no {column} has rows of every event\n\
                 # type: for each type, one {column}'s rows. A type not listed here is no event:\n\
                 # add it when the application publishes one.\n"
            ));
            for (ty, value) in per_type {
                t.push_str(&format!("#   {ty}: {value}\n"));
            }
            t.push_str(&format!("where = {}\n", toml_str(&expr)));
        }
        // init stops before writing (it asks for --where).
        None => {}
    }
}

/// The message outboxes to write, and the grants they need.
pub(super) struct Messages<'a> {
    pub(super) prefixes: &'a [String],
    pub(super) grants: Option<&'a walfold_source::EmitGrants>,
}

/// The statements that leave `pg_logical_emit_message` to the producer and walfold.
pub(super) fn lock_down(g: &walfold_source::EmitGrants) -> [String; 2] {
    let list = g.functions.join(", ");
    let walfold = g
        .role
        .as_deref()
        .map(|r| format!(", {}", walfold_config::quote_ident(r)))
        .unwrap_or_default();
    [
        format!("revoke execute on function {list} from public;"),
        format!("grant execute on function {list} to <producing role>{walfold};"),
    ]
}

/// The whole file.
pub(super) fn render(
    url: &str,
    had_password: bool,
    outboxes: &[Mapped],
    messages: &Messages<'_>,
    publication: Option<&str>,
    read_model: Option<&ReadModel>,
    versioned: bool,
) -> String {
    let mut t = String::new();
    source_section(&mut t, url, had_password, publication);
    outbox_sections(&mut t, outboxes);
    message_sections(&mut t, messages);
    target_sections(&mut t);
    projection_section(&mut t, read_model, versioned);
    t
}

/// The header and `[source]`.
fn source_section(t: &mut String, url: &str, had_password: bool, publication: Option<&str>) {
    t.push_str(
        "# walfold configuration written by `walfold init`. Every value can be overridden from\n\
         # the environment as WALFOLD_<SECTION>__<KEY> (e.g. WALFOLD_SOURCE__URL); put passwords\n\
         # there, never in this file. Reference: docs/CONFIGURATION.md.\n\n",
    );
    t.push_str("[source]\n");
    if had_password {
        t.push_str("# The password was left out: set WALFOLD_SOURCE__URL with it.\n");
    }
    t.push_str(&format!("url = {}\n", toml_str(url)));
    t.push_str(
        "# The logical replication slot (pgoutput), created on first start. Only events\n\
         # committed after that are seen: `walfold backfill --outbox <table>` imports older rows.\n\
         slot = \"walfold\"\n",
    );
    match publication {
        Some(p) => t.push_str(&format!(
            "# An existing publication of exactly the outbox table(s).\npublication = {}\n",
            toml_str(p)
        )),
        None => t.push_str(
            "# Created on start if missing (needs ownership of the outbox tables), or create it\n\
             # yourself as their owner: see docs/CONFIGURATION.md, Publications.\n\
             publication = \"walfold_outbox\"\n",
        ),
    }
    t.push_str(
        "# Seconds between heartbeats, so the slot advances on an idle database (0: off).\n\
         heartbeat_interval_s = 10\n\
         # A lost slot: \"stop\" (exit with the fix) or \"recreate\" (record the gap, go on).\n\
         on_slot_lost = \"stop\"\n\
         # pgoutput protocol: 2 streams large transactions while they run (PostgreSQL 14+;\n\
         # the default there), 1 waits for each commit.\n\
         # protocol = 2\n",
    );
}

/// Each table outbox's `[[outbox]]`.
fn outbox_sections(t: &mut String, outboxes: &[Mapped]) {
    for m in outboxes {
        t.push_str("\n[[outbox]]\n");
        t.push_str(&format!("table = {}\n", toml_str(&m.table.to_string())));
        if let Some(r) = &m.preset {
            render_preset(t, &m.table, r);
            continue;
        }
        for (key, column) in &m.columns {
            t.push_str(&format!("{key} = {}\n", toml_str(column)));
        }
        for k in KEYS.iter().filter(|k| !k.required) {
            if m.columns.iter().any(|(key, _)| key == &k.key) {
                continue;
            }
            match m.unmapped.iter().find(|(key, _)| key == &k.key) {
                Some((key, ty)) => t.push_str(&format!(
                    "# `{key}` is {ty}, which walfold cannot read as {key}: not mapped.\n\
                     {key} = \"{key}_not_mapped\"\n"
                )),
                None => t.push_str(&format!(
                    "# {}: no column found (optional{}).\n",
                    k.key,
                    if k.key == "version" {
                        "; `table` projections and version guards need it"
                    } else {
                        ""
                    }
                )),
            }
        }
    }
}

/// The grants message outboxes need, and their `[[outbox]]`es.
fn message_sections(t: &mut String, messages: &Messages<'_>) {
    if let Some(g) = messages.grants {
        t.push_str(if g.public {
            "\n# Message outboxes. Only the producer may write their events, but PostgreSQL lets\n\
             # every role execute pg_logical_emit_message: walfold refuses to start until, as a\n\
             # superuser, you run:\n"
        } else {
            "\n# Message outboxes. Only roles granted pg_logical_emit_message write their events\n\
             # (PUBLIC may not here), as after:\n"
        });
        for line in lock_down(g) {
            t.push_str(&format!("#   {line}\n"));
        }
        if g.role.is_some() {
            t.push_str("# (walfold's own role is granted it for its heartbeats.)\n");
        }
        t.push_str(
            "# allow_public_emit = true on an [[outbox]] accepts events from any role instead.\n",
        );
    }
    for p in messages.prefixes {
        t.push_str(&format!(
            "\n[[outbox]]\n# pg_logical_emit_message(true, '{p}', json) calls are its events.\n\
             message_prefix = {}\n",
            toml_str(p)
        ));
    }
}

/// `[target]`, `[metrics]` and `[log]`.
fn target_sections(t: &mut String) {
    t.push_str(
        "\n[target]\n\
         # Where walfold keeps its schema (event log, claims, checkpoints, dead letters) and\n\
         # writes the read models; defaults to the source database.\n\
         # url = \"postgresql://walfold@target-host:5432/app\"\n\
         schema = \"walfold\"\n\n\
         [metrics]\n\
         # /metrics (Prometheus), /healthz and /readyz; bind to localhost or a private network.\n\
         # deploy/observability/ has a Grafana dashboard and alert rules for it.\n\
         listen = \"127.0.0.1:9187\"\n\n\
         [log]\n\
         format = \"text\"   # or \"json\"\n\
         level = \"info\"\n",
    );
}

/// A `table` projection for the read model, or a commented `sql` example.
fn projection_section(t: &mut String, read_model: Option<&ReadModel>, versioned: bool) {
    match read_model {
        Some(r) => {
            t.push_str(&format!(
                "\n# A table (state) projection: walfold generates the upsert with the version guard\n\
                 # (a row changes only for a higher version). Each column comes from the payload field\n\
                 # of the same name: edit the expressions to match your events.\n\
                 [[projection]]\n\
                 name = {name}\n\
                 subscriber = {sub}\n\
                 table = {table}\n",
                name = toml_str(&r.table.name),
                sub = toml_str(&format!("{}.v1", r.table.name)),
                table = toml_str(&r.table.to_string()),
            ));
            if !text_like(&r.key_type) {
                t.push_str(&format!(
                    "# NOTE: the key is {}, but it is filled from the aggregate ID (text): make it\n\
                     # text, or write a `sql` projection that casts :aggregate_id.\n",
                    r.key_type
                ));
            }
            t.push_str(&format!(
                "key = {}\nversion_column = {}\n",
                toml_str(&r.key),
                toml_str(&r.version)
            ));
            let cols: Vec<String> = r
                .columns
                .iter()
                .map(|(c, e)| format!("{c} = {}", toml_str(e)))
                .collect();
            t.push_str(&format!("columns = {{ {} }}\n", cols.join(", ")));
            t.push_str("# event_types = [\"OrderPlaced\", \"OrderPaid\"]   # only these (all when absent)\n");
        }
        None if versioned => t.push_str(
            "\n# A projection folds events into a read model. Uncomment and edit this `sql` one, or\n\
             # run `walfold init --read-model schema.table` for a generated `table` projection.\n\
             # Placeholders (:aggregate_id, :version, :payload.a.b, …) are bound as parameters,\n\
             # never spliced into SQL; the `where` clause is the version guard.\n\
             # [[projection]]\n\
             # name = \"order_status\"\n\
             # subscriber = \"orders.status.v1\"\n\
             # event_types = [\"OrderPlaced\", \"OrderPaid\"]\n\
             # sql = \"\"\"\n\
             # insert into order_status (order_id, status, version)\n\
             # values (:aggregate_id, :payload.status, :version)\n\
             # on conflict (order_id) do update set status = excluded.status, version = excluded.version\n\
             # where order_status.version < excluded.version\n\
             # \"\"\"\n",
        ),
        None => t.push_str(
            "\n# A projection folds events into a read model. Uncomment and edit this `sql` one.\n\
             # The outbox has no version, so there is no version guard: each aggregate's events\n\
             # apply in the order they were committed, once each (claims drop redeliveries).\n\
             # Placeholders (:aggregate_id, :payload.a.b, …) are bound as parameters, never\n\
             # spliced into SQL.\n\
             # [[projection]]\n\
             # name = \"order_status\"\n\
             # subscriber = \"orders.status.v1\"\n\
             # event_types = [\"OrderPlaced\", \"OrderPaid\"]\n\
             # sql = \"\"\"\n\
             # insert into order_status (order_id, status)\n\
             # values (:aggregate_id, :payload.status)\n\
             # on conflict (order_id) do update set status = excluded.status\n\
             # \"\"\"\n",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::mapping::OneRowPer;
    use crate::init::mapping::{map_table, Table, ONE_ROW_PER};
    use walfold_config::presets::{Preset, PRESETS};
    use walfold_config::Config;

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
    fn one_row_per_listener_keeps_each_event_once_per_type() {
        let pairs = |p: &[(&str, &str)]| OneRowPer {
            column: "listener_id".into(),
            type_column: "event_type".into(),
            pairs: p
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        };
        // The first listener (in order) has only one of the two types: the second, which
        // has both, is the one kept.
        let o = pairs(&[
            ("a", "Shipped"),
            ("b", "Completed"),
            ("b", "Shipped"),
            ("c", "Completed"),
        ]);
        match o.filter(column_in_expression) {
            Some(Filter::One(v, e)) => {
                assert_eq!(v, "b");
                assert_eq!(e, "listener_id = 'b'");
            }
            _ => panic!("one listener has both types"),
        }
        // None has both: per type, the first listener that has it.
        let o = pairs(&[("a", "Shipped"), ("c", "Completed")]);
        match o.filter(column_in_expression) {
            Some(Filter::PerType(per, e)) => {
                assert_eq!(per.len(), 2);
                assert_eq!(
                    e,
                    "(event_type = 'Completed' and listener_id = 'c') or \
                     (event_type = 'Shipped' and listener_id = 'a')"
                );
                let text = format!(
                    "[source]\nurl = \"postgresql://a@b/c\"\n[[outbox]]\ntable = \"t\"\nwhere = {}\n",
                    toml_str(&e)
                );
                Config::from_toml(&text, Vec::<(String, String)>::new()).unwrap();
            }
            _ => panic!("per type"),
        }
        assert!(pairs(&[]).filter(column_in_expression).is_none());
    }

    #[test]
    fn where_a_presets_ddl_comes_from_is_quoted_whole() {
        for p in PRESETS {
            let t = framework_table(p, |c| c.to_owned());
            let m = map_table(&t).unwrap();
            let mut text = String::new();
            render_preset(&mut text, &m.table, m.preset.as_ref().unwrap());
            let quoted: Vec<&str> = text
                .lines()
                .skip(1)
                .map_while(|l| l.strip_prefix("#   "))
                .collect();
            // Joined again, the lines are the source word for word: no break at a
            // comma inside a parenthesis, nothing lost.
            let words: Vec<&str> = p.ddl_source.split_whitespace().collect();
            assert_eq!(quoted.join(" "), words.join(" "), "{}", p.name);
            assert!(quoted.iter().all(|l| l.len() <= 84 || !l.contains(' ')));
        }
        assert_eq!(wrapped("a, b (c, d) e", 6), ["a, b", "(c, d)", "e"]);
    }

    #[test]
    fn a_preset_is_written_with_every_field() {
        for p in PRESETS {
            let t = framework_table(p, |c| c.to_owned());
            let mut m = map_table(&t).unwrap();
            if let Some(r) = m.preset.as_mut() {
                if ONE_ROW_PER.iter().any(|(name, _, _)| *name == p.name) {
                    r.one_row_per = Some(OneRowPer {
                        column: ONE_ROW_PER[0].1.to_owned(),
                        type_column: "event_type".to_owned(),
                        pairs: vec![
                            ("a.B.on(x)".to_owned(), "T".to_owned()),
                            ("o'c".to_owned(), "T".to_owned()),
                        ],
                    });
                }
            }
            let mut text = String::new();
            render_preset(&mut text, &m.table, m.preset.as_ref().unwrap());
            assert!(
                text.contains(&format!("preset = \"{}\"\n", p.name)),
                "{text}"
            );
            let id = match p.id {
                [one] => format!("id = {}\n", toml_str(one)),
                parts => format!(
                    "id = [{}]\n",
                    parts
                        .iter()
                        .map(|v| toml_str(v))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            assert!(text.contains(&id), "{}: {text}", p.name);
            for (key, value) in p.fields {
                let line = format!("{key} = {}\n", toml_str(value));
                assert!(
                    text.contains(&line),
                    "{}: `{line}` missing from\n{text}",
                    p.name
                );
            }
            // Every key of [[outbox]] is either written or explained.
            for key in KEYS.iter().map(|k| k.key) {
                assert!(
                    text.contains(&format!("{key} = ")) || text.contains(&format!("# {key}: ")),
                    "{}: {key} neither written nor explained\n{text}",
                    p.name
                );
            }
            // What init writes, `walfold run` loads.
            let mut whole = String::new();
            let m2 = map_table(&t).unwrap();
            let none: [String; 0] = [];
            whole.push_str(&render(
                "postgresql://walfold@127.0.0.1:5432/app",
                false,
                std::slice::from_ref(&m2),
                &Messages {
                    prefixes: &none,
                    grants: None,
                },
                None,
                None,
                m2.versioned(),
            ));
            if let Err(e) = Config::from_toml(&whole, Vec::<(String, String)>::new()) {
                panic!("{}: the written config does not load: {e}\n{whole}", p.name);
            }
            if ONE_ROW_PER.iter().any(|(name, _, _)| *name == p.name) {
                assert!(
                    text.contains("where = \"listener_id = 'a.B.on(x)'\"\n"),
                    "{text}"
                );
                assert!(text.contains("#   o'c\n"), "{text}");
            }
        }
    }
}

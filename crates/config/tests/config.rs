//! The config contract: the example parses, overrides apply, and every mistake names its key.

use walfold_config::{Config, ConfigError, ProjectionKind, Retention, Statement};

const MINIMAL: &str = r#"
[source]
url = "postgresql://walfold:hunter2@127.0.0.1:5432/app"

[[outbox]]
table = "public.outbox"

[[projection]]
name = "order_status"
subscriber = "orders.status.v1"
sql = "insert into order_status values (:aggregate_id, :payload.status, :version)"
"#;

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn problems(text: &str) -> Vec<String> {
    match Config::from_toml(text, vec![]) {
        Err(ConfigError::Invalid(p)) => p.iter().map(|p| p.to_string()).collect(),
        Err(e) => vec![e.to_string()],
        Ok(_) => vec![],
    }
}

#[test]
fn the_shipped_examples_parse() {
    for (file, projections) in [
        ("examples/walfold.toml", 3),
        ("examples/docker/walfold.toml", 3),
    ] {
        let path = format!("{}/../../{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        let config = Config::from_toml(&text, vec![]).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(config.projection.len(), projections, "{file}");
        for (i, p) in config.projection.iter().enumerate() {
            p.statement(i).unwrap();
        }
    }
}

#[test]
fn defaults_fill_the_outbox_mapping_and_target() {
    let c = Config::from_toml(MINIMAL, vec![]).unwrap();
    assert_eq!(c.sources()[0].slot, "walfold");
    assert_eq!(c.outbox[0].set("aggregate_id"), None);
    assert_eq!(
        c.outbox[0].fields()[2].value,
        "aggregate_id",
        "the default column"
    );
    assert_eq!(c.target.schema, "walfold");
    assert_eq!(c.target_url(), c.sources()[0].url);
    assert!(matches!(c.projection[0].kind, ProjectionKind::Sql { .. }));
    assert!(matches!(
        c.projection[0].statement(0),
        Ok(Statement::Sql(_))
    ));
}

#[test]
fn environment_overrides_any_value() {
    let c = Config::from_toml(
        MINIMAL,
        vars(&[
            ("WALFOLD_SOURCE__SLOT", "other_slot"),
            ("WALFOLD_TARGET__SCHEMA", "wf"),
            ("WALFOLD_PROJECTION__0__BATCH_SIZE", "42"),
            ("WALFOLD_PROJECTION__0__EVENT_TYPES", "A,B"),
            ("WALFOLD_PG_BINDIR", "/not/a/config/key"),
        ]),
    )
    .unwrap();
    assert_eq!(c.sources()[0].slot, "other_slot");
    assert_eq!(c.target.schema, "wf");
    assert_eq!(c.projection[0].batch_size, 42);
    assert_eq!(
        c.projection[0].event_types.as_deref(),
        Some(&["A".to_string(), "B".to_string()][..])
    );
}

#[test]
fn a_bad_override_names_the_variable() {
    let err = Config::from_toml(MINIMAL, vars(&[("WALFOLD_PROJECTION__3__NAME", "x")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("WALFOLD_PROJECTION__3__NAME"), "{err}");
    let err = Config::from_toml(
        MINIMAL,
        vars(&[("WALFOLD_PROJECTION__0__BATCH_SIZE", "many")]),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("batch_size"), "{err}");
}

#[test]
fn secrets_are_not_in_debug_output() {
    let c = Config::from_toml(MINIMAL, vec![]).unwrap();
    let debug = format!("{c:?}");
    assert!(!debug.contains("hunter2"), "{debug}");
    assert!(debug.contains("walfold:***@"), "{debug}");
    // A TOML error quotes the line it is on.
    let broken = MINIMAL.replace("5432/app\"", "5432/app?password=hunter2\" 1");
    let err = Config::from_toml(&broken, vec![]).unwrap_err().to_string();
    assert!(!err.contains("hunter2"), "{err}");
    assert!(err.contains("walfold:***@"), "{err}");
}

#[test]
fn unknown_keys_are_errors_that_name_the_key() {
    let text = MINIMAL.replace("[[outbox]]", "[[outbox]]\ncolour = \"red\"");
    let p = problems(&text).join("\n");
    assert!(p.contains("colour"), "{p}");
}

#[test]
fn every_problem_is_reported_at_once_with_its_key() {
    let text = r#"
[source]
url = "mysql://nope"
slot = "Bad-Slot"

[[projection]]
name = "a"
subscriber = "s"
sql = "select :bogus"

[[projection]]
name = "a"
subscriber = "s"
table = "x;drop"
parallelism = 0
"#;
    let p = problems(text);
    let joined = p.join("\n");
    for key in [
        "source.url",
        "source.slot",
        "outbox",
        "projection[0].sql",
        "projection[1].name",
        "projection[1].subscriber",
        "projection[1].table",
        "projection[1].key",
        "projection[1].version_column",
        "projection[1].parallelism",
    ] {
        assert!(
            p.iter().any(|line| line.starts_with(&format!("{key}:"))),
            "no problem for {key} in:\n{joined}"
        );
    }
}

/// `ingest` already names the rows rejected before any subscriber (`dead-letters list
/// --subscriber ingest`), so a subscriber of that name could not be told apart.
#[test]
fn a_subscriber_named_ingest_is_refused() {
    let text = MINIMAL.replace("orders.status.v1", "ingest");
    let p = problems(&text).join("\n");
    assert!(
        p.contains("projection[0].subscriber") && p.contains("`ingest`"),
        "{p}"
    );
}

#[test]
fn defaults_for_log_and_retention_are_usable() {
    let c = Config::from_toml(MINIMAL, vec![]).unwrap();
    assert_eq!(c.log.level, "info", "no [log] section still logs");
    assert_eq!(c.retention.event_log, Retention::Forever);
    assert_eq!(c.projection[0].dedup_retention, Retention::Forever);
    assert_eq!(c.projection[0].rebuild_batch_size, 5000);
    let c = Config::from_toml(
        &MINIMAL.replace(
            "[[projection]]",
            "[retention]\nevent_log = \"90d\"\n\n[[projection]]\ndedup_retention = \"12h\"",
        ),
        vec![],
    )
    .unwrap();
    assert_eq!(
        c.retention.event_log,
        Retention::After(std::time::Duration::from_secs(90 * 86_400))
    );
    assert_eq!(
        c.projection[0].dedup_retention,
        Retention::After(std::time::Duration::from_secs(12 * 3_600))
    );
}

#[test]
fn a_sql_projection_names_its_target_as_table() {
    let sql = "insert into {table} values (:aggregate_id)";
    let with = |extra: &str| {
        MINIMAL.replace(
            "sql = \"insert into order_status values (:aggregate_id, :payload.status, :version)\"",
            &format!("sql = \"{sql}\"\n{extra}"),
        )
    };
    let c = Config::from_toml(&with("target = \"app.status\""), vec![]).unwrap();
    let shadow = walfold_config::QualifiedName::parse("app.status__rebuild").unwrap();
    let sql_of = |k: Statement| match k {
        Statement::Sql(t) => t.sql,
        Statement::Table(t) => t.template.sql,
    };
    assert!(sql_of(c.projection[0].statement(0).unwrap())
        .contains("insert into \"app\".\"status\" values"));
    assert!(
        sql_of(c.projection[0].statement_for(0, Some(&shadow)).unwrap())
            .contains("insert into \"app\".\"status__rebuild\" values")
    );
    assert_eq!(
        c.projection[0].storage().map(|t| t.to_string()).as_deref(),
        Some("app.status")
    );
    let p = problems(&with("")).join("\n");
    assert!(p.contains("projection[0].target: missing"), "{p}");
    let p = problems(&with("target = \"x;y\"")).join("\n");
    assert!(p.contains("projection[0].target"), "{p}");
    let p = problems(&with("dedup_retention = \"soon\"")).join("\n");
    assert!(p.contains("projection[0].dedup_retention"), "{p}");
    let p = problems(&MINIMAL.replace(
        "[[projection]]",
        "[retention]\nevent_log = \"1w\"\n\n[[projection]]",
    ))
    .join("\n");
    assert!(p.contains("retention.event_log"), "{p}");
}

#[test]
fn names_are_used_as_written_and_names_outside_the_rule_are_refused_by_key() {
    let mixed = MINIMAL
        .replace(
            "table = \"public.outbox\"",
            "table = \"Sales.OutboxEvent\"\naggregate_id = \"aggregateId\"",
        )
        .replace(
            "[[projection]]",
            "[target]\nschema = \"Walfold\"\n\n[[projection]]",
        )
        .replace("[[outbox]]", "publication = \"PubQuoted\"\n\n[[outbox]]");
    let c = Config::from_toml(&mixed, vec![]).unwrap();
    assert_eq!(
        c.outbox[0].table_name().unwrap().quoted(),
        "\"Sales\".\"OutboxEvent\""
    );
    assert_eq!(c.outbox[0].set("aggregate_id"), Some("aggregateId"));
    assert_eq!(c.sources()[0].publication, "PubQuoted");
    assert_eq!(c.target.schema, "Walfold");

    let long = "a".repeat(64);
    let bad = MINIMAL
        .replace(
            "table = \"public.outbox\"",
            &format!("table = \"Sales.Out-box\"\naggregate_id = \"aggregate id\"\nid = \"{long}\""),
        )
        .replace(
            "[[projection]]",
            "[target]\nschema = \"my schema\"\n\n[[projection]]",
        )
        .replace(
            "[[outbox]]",
            "publication = \"pub,lish\"\nslot = \"Walfold\"\n\n[[outbox]]",
        );
    let found = problems(&bad);
    for key in [
        "outbox[0].table",
        "outbox[0].aggregate_id",
        "outbox[0].id",
        "target.schema",
        "source.publication",
        "source.slot",
    ] {
        assert!(
            found
                .iter()
                .any(|p| p.starts_with(key) && p.contains("valid")),
            "{key} not refused: {found:?}"
        );
    }
    assert!(
        found
            .iter()
            .any(|p| p.contains("1-63 ASCII letters, digits and _")),
        "{found:?}"
    );
}

#[test]
fn strict_projections_name_their_mode_and_a_valid_gap_timeout() {
    let strict =
        format!("{MINIMAL}version_mode = \"strict\"\nfirst_version = 0\ngap_timeout = \"90s\"\n");
    let c = Config::from_toml(&strict, vec![]).unwrap();
    let p = &c.projection[0];
    assert_eq!(p.version_mode, walfold_config::VersionMode::Strict);
    assert_eq!(p.first_version, 0);
    assert_eq!(
        p.gap_timeout,
        Retention::After(std::time::Duration::from_secs(90))
    );
    let defaults = Config::from_toml(MINIMAL, vec![]).unwrap();
    assert_eq!(
        defaults.projection[0].version_mode,
        walfold_config::VersionMode::Guard
    );
    assert_eq!(
        defaults.projection[0].gap_timeout,
        Retention::After(std::time::Duration::from_secs(600))
    );
    let bad = format!("{MINIMAL}version_mode = \"exact\"\n");
    assert!(
        problems(&bad).join(" ").contains("version_mode"),
        "{:?}",
        problems(&bad)
    );
    let bad = format!("{MINIMAL}gap_timeout = \"soon\"\n");
    assert!(
        problems(&bad)
            .iter()
            .any(|p| p.contains("projection[0].gap_timeout")),
        "{:?}",
        problems(&bad)
    );
}

#[test]
fn a_message_outbox_names_its_prefix_and_each_mistake_its_key() {
    let messages = MINIMAL.replace(
        "[[outbox]]\ntable = \"public.outbox\"\n",
        "[[outbox]]\ntable = \"public.outbox\"\n\n[[outbox]]\nmessage_prefix = \"walfold:orders\"\naggregate_id = \"aggregateId\"\n",
    );
    let c = Config::from_toml(&messages, vec![]).unwrap();
    assert_eq!(
        c.outbox[1].message_prefix.as_deref(),
        Some("walfold:orders")
    );
    assert_eq!(c.outbox[1].table_name(), None);
    assert_eq!(c.outbox[1].describe(), "messages 'walfold:orders'");
    assert_eq!(c.table_outboxes().count(), 1);
    assert!(!c.outbox[1].allow_public_emit);
    let opted_in = Config::from_toml(
        &messages,
        vars(&[("WALFOLD_OUTBOX__1__ALLOW_PUBLIC_EMIT", "true")]),
    )
    .unwrap();
    assert!(opted_in.outbox[1].allow_public_emit);
    for (outbox, key, says) in [
        (
            "table = \"t\"\nallow_public_emit = true",
            "outbox[1].allow_public_emit",
            "only a message outbox",
        ),
        ("aggregate_id = \"x\"", "outbox[1].table", "set table"),
        (
            "table = \"t\"\nmessage_prefix = \"p\"",
            "outbox[1].message_prefix",
            "not both",
        ),
        ("message_prefix = \"\"", "outbox[1].message_prefix", "1-255"),
        (
            "message_prefix = \"walfold.heartbeat\"",
            "outbox[1].message_prefix",
            "heartbeat",
        ),
        (
            "message_prefix = \"p\"\n\n[[outbox]]\nmessage_prefix = \"p\"",
            "outbox[2].message_prefix",
            "listed twice",
        ),
        (
            "message_prefix = \"p\"\nid = \"event id\"",
            "outbox[1].id",
            "not a valid JSON key",
        ),
    ] {
        let text = MINIMAL.replace(
            "[[outbox]]\ntable = \"public.outbox\"\n",
            &format!("[[outbox]]\ntable = \"public.outbox\"\n\n[[outbox]]\n{outbox}\n"),
        );
        let found = problems(&text);
        assert!(
            found.iter().any(|p| p.contains(key) && p.contains(says)),
            "{outbox}: {found:?}"
        );
    }
}

const TWO_SOURCES: &str = r#"
[[source]]
name = "orders"
url = "postgresql://walfold@orders-db/app"
slot = "walfold_orders"

[[source]]
name = "payments"
url = "postgresql://walfold@payments-db/app"
slot = "walfold_payments"
protocol = 1

[target]
url = "postgresql://walfold@reporting-db/app"

[[outbox]]
source = "orders"
table = "public.outbox"

[[outbox]]
source = "payments"
table = "billing.outbox_events"

[[projection]]
name = "order_view"
subscriber = "orders.view.v1"
sources = ["orders", "payments"]
sql = "insert into order_view values (:aggregate_id, :source)"
"#;

#[test]
fn several_sources_each_have_their_outboxes_and_a_view_of_their_own() {
    let c = Config::from_toml(TWO_SOURCES, vec![]).unwrap();
    let names: Vec<&str> = c.sources().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["orders", "payments"]);
    let payments = c.for_source("payments").unwrap();
    assert_eq!(payments.source().name, "payments");
    assert_eq!(payments.source().slot, "walfold_payments");
    assert_eq!(payments.outboxes().count(), 1);
    assert_eq!(
        payments.outboxes().next().unwrap().table.as_deref(),
        Some("billing.outbox_events")
    );
    assert_eq!(
        payments.target_url(),
        "postgresql://walfold@reporting-db/app"
    );
    assert_eq!(c.source_views().len(), 2);
    // A single [source] keeps working, named "default".
    let one = Config::from_toml(MINIMAL, vec![]).unwrap();
    assert_eq!(one.sources()[0].name, "default");
    assert_eq!(one.for_source("default").unwrap().outboxes().count(), 1);
    // Overrides select a source by index.
    let c = Config::from_toml(TWO_SOURCES, vars(&[("WALFOLD_SOURCE__1__SLOT", "pay2")])).unwrap();
    assert_eq!(c.sources()[1].slot, "pay2");
}

#[test]
fn several_sources_name_every_mistake_by_key() {
    let text = TWO_SOURCES
        .replace("slot = \"walfold_payments\"", "slot = \"walfold_orders\"")
        .replace("name = \"payments\"", "name = \"orders\"")
        .replace("source = \"payments\"", "source = \"billing\"")
        .replace(
            "[target]\nurl = \"postgresql://walfold@reporting-db/app\"",
            "",
        )
        .replace(
            "sources = [\"orders\", \"payments\"]",
            "sources = [\"shipping\"]",
        );
    let p = problems(&text);
    for expected in [
        "source[1].name: `orders` is used twice",
        "source[1].slot: `walfold_orders` is also the slot of source `orders`",
        "outbox[1].source: no [[source]] is named `billing`",
        "target.url: missing: with several sources",
        "projection[0].sources: no [[source]] is named `shipping`",
    ] {
        assert!(
            p.iter().any(|l| l.starts_with(expected)),
            "no `{expected}` in {p:#?}"
        );
    }
    let unnamed = TWO_SOURCES.replace("source = \"orders\"\n", "");
    let p = problems(&unnamed);
    assert!(
        p.iter()
            .any(|l| l.starts_with("outbox[0].source: missing: with several sources")),
        "{p:#?}"
    );
    // The first source of a deployment that grew a second may keep its name `default`;
    // two without a name are one name twice.
    let grown = TWO_SOURCES
        .replacen("name = \"orders\"\n", "", 1)
        .replace("source = \"orders\"", "source = \"default\"")
        .replace("\"orders\", \"payments\"", "\"default\", \"payments\"");
    assert_eq!(problems(&grown), Vec::<String>::new());
    let nameless = grown.replace("name = \"payments\"\n", "");
    let p = problems(&nameless);
    assert!(
        p.iter()
            .any(|l| l.starts_with("source[1].name: `default` is used twice")),
        "{p:#?}"
    );
    let p = problems(&TWO_SOURCES.replace("sources = [\"orders\", \"payments\"]", "sources = []"));
    assert!(
        p.iter()
            .any(|l| l.starts_with("projection[0].sources: is empty")),
        "{p:#?}"
    );
    let p = problems(&TWO_SOURCES.replace(
        "sources = [\"orders\", \"payments\"]",
        "sources = [\"orders\", \"orders\"]",
    ));
    assert!(
        p.iter()
            .any(|l| l.starts_with("projection[0].sources: `orders` is listed twice")),
        "{p:#?}"
    );
    let p = problems(&TWO_SOURCES.replace("payments-db/app", "orders-db/app"));
    assert!(
        p.iter()
            .any(|l| l.starts_with("source[1].url: is also the url of source `orders`")),
        "{p:#?}"
    );
    let bad_key = TWO_SOURCES.replace("protocol = 1", "protocol = 3");
    assert!(
        problems(&bad_key)
            .iter()
            .any(|l| l.starts_with("source[1].protocol: `3`")),
        "{:#?}",
        problems(&bad_key)
    );
}

const TWO_TARGETS: &str = r#"
[source]
url = "postgresql://walfold:hunter2@127.0.0.1:5432/app"

[[outbox]]
table = "public.outbox"

[targets.reporting]
url = "postgresql://writer:s3cret@reporting-host:5432/reports"

[[projection]]
name = "order_status"
subscriber = "orders.status.v1"
sql = "insert into order_status values (:aggregate_id, :payload.status, :version)"

[[projection]]
name = "revenue"
subscriber = "revenue.v1"
database = "reporting"
sql = "insert into revenue values (:payload.amount::numeric)"
"#;

#[test]
fn a_projection_names_an_extra_target_and_its_schema_defaults() {
    let c = Config::from_toml(TWO_TARGETS, vec![]).unwrap();
    assert_eq!(c.target_of(&c.projection[0]).map(|(n, _)| n), None);
    let (name, target) = c.target_of(&c.projection[1]).unwrap();
    assert_eq!(name, "reporting");
    assert_eq!(target.schema, "walfold");
    assert_eq!(
        target.url,
        "postgresql://writer:s3cret@reporting-host:5432/reports"
    );
    let debug = format!("{c:?}");
    assert!(!debug.contains("s3cret"), "{debug}");
    assert!(debug.contains("reporting-host"), "{debug}");
}

#[test]
fn an_extra_target_is_overridden_from_the_environment() {
    let c = Config::from_toml(
        TWO_TARGETS,
        vars(&[
            (
                "WALFOLD_TARGETS__REPORTING__URL",
                "postgresql://w:pw@other:5433/r",
            ),
            ("WALFOLD_TARGETS__REPORTING__SCHEMA", "walfold_reports"),
        ]),
    )
    .unwrap();
    let t = &c.targets["reporting"];
    assert_eq!(t.url, "postgresql://w:pw@other:5433/r");
    assert_eq!(t.schema, "walfold_reports");
}

#[test]
fn extra_target_mistakes_name_their_keys() {
    let text = TWO_TARGETS
        .replace("database = \"reporting\"", "database = \"reportng\"")
        .replace(
            "[targets.reporting]\nurl = \"postgresql://writer:s3cret@reporting-host:5432/reports\"",
            "[targets.reporting]\nurl = \"mysql://x\"\nschema = \"bad-name\"\n\n[targets.\"2nd\"]\nurl = \"postgresql://h/db?sslmode=sometimes\"",
        );
    let p = problems(&text);
    let has = |needle: &str| p.iter().any(|m| m.contains(needle));
    assert!(
        has("projection[1].database: unknown target `reportng`; the targets are: 2nd, reporting"),
        "{p:?}"
    );
    assert!(has("targets.reporting.url: must be a URL"), "{p:?}");
    assert!(
        has("targets.reporting.schema: `bad-name` is not a valid name"),
        "{p:?}"
    );
    assert!(
        has("targets.2nd: `2nd` is not a valid target name"),
        "{p:?}"
    );
    assert!(has("targets.2nd.url: sslmode `sometimes`"), "{p:?}");
    let p = problems(&TWO_TARGETS.replace(
        "[targets.reporting]\nurl = \"postgresql://writer:s3cret@reporting-host:5432/reports\"",
        "",
    ));
    assert!(
        p.iter().any(|m| m.contains(
            "projection[1].database: unknown target `reporting`: add [targets.reporting]"
        )),
        "{p:?}"
    );
    let p = problems(&TWO_TARGETS.replace("[targets.reporting]", "[targets.reporting]\nport = 1"));
    assert!(p.iter().any(|m| m.contains("port")), "{p:?}");
    let p = problems(&TWO_TARGETS.replace(
        "url = \"postgresql://writer:s3cret@reporting-host:5432/reports\"",
        "url = \"postgresql://walfold:hunter2@127.0.0.1:5432/app\"",
    ));
    assert!(
        p.iter()
            .any(|m| m.contains("targets.reporting.url: names the main target's database")),
        "{p:?}"
    );
    let other_schema = TWO_TARGETS.replace(
        "url = \"postgresql://writer:s3cret@reporting-host:5432/reports\"",
        "url = \"postgresql://walfold:hunter2@127.0.0.1:5432/app\"\nschema = \"walfold_reporting\"",
    );
    // Another schema on the main database is refused too: a projection moved between
    // the two would apply every event again to the same table.
    assert!(
        problems(&other_schema)
            .iter()
            .any(|m| m.contains("targets.reporting.url: names the main target's database")),
        "{:?}",
        problems(&other_schema)
    );
}

#[test]
fn outbox_fields_are_columns_or_expressions_and_what_cannot_be_is_refused_by_key() {
    let with = |fields: &str| {
        MINIMAL.replace(
            "table = \"public.outbox\"",
            &format!("table = \"public.outbox\"\n{fields}"),
        )
    };
    let c = Config::from_toml(
        &with(
            "id = [\"stream_name\", \"position\"]\naggregate_type = \"'order'\"\n\
             aggregate_id = \"split_part(stream_name, '-', 2)\"\nwhere = \"type <> 'x'\"",
        ),
        vec![],
    )
    .unwrap();
    let o = &c.outbox[0];
    let names: Vec<String> = o.fields().iter().map(|f| f.name()).collect();
    assert_eq!(&names[..3], ["id[0]", "id[1]", "aggregate_type"]);
    assert!(names.contains(&"where".to_owned()));
    assert!(o.fields()[0].is_column());
    assert!(!o.fields()[2].is_column(), "a constant is an expression");
    for (fields, key, says) in [
        (
            "aggregate_id = \"nosuch(stream)\"",
            "outbox[0].aggregate_id",
            "nosuch",
        ),
        (
            "id = [\"a\", \"b::nosuchtype\"]",
            "outbox[0].id[1]",
            "nosuchtype",
        ),
        ("id = []", "outbox[0].id", "empty array"),
        (
            "preset = \"nosuch\"",
            "outbox[0].preset",
            "no preset is named `nosuch`",
        ),
    ] {
        let found = problems(&with(fields));
        assert!(
            found.iter().any(|p| p.starts_with(key) && p.contains(says)),
            "{fields}: {found:?}"
        );
    }
    // A message outbox's fields are JSON keys: what is for table rows is refused.
    let message = |fields: &str| {
        MINIMAL.replace(
            "table = \"public.outbox\"",
            &format!("message_prefix = \"m\"\n{fields}"),
        )
    };
    for (fields, key) in [
        ("where = \"true\"", "outbox[0].where"),
        ("expand = \"items\"", "outbox[0].expand"),
        ("id = [\"a\", \"b\"]", "outbox[0].id"),
        ("aggregate_id = \"payload->>'a'\"", "outbox[0].aggregate_id"),
    ] {
        let found = problems(&message(fields));
        assert!(
            found
                .iter()
                .any(|p| p.starts_with(key) && p.contains("table outboxes")),
            "{fields}: {found:?}"
        );
    }
    assert!(problems(&message("aggregate_id = \"aggregateId\"")).is_empty());
}

#[test]
fn key_value_connection_strings_are_accepted_and_their_mistakes_name_the_key() {
    let kv = MINIMAL.replace(
        "url = \"postgresql://walfold:hunter2@127.0.0.1:5432/app\"",
        "url = \"host=standby,primary port=5433,5432 dbname=app user=walfold password='hunter 2' target_session_attrs=read-write\"\n\
         [target]\nurl = \"host=/var/run/postgresql dbname=reads sslmode=disable\"",
    );
    let c = Config::from_toml(&kv, vec![]).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.sources()[0].url.starts_with("host=standby,primary"));
    assert!(!format!("{c:?}").contains("hunter 2"), "{c:?}");
    let bad = MINIMAL.replace(
        "url = \"postgresql://walfold:hunter2@127.0.0.1:5432/app\"",
        "url = \"host=a,b port=1,2,3 dbname=app sslmode=sometimes servce=x password=hunter2\"\n\
         [target]\nurl = \"dbname=reads target_session_attrs=read-only\"",
    );
    let p = problems(&bad);
    let has = |needle: &str| p.iter().any(|m| m.contains(needle));
    assert!(has("source.url: `port` gives 3 ports for 2 hosts"), "{p:?}");
    assert!(has("source.url: sslmode `sometimes`"), "{p:?}");
    assert!(has("source.url: `servce` is not a connection key"), "{p:?}");
    assert!(has("target.url: `host` is missing"), "{p:?}");
    assert!(has("target.url: target_session_attrs `read-only`"), "{p:?}");
    assert!(!p.iter().any(|m| m.contains("hunter2")), "{p:?}");
}

#[test]
fn an_id_scope_reads_as_a_table_or_a_prefix_and_is_no_other_outboxs() {
    let base = "[source]\nurl = \"postgresql://h/db\"\n";
    let config = Config::from_toml(
        &format!(
            "{base}[[outbox]]\ntable = \"tickets_v2\"\nid_scope = \"tickets\"\n\
             [[outbox]]\ntable = \"parcels\"\n\
             [[outbox]]\nmessage_prefix = \"orders.v2\"\nid_scope = \"message_prefix:orders\"\n"
        ),
        vec![],
    )
    .unwrap();
    let scopes: Vec<String> = config.outbox.iter().map(|o| o.id_scope()).collect();
    assert_eq!(
        scopes,
        ["public.tickets", "public.parcels", "message_prefix:orders"]
    );
    let p = problems(&format!(
        "{base}[[outbox]]\ntable = \"tickets\"\n[[outbox]]\ntable = \"tickets_v2\"\nid_scope = \"public.tickets\"\n\
         [[outbox]]\ntable = \"t3\"\nid_scope = \"message_prefix:\"\n"
    ));
    assert!(
        p.iter()
            .any(|l| l.starts_with("outbox[1].id_scope: the same as outbox[0]'s (public.tickets)")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|l| l.starts_with("outbox[2].id_scope: must be 1-255 characters")),
        "{p:?}"
    );
}

#[test]
fn a_where_set_beside_a_presets_is_added_to_it() {
    let c = Config::from_toml(
        "[source]\nurl = \"postgresql://u@h/d\"\n[[outbox]]\ntable = \"eventuate.message\"\n\
         preset = \"eventuate_tram\"\nwhere = \"destination = 'orders'\"\n",
        Vec::<(String, String)>::new(),
    )
    .unwrap();
    let wheres: Vec<&str> = c.outbox[0]
        .fields()
        .into_iter()
        .filter(|f| f.key == "where")
        .map(|f| f.value)
        .collect();
    assert_eq!(
        wheres,
        [
            "headers::jsonb->>'event-type' is not null",
            "destination = 'orders'"
        ]
    );
}

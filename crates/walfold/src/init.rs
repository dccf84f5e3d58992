//! `walfold init`: the first ten minutes. Connects to an existing database, finds the
//! tables that look like outboxes (an ID, a JSON payload and the aggregate and type
//! columns under the spellings ORMs and frameworks use), picks the mapping, and writes
//! a complete commented config with one example projection; message outboxes named
//! with `--message-prefix` come with the grants that leave them to their producer.
//! Then it runs `doctor`'s checks on that config, so what to fix (wal_level, rights,
//! the publication) is said before the first `walfold run`. It never overwrites a file.

use std::io::Write;
use std::path::Path;

use tokio_postgres::Client;
use walfold_config::{Config, QualifiedName};
use walfold_store::RowExt;

use crate::Failure;

/// One mapped key of `[[outbox]]`: the spellings looked for (compared without case and
/// underscores) and the column types accepted.
struct Key {
    key: &'static str,
    spellings: &'static [&'static str],
    types: fn(&str) -> bool,
    required: bool,
}

fn text_like(t: &str) -> bool {
    matches!(t, "text" | "character varying" | "character")
}
fn id_type(t: &str) -> bool {
    t == "uuid" || text_like(t)
}
fn any_type(_: &str) -> bool {
    true
}
fn integer(t: &str) -> bool {
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
const KEYS: &[Key] = &[
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

fn normalized(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

/// The config's rule for names: 1-63 ASCII letters, digits and `_`, not starting with
/// a digit (anything else is refused at load).
fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit()
}

/// A table of the database with its columns (name, type).
struct Table {
    name: QualifiedName,
    columns: Vec<(String, String)>,
}

/// A table's mapping: (key, column) for each mapped key, or what is missing.
struct Mapped {
    table: QualifiedName,
    columns: Vec<(&'static str, String)>,
    /// Optional keys whose default column name exists with a type walfold cannot read:
    /// mapped away from it, with the reason.
    unmapped: Vec<(&'static str, String)>,
}

fn map_table(t: &Table) -> Result<Mapped, Vec<String>> {
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
        })
    } else {
        Err(missing)
    }
}

async fn tables(client: &Client) -> Result<Vec<Table>, Failure> {
    // Tables and partitioned tables (not partitions), outside the system schemas and
    // outside walfold's own schemas (its event log looks like an outbox).
    let rows = client
        .query(
            "select n.nspname::text, c.relname::text, \
             array(select a.attname::text from pg_attribute a where a.attrelid = c.oid \
                   and a.attnum > 0 and not a.attisdropped order by a.attnum), \
             array(select format_type(a.atttypid, null) from pg_attribute a where a.attrelid = c.oid \
                   and a.attnum > 0 and not a.attisdropped order by a.attnum) \
             from pg_class c join pg_namespace n on n.oid = c.relnamespace \
             where c.relkind in ('r', 'p') and not c.relispartition \
             and n.nspname not in ('pg_catalog', 'information_schema') \
             and n.nspname not like 'pg\\_%' \
             and not exists (select 1 from pg_class m where m.relnamespace = n.oid \
                             and m.relname = 'processed_message') \
             order by 1, 2",
            &[],
        )
        .await
        .map_err(|e| Failure::runtime(format!("reading the catalog: {e}")))?;
    let mut tables = Vec::with_capacity(rows.len());
    for r in &rows {
        let r = r.of("pg_class");
        let (schema, table): (String, String) = (r.col(0)?, r.col(1)?);
        if !valid_name(&schema) || !valid_name(&table) {
            continue;
        }
        let names: Vec<String> = r.col(2)?;
        let types: Vec<String> = r.col(3)?;
        let Ok(name) = QualifiedName::parse(&format!("{schema}.{table}")) else {
            continue;
        };
        tables.push(Table {
            name,
            columns: names.into_iter().zip(types).collect(),
        });
    }
    Ok(tables)
}

fn parse_table(text: &str, flag: &str) -> Result<QualifiedName, Failure> {
    QualifiedName::parse(text).map_err(|m| Failure::config(format!("{flag} {text}: {m}")))
}

/// A `table` projection for a read-model table: its key (a one-column primary key or
/// unique index), its version column, and the other columns from the payload field of
/// the same name (cast to the column's type).
struct ReadModel {
    table: QualifiedName,
    key: String,
    key_type: String,
    version: String,
    columns: Vec<(String, String)>,
}

async fn read_model(client: &Client, name: &QualifiedName) -> Result<ReadModel, Failure> {
    let exists: bool = client
        .query_one("select to_regclass($1) is not null", &[&name.quoted()])
        .await
        .map_err(Failure::runtime)?
        .of("pg_class")
        .col(0)?;
    if !exists {
        return Err(Failure::config(format!(
            "--read-model {name}: no such table (names are case-sensitive)"
        )));
    }
    let columns: Vec<(String, String, bool)> = client
        .query(
            "select a.attname::text, format_type(a.atttypid, null), \
             a.attgenerated <> '' or a.attidentity <> '' \
             from pg_attribute a where a.attrelid = $1::text::regclass \
             and a.attnum > 0 and not a.attisdropped order by a.attnum",
            &[&name.quoted()],
        )
        .await
        .map_err(Failure::runtime)?
        .iter()
        .map(|r| {
            let r = r.of("pg_attribute");
            Ok((r.col(0)?, r.col(1)?, r.col(2)?))
        })
        .collect::<Result<_, walfold_store::StoreError>>()?;
    let keys: Vec<Vec<String>> = client
        .query(
            "select array(select a.attname::text from unnest(i.indkey) k \
                          join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k) \
             from pg_index i where i.indrelid = $1::text::regclass and i.indisunique \
             and i.indpred is null and i.indexprs is null \
             order by i.indisprimary desc, i.indexrelid",
            &[&name.quoted()],
        )
        .await
        .map_err(Failure::runtime)?
        .iter()
        .map(|r| r.of("pg_index").col(0))
        .collect::<Result<_, _>>()?;
    let key = keys.iter().find(|k| k.len() == 1).map(|k| k[0].clone());
    let Some(key) = key else {
        return Err(Failure::config(format!(
            "--read-model {name}: a `table` projection needs a one-column primary key or unique \
             index (its key, filled from the aggregate ID); this table has none"
        )));
    };
    let version_names = [
        "version",
        "lastversion",
        "aggregateversion",
        "sequence",
        "seq",
    ];
    let version = columns
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
        .map(|(n, _, _)| n.clone());
    let Some(version) = version else {
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

/// A TOML basic string (JSON's escapes are TOML's).
fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The publication to use: an existing one that publishes exactly these tables (and
/// is not FOR ALL TABLES), else walfold's default, which it creates on start.
async fn publication(
    client: &Client,
    outboxes: &[QualifiedName],
) -> Result<Option<String>, Failure> {
    let mut wanted: Vec<String> = outboxes.iter().map(ToString::to_string).collect();
    wanted.sort();
    let rows = client
        .query(
            "select p.pubname::text, array(select n.nspname || '.' || c.relname \
               from pg_publication_rel r join pg_class c on c.oid = r.prrelid \
               join pg_namespace n on n.oid = c.relnamespace where r.prpubid = p.oid order by 1) \
             from pg_publication p where not p.puballtables order by 1",
            &[],
        )
        .await
        .map_err(Failure::runtime)?;
    for r in &rows {
        let r = r.of("pg_publication");
        if r.col::<Vec<String>>(1)? == wanted {
            let name: String = r.col(0)?;
            return Ok(Some(name).filter(|name| valid_name(name)));
        }
    }
    Ok(None)
}

/// The outboxes named on the command line.
pub struct Wanted {
    /// `--table`: without any (and without message outboxes), init looks for one.
    pub tables: Vec<String>,
    /// `--message-prefix`.
    pub message_prefixes: Vec<String>,
}

pub async fn init(
    url: &str,
    outboxes: &Wanted,
    read_model_table: Option<&str>,
    output: &Path,
) -> Result<(), Failure> {
    let wanted = &outboxes.tables;
    let prefixes = &outboxes.message_prefixes;
    let to_stdout = output == Path::new("-");
    if !to_stdout && output.exists() {
        return Err(Failure::config(format!(
            "{} exists: walfold init never overwrites a file (remove it or pass -o another path)",
            output.display()
        )));
    }
    // A URL or libpq's key=value form, as walfold.toml takes them: refused before the
    // connection, not after, naming what is wrong.
    let problems = walfold_config::conninfo::problems(url);
    if !problems.is_empty() {
        return Err(Failure::config(format!("--url: {}", problems.join("; "))));
    }
    let client = walfold_store::connect_for_command(url, "the database")
        .await
        .map_err(Failure::runtime)?;
    let all = tables(&client).await?;
    let mut chosen: Vec<Mapped> = Vec::new();
    if wanted.is_empty() && prefixes.is_empty() {
        let found: Vec<Mapped> = all.iter().filter_map(|t| map_table(t).ok()).collect();
        match found.len() {
            0 => {
                let required: Vec<String> = KEYS
                    .iter()
                    .filter(|k| k.required)
                    .map(|k| format!("{} ({})", k.key, k.spellings.join("/")))
                    .collect();
                return Err(Failure::config(format!(
                    "no table looks like an outbox: walfold needs {} (compared without case and \
                     underscores; the ID a uuid or text, the payload JSON). Name it with --table \
                     schema.table to see what is missing",
                    required.join(", ")
                )));
            }
            1 => chosen = found,
            _ => {
                let names: Vec<String> = found.iter().map(|m| m.table.to_string()).collect();
                return Err(Failure::config(format!(
                    "several tables look like outboxes: {}; pick with --table (repeat it to follow several)",
                    names.join(", ")
                )));
            }
        }
    } else {
        for w in wanted {
            let name = parse_table(w, "--table")?;
            let Some(t) = all.iter().find(|t| t.name == name) else {
                return Err(Failure::config(format!(
                    "--table {w}: no such table in the database (names are case-sensitive; a \
                     partition is followed through its partitioned table)"
                )));
            };
            match map_table(t) {
                Ok(m) => chosen.push(m),
                Err(missing) => {
                    return Err(Failure::config(format!(
                        "--table {w} does not look like an outbox: no column for {}",
                        missing.join(", ")
                    )))
                }
            }
        }
    }
    let read_model = match read_model_table {
        Some(t) => Some(read_model(&client, &parse_table(t, "--read-model")?).await?),
        None => None,
    };
    let names: Vec<QualifiedName> = chosen.iter().map(|m| m.table.clone()).collect();
    let existing_publication = publication(&client, &names).await?;
    let grants = if prefixes.is_empty() {
        None
    } else {
        Some(walfold_source::emit_grants(&client).await?)
    };
    let (file_url, had_password) = walfold_config::without_password(url);
    let text = render(
        &file_url,
        had_password,
        &chosen,
        &Messages {
            prefixes,
            grants: grants.as_ref(),
        },
        existing_publication.as_deref(),
        read_model.as_ref(),
    );
    // What init writes, `walfold run` loads: checked before anything is written.
    let config = Config::from_toml(&text, [("WALFOLD_SOURCE__URL".to_owned(), url.to_owned())])
        .map_err(|e| {
            if prefixes.is_empty() {
                Failure::runtime(format!("the generated config does not load (a bug): {e}"))
            } else {
                Failure::config(format!("--message-prefix: {e}"))
            }
        })?;
    if to_stdout {
        print!("{text}");
    } else {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(output)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    Failure::config(format!(
                        "{} exists: walfold init never overwrites a file",
                        output.display()
                    ))
                } else {
                    Failure::runtime(format!("cannot write {}: {e}", output.display()))
                }
            })?;
        file.write_all(text.as_bytes())
            .map_err(|e| Failure::runtime(format!("cannot write {}: {e}", output.display())))?;
    }
    let say = |line: String| {
        if to_stdout {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    for m in &chosen {
        let cols: Vec<String> = m.columns.iter().map(|(k, c)| format!("{k}={c}")).collect();
        say(format!("outbox {}: {}", m.table, cols.join(", ")));
    }
    for p in prefixes {
        say(format!(
            "message outbox '{p}': pg_logical_emit_message(true, '{p}', json) calls"
        ));
    }
    if let Some(g) = grants.as_ref().filter(|g| g.public) {
        say(format!(
            "only the producer may write events: as a superuser, run\n{}\n(they are in the file too)",
            lock_down(g)
                .iter()
                .map(|l| format!("  {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        ));
    }
    match &read_model {
        Some(r) => say(format!(
            "projection {}: table projection, key {} (from the aggregate ID), version guard on {}",
            r.table.name, r.key, r.version
        )),
        None => say("projection: none yet (a commented `sql` example is in the file)".into()),
    }
    if !to_stdout {
        say(format!("wrote {}", output.display()));
    }
    say("\nchecks (as `walfold doctor` runs them):".to_owned());
    let failed = crate::doctor::check(&config, 1024, to_stdout).await?;
    let path = if to_stdout {
        "walfold.toml".to_owned()
    } else {
        output.display().to_string()
    };
    if had_password {
        say(format!(
            "\nthe password is not in the file: pass it in the environment, e.g.\n  export WALFOLD_SOURCE__URL={}",
            toml_str(&walfold_config::redact_url(url)).replace("***", "<password>")
        ));
    }
    if failed > 0 {
        say(format!(
            "\n{failed} check(s) failed: fix them (each says how), then `walfold doctor -c {path}` and `walfold run -c {path}`"
        ));
    } else {
        say(format!(
            "\nnext: `walfold doctor -c {path}`, then `walfold run -c {path}`"
        ));
    }
    Ok(())
}

/// The message outboxes to write, and the grants they need.
struct Messages<'a> {
    prefixes: &'a [String],
    grants: Option<&'a walfold_source::EmitGrants>,
}

/// The statements that leave `pg_logical_emit_message` to the producer and walfold.
fn lock_down(g: &walfold_source::EmitGrants) -> [String; 2] {
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

fn render(
    url: &str,
    had_password: bool,
    outboxes: &[Mapped],
    messages: &Messages<'_>,
    publication: Option<&str>,
    read_model: Option<&ReadModel>,
) -> String {
    let mut t = String::new();
    t.push_str(
        "# walfold configuration written by `walfold init`. Every value can be overridden from\n\
         # the environment as WALFOLD_<SECTION>__<KEY> (e.g. WALFOLD_SOURCE__URL); put passwords\n\
         # there, never in this file. Reference: README.md, Configuration reference.\n\n",
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
             # yourself as their owner: see README.md, Publications.\n\
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
    for m in outboxes {
        t.push_str("\n[[outbox]]\n");
        t.push_str(&format!("table = {}\n", toml_str(&m.table.to_string())));
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
        None => t.push_str(
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
    }
    t
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
}

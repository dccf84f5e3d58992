//! `walfold init`: the first ten minutes. Connects to an existing database, finds the
//! tables that look like outboxes (a framework's table, recognised by the columns of its
//! preset; else an ID, a JSON payload and the aggregate and type columns under the
//! spellings ORMs use), picks the mapping, and writes
//! a complete commented config with one example projection; message outboxes named
//! with `--message-prefix` come with the grants that leave them to their producer.
//! Then it runs `doctor`'s checks on that config, so what to fix (wal_level, rights,
//! the publication) is said before the first `walfold run`. It never overwrites a file.

use std::io::Write;
use std::path::Path;

use tokio_postgres::Client;
use walfold_config::presets::{Preset, PRESETS};
use walfold_config::{Config, QualifiedName};
use walfold_pg::RowExt;

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
    /// A framework's table: its preset (then `columns` and `unmapped` are empty).
    preset: Option<Recognised>,
}

impl Mapped {
    /// Whether its events carry a version (a column or the preset's expression).
    fn versioned(&self) -> bool {
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
struct Recognised {
    preset: &'static Preset,
    /// The table's columns (as the database spells them).
    columns: Vec<String>,
    /// For a table with one row per event and per value of a column: that column and
    /// the values the table holds (see [`ONE_ROW_PER`]).
    one_row_per: Option<(String, Vec<String>)>,
}

/// Presets whose table holds one row per event *and* per value of a column (Spring
/// Modulith: one per listener): each value's rows are every event once, so init keeps
/// one value's rows (`where`), the first it finds, and lists the others.
const ONE_ROW_PER: &[(&str, &str)] = &[
    ("spring_modulith", "listener_id"),
    ("wolverine", "destination"),
];

/// The presets whose columns the table has (compared without case), in `PRESETS`
/// order: a framework's table is its first.
fn presets_of<'a>(columns: impl Iterator<Item = &'a str> + Clone) -> Vec<&'static Preset> {
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

fn map_table(t: &Table) -> Result<Mapped, Vec<String>> {
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
    // init reads the read model through --url: often the source role, which the least
    // privilege layout does not let see the target's schemas.
    let unreadable = |e: tokio_postgres::Error| {
        Failure::config(format!(
            "--read-model {name}: cannot read it through --url: {}. Run init with a URL \
             whose role may read that table (the target's), or leave --read-model out and \
             write the projection by hand",
            walfold_pg::describe(&e)
        ))
    };
    let exists: bool = client
        .query_one("select to_regclass($1) is not null", &[&name.quoted()])
        .await
        .map_err(unreadable)?
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
        .map_err(unreadable)?
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
        .map_err(unreadable)?
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
    let client = walfold_pg::connect_for_command(url, "the database")
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
                let presets: Vec<&str> = PRESETS.iter().map(|p| p.framework).collect();
                return Err(Failure::config(format!(
                    "no table looks like an outbox: walfold needs {} (compared without case and \
                     underscores; the ID a uuid or text, the payload JSON), or a framework's table \
                     as it creates it ({}). Name it with --table schema.table to see what is \
                     missing",
                    required.join(", "),
                    presets.join(", ")
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
    // Message outboxes' events may carry a version of their own.
    let versioned = !prefixes.is_empty() || chosen.iter().any(Mapped::versioned);
    if let (Some(t), false) = (read_model_table, versioned) {
        let names: Vec<String> = chosen.iter().map(|m| m.table.to_string()).collect();
        return Err(Failure::config(format!(
            "--read-model {t}: a `table` projection changes a row only for a higher event \
             version, and {} has no version column (none named version, sequence, \
             aggregate_version or seq): every event would be dead-lettered. Add a version to \
             the outbox, or run init without --read-model and write a `sql` projection (the \
             file has an example that needs no version)",
            names.join(", ")
        )));
    }
    for m in &mut chosen {
        if let Some(r) = &mut m.preset {
            r.one_row_per = one_row_per(&client, &m.table, r).await?;
        }
    }
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
        versioned,
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
        match &m.preset {
            Some(r) => {
                say(format!(
                    "outbox {}: {}, preset {} (every field written out in the file)",
                    m.table, r.preset.framework, r.preset.name
                ));
                if let Some((column, values)) = &r.one_row_per {
                    say(match values.first() {
                        Some(first) => format!(
                            "  one row per event and {column}: keeping {column} = '{first}' \
                             ({} value(s) found; change `where` to another)",
                            values.len()
                        ),
                        None => format!(
                            "  one row per event and {column}, and no rows yet: set `where` to one \
                             {column}'s rows (the file says how), or each event counts once per {column}"
                        ),
                    });
                }
            }
            None => {
                let cols: Vec<String> = m.columns.iter().map(|(k, c)| format!("{k}={c}")).collect();
                say(format!("outbox {}: {}", m.table, cols.join(", ")));
            }
        }
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

/// For a preset with [`ONE_ROW_PER`]: its column and the values the table holds (at
/// most 50, in order).
async fn one_row_per(
    client: &Client,
    table: &QualifiedName,
    r: &Recognised,
) -> Result<Option<(String, Vec<String>)>, Failure> {
    let Some((_, wanted)) = ONE_ROW_PER.iter().find(|(p, _)| *p == r.preset.name) else {
        return Ok(None);
    };
    let Some(column) = r.columns.iter().find(|c| c.eq_ignore_ascii_case(wanted)) else {
        return Ok(None);
    };
    let quoted = walfold_config::quote_ident(column);
    let values = client
        .query(
            &format!(
                "select distinct {quoted}::text from {} where {quoted} is not null order by 1 limit 50",
                table.quoted()
            ),
            &[],
        )
        .await
        .map_err(|e| Failure::runtime(format!("reading {table}'s {column} values: {e}")))?
        .iter()
        .map(|row| row.of("the table").col(0))
        .collect::<Result<Vec<String>, _>>()?;
    Ok(Some((column.clone(), values)))
}

/// A column in an expression: bare when PostgreSQL would fold it to itself, else quoted.
fn column_in_expression(column: &str) -> String {
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

/// The `[[outbox]]` keys of a framework's table: the preset and each of its fields,
/// written out so the user sees and can change every one.
fn render_preset(t: &mut String, table: &QualifiedName, r: &Recognised) {
    let p = r.preset;
    t.push_str(&format!(
        "# {}: recognised by its columns. Its table as the framework creates it:\n",
        p.framework
    ));
    for source in p.ddl_source.split(", ") {
        t.push_str(&format!("#   {source}\n"));
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
        if let Some(v) = field(key) {
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
    } else if let Some((column, values)) = &r.one_row_per {
        let expr = |value: &str| {
            format!(
                "{} = '{}'",
                column_in_expression(column),
                value.replace('\'', "''")
            )
        };
        match values.split_first() {
            Some((first, others)) => {
                t.push_str(&format!(
                    "# One row per event and per {column}: one {column}'s rows are each event once.\n"
                ));
                if !others.is_empty() {
                    t.push_str(&format!("# The table also holds rows of {column}:\n"));
                    for o in others {
                        t.push_str(&format!("#   {}\n", o));
                    }
                }
                t.push_str(&format!("where = {}\n", toml_str(&expr(first))));
            }
            None => t.push_str(&format!(
                "# One row per event and per {column}: keep one {column}'s rows, or each event\n\
                 # counts once per {column} (the table holds no rows yet to pick one from):\n\
                 # where = {}\n",
                toml_str(&expr("…"))
            )),
        }
    }
    if let Some(v) = field("expand") {
        t.push_str(&format!(
            "# One event per element of this JSON array; the fields read it as `element`.\n\
             expand = {}\n",
            toml_str(v)
        ));
    }
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
    versioned: bool,
) -> String {
    let mut t = String::new();
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
    for m in outboxes {
        t.push_str("\n[[outbox]]\n");
        t.push_str(&format!("table = {}\n", toml_str(&m.table.to_string())));
        if let Some(r) = &m.preset {
            render_preset(&mut t, &m.table, r);
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

    #[test]
    fn a_preset_is_written_with_every_field() {
        for p in PRESETS {
            let t = framework_table(p, |c| c.to_owned());
            let mut m = map_table(&t).unwrap();
            if let Some(r) = m.preset.as_mut() {
                if ONE_ROW_PER.iter().any(|(name, _)| *name == p.name) {
                    r.one_row_per = Some((
                        ONE_ROW_PER[0].1.to_owned(),
                        vec!["a.B.on(x)".to_owned(), "o'c".to_owned()],
                    ));
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
            if ONE_ROW_PER.iter().any(|(name, _)| *name == p.name) {
                assert!(
                    text.contains("where = \"listener_id = 'a.B.on(x)'\"\n"),
                    "{text}"
                );
                assert!(text.contains("#   o'c\n"), "{text}");
            }
        }
    }
}

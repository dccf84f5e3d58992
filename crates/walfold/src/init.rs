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
use walfold_config::presets::PRESETS;
use walfold_config::{Config, QualifiedName};
use walfold_source::shape;

use crate::Failure;

mod mapping;
mod render;

use mapping::{
    aggregate_key, json_key_expression, map_table, valid_name, Aggregate, Mapped, OneRowPer,
    Proposal, ReadModel, Recognised, Table, KEYS, ONE_ROW_PER,
};
use render::{lock_down, render, toml_str, Messages};

/// The tables init may follow, as the catalog has them (names the config cannot take
/// left out).
async fn tables(client: &Client) -> Result<Vec<Table>, Failure> {
    let tables = shape::tables(client)
        .await
        .map_err(|e| Failure::runtime(format!("reading the catalog: {}", error_text(&e))))?;
    Ok(tables
        .into_iter()
        .filter(|t| valid_name(&t.schema) && valid_name(&t.name))
        .filter_map(|t| {
            let name = QualifiedName::parse(&format!("{}.{}", t.schema, t.name)).ok()?;
            let columns = t
                .columns
                .into_iter()
                .map(|c| (c.name, c.type_name))
                .collect();
            Some(Table { name, columns })
        })
        .collect())
}

/// A statement's failure as tokio-postgres says it (what init's messages have shown).
fn error_text(e: &walfold_store::StoreError) -> String {
    match e.pg() {
        Some(pg) => pg.to_string(),
        None => e.to_string(),
    }
}

fn parse_table(text: &str, flag: &str) -> Result<QualifiedName, Failure> {
    QualifiedName::parse(text).map_err(|m| Failure::config(format!("{flag} {text}: {m}")))
}

/// `--read-model`'s table as a `table` projection.
async fn read_model(client: &Client, name: &QualifiedName) -> Result<ReadModel, Failure> {
    // init reads the read model through --url: often the source role, which the least
    // privilege layout does not let see the target's schemas.
    let table = shape::model_table(client, name).await.map_err(|e| {
        Failure::config(format!(
            "--read-model {name}: cannot read it through --url: {}. Run init with a URL \
             whose role may read that table (the target's), or leave --read-model out and \
             write the projection by hand",
            e.pg()
                .map(walfold_pg::describe)
                .unwrap_or_else(|| e.to_string())
        ))
    })?;
    let Some(table) = table else {
        return Err(Failure::config(format!(
            "--read-model {name}: no such table (names are case-sensitive)"
        )));
    };
    mapping::read_model(name, table)
}

/// The publication to use: an existing one that publishes exactly these tables (and
/// is not FOR ALL TABLES), else walfold's default, which it creates on start.
async fn publication(
    client: &Client,
    outboxes: &[QualifiedName],
) -> Result<Option<String>, Failure> {
    let mut wanted: Vec<String> = outboxes.iter().map(ToString::to_string).collect();
    wanted.sort();
    let publications = shape::publications(client)
        .await
        .map_err(|e| Failure::runtime(error_text(&e)))?;
    Ok(publications
        .into_iter()
        .find(|(_, tables)| *tables == wanted)
        .and_then(|(name, _)| Some(name).filter(|name| valid_name(name))))
}

/// The outboxes named on the command line.
pub struct Wanted {
    /// `--table`: without any (and without message outboxes), init looks for one.
    pub tables: Vec<String>,
    /// `--message-prefix`.
    pub message_prefixes: Vec<String>,
    /// `--where`: the rows of the one table outbox that are events.
    pub r#where: Option<String>,
    /// `--aggregate-id`: the one table outbox's aggregate ID.
    pub aggregate_id: Option<String>,
}

pub async fn init(
    url: &str,
    outboxes: &Wanted,
    read_model_table: Option<&str>,
    output: &Path,
) -> Result<(), Failure> {
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
    let mut chosen = choose(&all, outboxes)?;
    let read_model = match read_model_table {
        Some(t) => Some(read_model(&client, &parse_table(t, "--read-model")?).await?),
        None => None,
    };
    given(&mut chosen, outboxes)?;
    for m in &mut chosen {
        if let Some(r) = &mut m.preset {
            r.one_row_per = one_row_per(&client, &m.table, r).await?;
            refuse_every_row_per(&m.table, r)?;
            if matches!(r.aggregate, Aggregate::Preset) {
                r.aggregate = aggregate(&client, &m.table, r).await?;
            }
        }
    }
    if let Some(t) = read_model_table {
        keyed_on_a_stand_in(t, &chosen)?;
    }
    // Message outboxes' events may carry a version of their own.
    let versioned = !prefixes.is_empty() || chosen.iter().any(Mapped::versioned);
    if let (Some(t), false) = (read_model_table, versioned) {
        return Err(unversioned(t, &chosen));
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
    write(output, to_stdout, &text)?;
    let say = Say { to_stdout };
    say.written(&chosen, prefixes, grants.as_ref(), read_model.as_ref());
    if !to_stdout {
        say.line(format!("wrote {}", output.display()));
    }
    say.line("\nchecks (as `walfold doctor` runs them):".to_owned());
    let failed = crate::doctor::check(&config, 1024, to_stdout).await?;
    say.next(url, output, to_stdout, had_password, failed);
    Ok(())
}

/// The tables to follow: those named with `--table`, else the one table that looks like
/// an outbox (none when only message outboxes are named).
fn choose(all: &[Table], outboxes: &Wanted) -> Result<Vec<Mapped>, Failure> {
    let wanted = &outboxes.tables;
    if !wanted.is_empty() || !outboxes.message_prefixes.is_empty() {
        return wanted.iter().map(|w| named(all, w)).collect();
    }
    let found: Vec<Mapped> = all.iter().filter_map(|t| map_table(t).ok()).collect();
    match found.len() {
        0 => {
            let required: Vec<String> = KEYS
                .iter()
                .filter(|k| k.required)
                .map(|k| format!("{} ({})", k.key, k.spellings.join("/")))
                .collect();
            let presets: Vec<&str> = PRESETS.iter().map(|p| p.framework).collect();
            Err(Failure::config(format!(
                "no table looks like an outbox: walfold needs {} (compared without case and \
                 underscores; the ID a uuid or text, the payload JSON), or a framework's table \
                 as it creates it ({}). Name it with --table schema.table to see what is \
                 missing",
                required.join(", "),
                presets.join(", ")
            )))
        }
        1 => Ok(found),
        _ => {
            let names: Vec<String> = found.iter().map(|m| m.table.to_string()).collect();
            Err(Failure::config(format!(
                "several tables look like outboxes: {}; pick with --table (repeat it to follow several)",
                names.join(", ")
            )))
        }
    }
}

/// The mapping of `--table w`.
fn named(all: &[Table], w: &str) -> Result<Mapped, Failure> {
    let name = parse_table(w, "--table")?;
    let Some(t) = all.iter().find(|t| t.name == name) else {
        return Err(Failure::config(format!(
            "--table {w}: no such table in the database (names are case-sensitive; a \
             partition is followed through its partitioned table)"
        )));
    };
    map_table(t).map_err(|missing| {
        Failure::config(format!(
            "--table {w} does not look like an outbox: no column for {}",
            missing.join(", ")
        ))
    })
}

/// `--read-model` without a version in any outbox.
fn unversioned(t: &str, chosen: &[Mapped]) -> Failure {
    let names: Vec<String> = chosen.iter().map(|m| m.table.to_string()).collect();
    Failure::config(format!(
        "--read-model {t}: a `table` projection changes a row only for a higher event \
         version, and {} has no version column (none named version, sequence, \
         aggregate_version or seq): every event would be dead-lettered. Add a version to \
         the outbox, or run init without --read-model and write a `sql` projection (the \
         file has an example that needs no version)",
        names.join(", ")
    ))
}

/// Writes `text` to `output` (never over a file), or to standard output.
fn write(output: &Path, to_stdout: bool, text: &str) -> Result<(), Failure> {
    if to_stdout {
        print!("{text}");
        return Ok(());
    }
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
        .map_err(|e| Failure::runtime(format!("cannot write {}: {e}", output.display())))
}

/// What init tells the operator: on standard error when the config goes to standard
/// output.
struct Say {
    to_stdout: bool,
}

impl Say {
    fn line(&self, line: String) {
        if self.to_stdout {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }

    /// What the file follows and projects.
    fn written(
        &self,
        chosen: &[Mapped],
        prefixes: &[String],
        grants: Option<&walfold_source::EmitGrants>,
        read_model: Option<&ReadModel>,
    ) {
        for m in chosen {
            self.outbox(m);
        }
        for p in prefixes {
            self.line(format!(
                "message outbox '{p}': pg_logical_emit_message(true, '{p}', json) calls"
            ));
        }
        if let Some(g) = grants.filter(|g| g.public) {
            self.line(format!(
                "only the producer may write events: as a superuser, run\n{}\n(they are in the file too)",
                lock_down(g)
                    .iter()
                    .map(|l| format!("  {l}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ));
        }
        match read_model {
            Some(r) => self.line(format!(
                "projection {}: table projection, key {} (from the aggregate ID), version guard on {}",
                r.table.name, r.key, r.version
            )),
            None => {
                self.line("projection: none yet (a commented `sql` example is in the file)".into())
            }
        }
    }

    fn outbox(&self, m: &Mapped) {
        let Some(r) = &m.preset else {
            let cols: Vec<String> = m.columns.iter().map(|(k, c)| format!("{k}={c}")).collect();
            self.line(format!("outbox {}: {}", m.table, cols.join(", ")));
            return;
        };
        self.line(format!(
            "outbox {}: {}, preset {} (every field written out in the file)",
            m.table, r.preset.framework, r.preset.name
        ));
        if let Some(w) = &r.chosen_where {
            self.line(format!("  where = {w} (--where)"));
        } else if let Some(o) = &r.one_row_per {
            let column = &o.column;
            let values = o.values();
            self.line(match o.filter(render::column_in_expression) {
                Some(mapping::Filter::One(value, _)) => format!(
                    "  one row per event and {column}: keeping {column} = '{value}', which has \
                     rows of every event type ({} value(s) found; the file lists the others)",
                    values.len()
                ),
                Some(mapping::Filter::PerType(per_type, _)) => format!(
                    "  one row per event and {column}, and no {column} has every event type: \
                     keeping one {column}'s rows per type ({} types; the file lists them)",
                    per_type.len()
                ),
                None => format!("  one row per event and {column}"),
            });
        }
        match &r.aggregate {
            Aggregate::Preset => {}
            Aggregate::Given(v) => self.line(format!("  aggregate_id = {v} (--aggregate-id)")),
            Aggregate::Proposed(p) => self.line(format!(
                "  aggregate_id: PROPOSED {} (the payload key `{}`, in {} of {} sampled \
                 payloads); the framework's rows carry no aggregate: check it",
                p.expression, p.key, p.seen, p.sampled
            )),
            Aggregate::StandIn { value, why } => self.line(format!(
                "  aggregate_id: STAND-IN `{value}`: {why}. A read model keyed on :aggregate_id \
                 gets one row per message; set aggregate_id to your events' own field (or \
                 rerun init with --aggregate-id EXPR)"
            )),
        }
    }

    /// Where the password goes, and what to run next.
    fn next(&self, url: &str, output: &Path, to_stdout: bool, had_password: bool, failed: usize) {
        let path = if to_stdout {
            "walfold.toml".to_owned()
        } else {
            output.display().to_string()
        };
        if had_password {
            self.line(format!(
                "\nthe password is not in the file: pass it in the environment, e.g.\n  export WALFOLD_SOURCE__URL={}",
                toml_str(&walfold_config::redact_url(url)).replace("***", "<password>")
            ));
        }
        if failed > 0 {
            self.line(format!(
                "\n{failed} check(s) failed: fix them (each says how), then `walfold doctor -c {path}` and `walfold run -c {path}`"
            ));
        } else {
            self.line(format!(
                "\nnext: `walfold doctor -c {path}`, then `walfold run -c {path}`"
            ));
        }
    }
}

/// For a preset with [`ONE_ROW_PER`]: its column and the (value, event type) pairs the
/// table holds (at most 200, in order).
async fn one_row_per(
    client: &Client,
    table: &QualifiedName,
    r: &Recognised,
) -> Result<Option<OneRowPer>, Failure> {
    let Some((_, wanted, wanted_type)) = ONE_ROW_PER.iter().find(|(p, _, _)| *p == r.preset.name)
    else {
        return Ok(None);
    };
    let column_of = |wanted: &str| {
        r.columns
            .iter()
            .find(|c| c.eq_ignore_ascii_case(wanted))
            .cloned()
    };
    let (Some(column), Some(type_column)) = (column_of(wanted), column_of(wanted_type)) else {
        return Ok(None);
    };
    let pairs = shape::column_pairs(client, table, [&column, &type_column], 200)
        .await
        .map_err(|e| {
            Failure::runtime(format!(
                "reading {table}'s {column} values: {}",
                error_text(&e)
            ))
        })?;
    Ok(Some(OneRowPer {
        column,
        type_column,
        pairs,
    }))
}

/// A table with one row per event and per listener (or destination) that holds no rows
/// to pick one from, without `--where`: init stops rather than fold each event once per
/// listener.
fn refuse_every_row_per(table: &QualifiedName, r: &Recognised) -> Result<(), Failure> {
    let Some(o) = r.one_row_per.as_ref().filter(|o| o.pairs.is_empty()) else {
        return Ok(());
    };
    if r.chosen_where.is_some() {
        return Ok(());
    }
    let column = &o.column;
    Err(Failure::config(format!(
        "{table} is {}'s table, which holds one row per event and per {column}, and it holds \
         no rows yet to pick one {column} from: each event would count once per {column}. \
         Rerun init with --where \"{column} = '…'\" (one {column} that receives every event \
         type you fold)",
        r.preset.framework
    )))
}

/// `--where` and `--aggregate-id`, for the one table outbox.
fn given(chosen: &mut [Mapped], outboxes: &Wanted) -> Result<(), Failure> {
    if outboxes.r#where.is_none() && outboxes.aggregate_id.is_none() {
        return Ok(());
    }
    let [m] = chosen else {
        return Err(Failure::config(
            "--where and --aggregate-id are for one table outbox: name one with --table",
        ));
    };
    match &mut m.preset {
        Some(r) => {
            r.chosen_where = outboxes.r#where.clone();
            if let Some(a) = &outboxes.aggregate_id {
                r.aggregate = Aggregate::Given(a.clone());
            }
        }
        None => {
            for (key, value) in [
                ("where", &outboxes.r#where),
                ("aggregate_id", &outboxes.aggregate_id),
            ] {
                if let Some(v) = value {
                    m.columns.retain(|(k, _)| *k != key);
                    m.columns.push((key, v.clone()));
                }
            }
        }
    }
    Ok(())
}

/// For a preset whose `aggregate_id` is a stand-in: an expression over a JSON key of a
/// sample of the table's payloads that looks like the aggregate's identity, else the
/// stand-in (marked where it is written).
async fn aggregate(
    client: &Client,
    table: &QualifiedName,
    r: &Recognised,
) -> Result<Aggregate, Failure> {
    let Some((value, why)) = r.preset.stand_in() else {
        return Ok(Aggregate::Preset);
    };
    let text = format!(
        "[source]\nurl = \"postgresql://init@localhost/sample\"\n[[outbox]]\ntable = {}\npreset = {}\n",
        render::toml_str(&table.to_string()),
        render::toml_str(r.preset.name)
    );
    let outbox = Config::from_toml(&text, Vec::<(String, String)>::new())
        .map_err(|e| Failure::runtime(format!("the preset's config does not load (a bug): {e}")))?
        .outbox
        .remove(0);
    let sampled = walfold_source::sample_events(client, &outbox, 200)
        .await
        .map_err(|e| Failure::runtime(format!("sampling {table}'s rows: {e}")))?;
    let pairs: Vec<(&str, &serde_json::Value)> = sampled
        .iter()
        .map(|s| (s.event_type.as_str(), &s.payload))
        .collect();
    let Some((key, seen, others)) = aggregate_key(&pairs) else {
        return Ok(Aggregate::StandIn { value, why });
    };
    let payload = outbox
        .fields()
        .into_iter()
        .find(|f| f.key == "payload")
        .map(|f| (f.value.to_owned(), f.is_column()));
    let (payload, is_column) = payload.unwrap_or_else(|| ("payload".into(), true));
    Ok(Aggregate::Proposed(Proposal {
        expression: json_key_expression(&payload, is_column, sampled[0].payload_kind, &key),
        key,
        seen,
        sampled: sampled.len(),
        others,
    }))
}

/// `--read-model` (a `table` projection keyed on the aggregate ID) over an outbox whose
/// aggregate ID would be a stand-in: one row per message, never per aggregate.
fn keyed_on_a_stand_in(t: &str, chosen: &[Mapped]) -> Result<(), Failure> {
    for m in chosen {
        if let Some(Aggregate::StandIn { value, why }) = m.preset.as_ref().map(|r| &r.aggregate) {
            return Err(Failure::config(format!(
                "--read-model {t}: a `table` projection is keyed on the aggregate ID, and \
                 {}'s would be a stand-in, `{value}` ({why}): the read model would get one row \
                 per message. Rerun init with --aggregate-id EXPR (your events' own field, e.g. \
                 \"payload->>'orderId'\"), or leave --read-model out and write a `sql` projection",
                m.table
            )));
        }
    }
    Ok(())
}

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

use mapping::{map_table, valid_name, Mapped, ReadModel, Recognised, Table, KEYS, ONE_ROW_PER};
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
    // Message outboxes' events may carry a version of their own.
    let versioned = !prefixes.is_empty() || chosen.iter().any(Mapped::versioned);
    if let (Some(t), false) = (read_model_table, versioned) {
        return Err(unversioned(t, &chosen));
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
        if let Some((column, values)) = &r.one_row_per {
            self.line(match values.first() {
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
    let values = shape::column_values(client, table, column, 50)
        .await
        .map_err(|e| {
            Failure::runtime(format!(
                "reading {table}'s {column} values: {}",
                error_text(&e)
            ))
        })?;
    Ok(Some((column.clone(), values)))
}

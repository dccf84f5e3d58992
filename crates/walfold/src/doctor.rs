//! `walfold doctor`: checks the source and target for what walfold needs and what makes
//! CDC hurt a database (a slot holding WAL without limit, a lost slot, missing rights),
//! printing each check with ok/warn/fail and the fix. Exits 1 when a check fails.
//!
//! Each check is a small function from what was read (a source's shape, a target's
//! rights, walfold's records) to its findings; this file reaches the servers and runs
//! them in order.

use std::path::Path;

use tokio_postgres::Client;
use walfold_config::{Config, SourceView};
use walfold_engine::Target;
use walfold_store::target_shape;

use crate::run::load;
use crate::Failure;

mod definitions;
mod finding;
mod ha;
mod outboxes;
mod publication;
mod records;
mod server;
mod slot;
mod source;
mod stand_in;
mod standby_slots;
mod target;
mod wal;
mod writers;

use finding::{Finding, Report};

pub async fn doctor(path: &Path, max_retained_mb: i64) -> Result<(), Failure> {
    let config = load(path)?;
    match check(&config, max_retained_mb, false).await? {
        0 => Ok(()),
        _ => Err(Failure::runtime("doctor found failing checks")),
    }
}

/// Runs every check on `config`, printing each; returns how many failed. `walfold init`
/// runs them on the config it wrote.
pub async fn check(
    config: &Config,
    max_retained_mb: i64,
    to_stderr: bool,
) -> Result<usize, Failure> {
    let mut r = Report::new(to_stderr);
    let target = walfold_pg::connect_for_command(config.target_url(), "target main")
        .await
        .map_err(|e| e.to_string());
    check_sources(&mut r, config, target.as_ref().ok(), max_retained_mb).await?;
    check_main_target(&mut r, config, target).await?;
    check_extra_targets(&mut r, config).await?;
    Ok(r.failures)
}

/// How a source is named in the checks, and the config key of its URL.
fn source_names(config: &Config, view: &SourceView<'_>) -> (String, String) {
    let name = &view.source().name;
    if config.sources().len() > 1 {
        (
            format!("source {name}"),
            format!("the url of source {name}"),
        )
    } else {
        ("source".to_owned(), "source.url".to_owned())
    }
}

async fn check_sources(
    r: &mut Report,
    config: &Config,
    target: Option<&Client>,
    max_retained_mb: i64,
) -> Result<(), Failure> {
    let several = config.sources().len() > 1;
    // (source, what identifies its database): two sources on one database read the same
    // outbox twice, whatever their URLs say.
    let mut seen: Vec<(String, String)> = Vec::new();
    for view in config.source_views() {
        let name = &view.source().name;
        let (what, key) = source_names(config, &view);
        let source =
            match walfold_pg::connect_for_command(&view.source().url, &format!("source {name}"))
                .await
            {
                Ok(source) => source,
                Err(e) => {
                    r.add(Finding::fail(
                        format!("{what} unreachable: {e}"),
                        format!("check {key}, the network and pg_hba.conf"),
                    ));
                    continue;
                }
            };
        r.add(Finding::ok(format!("{what} reachable")));
        if !session_check(r, &what, &key, &view.source().url).await {
            continue;
        }
        if several {
            if let Ok(identity) = walfold_source::shape::database_identity(&source).await {
                r.extend(same_database(&seen, name, &identity));
                seen.push((name.clone(), identity));
            }
            r.scope = format!("source {name}: ");
        }
        let checked = source::check(r, &view, &source, target, max_retained_mb)
            .await
            .map_err(Failure::runtime);
        r.scope.clear();
        checked?;
    }
    Ok(())
}

/// One database's outbox read by two sources is attributed to whichever appends first.
fn same_database(seen: &[(String, String)], name: &str, identity: &str) -> Option<Finding> {
    let (other, _) = seen.iter().find(|(_, i)| i == identity)?;
    Some(Finding::fail(
        format!("sources {other} and {name} are the same database"),
        "point each [[source]] at its own database: one database's outbox read by two sources is attributed to whichever appends first",
    ))
}

async fn check_main_target(
    r: &mut Report,
    config: &Config,
    target: Result<Client, String>,
) -> Result<(), Failure> {
    // Without target.url the target is the source's database, reached by its URL.
    let target_key = match config.target.url {
        Some(_) => "target.url",
        None => "source.url",
    };
    let t = match target {
        Ok(t) => t,
        Err(e) => {
            r.add(Finding::fail(
                format!("target unreachable: {e}"),
                "check target.url, the network and pg_hba.conf",
            ));
            return Ok(());
        }
    };
    if !session_check(r, "target", target_key, config.target_url()).await {
        return Ok(());
    }
    let main = Target::main(config);
    let instances = target_shape::running_instances(&t, main.schema.name())
        .await
        .map_err(Failure::runtime)?;
    r.extend(
        target::checks(config, &main, &t, instances)
            .await
            .map_err(Failure::runtime)?,
    );
    r.extend(
        definitions::checks(config, &main, &t)
            .await
            .map_err(Failure::runtime)?,
    );
    r.extend(
        records::checks(config, &main.schema, &t)
            .await
            .map_err(Failure::runtime)?,
    );
    r.extend(
        wal::checks(&t, &main.schema)
            .await
            .map_err(Failure::runtime)?,
    );
    Ok(())
}

async fn check_extra_targets(r: &mut Report, config: &Config) -> Result<(), Failure> {
    for t in Target::all(config).iter().filter(|t| t.is_extra()) {
        let (what, key) = (
            format!("target {}", t.label()),
            format!("targets.{}.url", t.label()),
        );
        let c = match walfold_pg::connect_for_command(&t.url, &what).await {
            Ok(c) => c,
            Err(e) => {
                r.add(Finding::fail(
                    format!("target {} unreachable: {e}", t.label()),
                    format!(
                        "check targets.{}.url, the network and pg_hba.conf (its projections pause until it answers)",
                        t.label()
                    ),
                ));
                continue;
            }
        };
        r.add(Finding::ok(format!("{what} reachable")));
        if !session_check(r, &what, &key, &t.url).await {
            continue;
        }
        let instances = match walfold_pg::connect_for_command(config.target_url(), "target").await {
            Ok(main) => target_shape::running_instances(&main, &config.target.schema)
                .await
                .ok()
                .flatten(),
            Err(_) => None,
        };
        r.extend(
            target::checks(config, t, &c, instances)
                .await
                .map_err(Failure::runtime)?,
        );
        r.extend(
            definitions::checks(config, t, &c)
                .await
                .map_err(Failure::runtime)?,
        );
    }
    Ok(())
}

/// Whether `url` gives walfold a session of its own; a pooler that shares server
/// sessions (transaction or statement pooling) is a failing check, and the checks that
/// need a session are skipped (`false`).
async fn session_check(r: &mut Report, what: &str, key: &str, url: &str) -> bool {
    let finding = pooling_finding(
        what,
        key,
        walfold_pg::pooling(url)
            .await
            .map_err(walfold_store::StoreError::from),
    );
    let shared = finding.level == finding::Level::Fail;
    r.add(finding);
    !shared
}

fn pooling_finding(
    what: &str,
    key: &str,
    pooling: Result<walfold_pg::Pooling, walfold_store::StoreError>,
) -> Finding {
    use walfold_pg::Pooling;
    let unknown = |reason: &dyn std::fmt::Display| {
        Finding::warn(
            format!("cannot tell whether {what} is behind a pooler that shares sessions: {reason}"),
            "",
        )
    };
    match pooling {
        Ok(Pooling::Session) => Finding::ok(format!(
            "{what} keeps a session of its own (no transaction pooling)"
        )),
        Ok(Pooling::Shared { evidence }) => Finding::fail(
            format!(
                "{what} is behind a pooler that shares server sessions (transaction or \
                 statement pooling): {evidence}; walfold needs a session there (leader \
                 lock, prepared statements, search_path) and refuses to run"
            ),
            walfold_pg::pooler_fix(key),
        ),
        Ok(Pooling::Unknown { reason }) => unknown(&reason),
        Err(e) => unknown(&e),
    }
}

//! `walfold doctor`: checks the source and target for what walfold needs and what makes
//! CDC hurt a database (a slot holding WAL without limit, a lost slot, missing rights),
//! printing each check with ok/warn/fail and the fix. Exits 1 when a check fails.

use std::path::Path;

use tokio_postgres::Client;
use walfold_config::{Config, ProjectionKind, SourceView, VersionMode};
use walfold_pg::RowExt;

use crate::run::load;
use crate::Failure;

mod ha;
mod wal;

/// What stops the checks: a statement that failed, or a row that could not be read.
type CheckError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Ok,
    Warn,
    Fail,
}

struct Report {
    failures: usize,
    /// Print to standard error (when standard output carries something else).
    to_stderr: bool,
    /// Said before each check's text (`source orders: ` while one of several sources
    /// is checked).
    scope: String,
}

impl Report {
    fn check(&mut self, level: Level, what: impl AsRef<str>, fix: impl AsRef<str>) {
        let tag = match level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        let mut text = format!("{tag}  {}{}", self.scope, what.as_ref());
        if level != Level::Ok && !fix.as_ref().is_empty() {
            text.push_str(&format!("\n      fix: {}", fix.as_ref()));
        }
        if self.to_stderr {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
        self.failures += usize::from(level == Level::Fail);
    }
}

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
    let mut r = Report {
        failures: 0,
        to_stderr,
        scope: String::new(),
    };
    run_checks(&mut r, config, max_retained_mb).await?;
    Ok(r.failures)
}

async fn run_checks(r: &mut Report, config: &Config, max_retained_mb: i64) -> Result<(), Failure> {
    let target = walfold_pg::connect_for_command(config.target_url(), "target main")
        .await
        .map_err(|e| e.to_string());
    let several = config.sources().len() > 1;
    // (source, what identifies its database): two sources on one database read the same
    // outbox twice, whatever their URLs say.
    let mut seen: Vec<(String, String)> = Vec::new();
    for view in config.source_views() {
        let name = &view.source().name;
        let (what, key) = if several {
            (
                format!("source {name}"),
                format!("the url of source {name}"),
            )
        } else {
            ("source".to_owned(), "source.url".to_owned())
        };
        match walfold_pg::connect_for_command(&view.source().url, &format!("source {name}")).await {
            Ok(source) => {
                r.check(Level::Ok, format!("{what} reachable"), "");
                if !session_check(r, &what, &key, &view.source().url).await {
                    continue;
                }
                if several {
                    if let Ok(identity) = walfold_source::database_identity(&source).await {
                        if let Some((other, _)) = seen.iter().find(|(_, i)| *i == identity) {
                            r.check(
                                Level::Fail,
                                format!("sources {other} and {name} are the same database"),
                                "point each [[source]] at its own database: one database's outbox read by two sources is attributed to whichever appends first",
                            );
                        }
                        seen.push((name.clone(), identity));
                    }
                }
                if several {
                    r.scope = format!("source {name}: ");
                }
                let checked =
                    source_checks(r, &view, &source, target.as_ref().ok(), max_retained_mb)
                        .await
                        .map_err(Failure::runtime);
                r.scope.clear();
                checked?;
            }
            Err(e) => r.check(
                Level::Fail,
                format!("{what} unreachable: {e}"),
                format!("check {key}, the network and pg_hba.conf"),
            ),
        }
    }
    // Without target.url the target is the source's database, reached by its URL.
    let target_key = match config.target.url {
        Some(_) => "target.url",
        None => "source.url",
    };
    match &target {
        Ok(_) if !session_check(r, "target", target_key, config.target_url()).await => {}
        Ok(t) => {
            target_checks(r, config, &walfold_engine::Target::main(config), t)
                .await
                .map_err(Failure::runtime)?;
            abandoned_slots(r, config, t).await;
            failover_leftovers(r, config, t).await;
            filters_meet_the_log(r, config, t)
                .await
                .map_err(Failure::runtime)?;
            wal::wal_checks(r, t, walfold_engine::Target::main(config).schema.quoted())
                .await
                .map_err(Failure::runtime)?;
        }
        Err(e) => r.check(
            Level::Fail,
            format!("target unreachable: {e}"),
            "check target.url, the network and pg_hba.conf",
        ),
    }
    for t in walfold_engine::Target::all(config)
        .iter()
        .filter(|t| t.is_extra())
    {
        let (what, key) = (
            format!("target {}", t.label()),
            format!("targets.{}.url", t.label()),
        );
        match walfold_pg::connect_for_command(&t.url, &what).await {
            Ok(c) => {
                r.check(Level::Ok, format!("{what} reachable"), "");
                if !session_check(r, &what, &key, &t.url).await {
                    continue;
                }
                target_checks(r, config, t, &c)
                    .await
                    .map_err(Failure::runtime)?;
            }
            Err(e) => r.check(
                Level::Fail,
                format!("target {} unreachable: {e}", t.label()),
                format!(
                    "check targets.{}.url, the network and pg_hba.conf (its projections pause until it answers)",
                    t.label()
                ),
            ),
        }
    }
    Ok(())
}

/// Whether `url` gives walfold a session of its own; a pooler that shares server
/// sessions (transaction or statement pooling) is a failing check, and the checks that
/// need a session are skipped (`false`).
async fn session_check(r: &mut Report, what: &str, key: &str, url: &str) -> bool {
    use walfold_pg::Pooling;
    match walfold_pg::pooling(url).await {
        Ok(Pooling::Session) => {
            r.check(
                Level::Ok,
                format!("{what} keeps a session of its own (no transaction pooling)"),
                "",
            );
            true
        }
        Ok(Pooling::Shared { evidence }) => {
            r.check(
                Level::Fail,
                format!(
                    "{what} is behind a pooler that shares server sessions (transaction or \
                     statement pooling): {evidence}; walfold needs a session there (leader \
                     lock, prepared statements, search_path) and refuses to run"
                ),
                walfold_pg::pooler_fix(key),
            );
            false
        }
        Ok(Pooling::Unknown { reason }) => {
            r.check(
                Level::Warn,
                format!(
                    "cannot tell whether {what} is behind a pooler that shares sessions: {reason}"
                ),
                "",
            );
            true
        }
        Err(e) => {
            r.check(
                Level::Warn,
                format!("cannot tell whether {what} is behind a pooler that shares sessions: {e}"),
                "",
            );
            true
        }
    }
}

async fn setting(c: &Client, name: &str) -> Result<String, CheckError> {
    Ok(c.query_one("select current_setting($1)", &[&name])
        .await?
        .of("pg_settings")
        .col(0)?)
}

async fn source_checks(
    r: &mut Report,
    config: &SourceView<'_>,
    source: &Client,
    target: Option<&Client>,
    max_retained_mb: i64,
) -> Result<(), CheckError> {
    let wal_level = setting(source, "wal_level").await?;
    if wal_level == "logical" {
        r.check(Level::Ok, "wal_level = logical", "");
    } else {
        r.check(
            Level::Fail,
            format!("wal_level = {wal_level}"),
            "set wal_level = logical in postgresql.conf and restart the server",
        );
    }
    let row = source
        .query_one(
            "select current_setting('max_replication_slots')::int, \
             (select count(*) from pg_replication_slots)::int, \
             current_setting('max_wal_senders')::int, \
             (select count(*) from pg_stat_replication)::int",
            &[],
        )
        .await?;
    let row = row.of("pg_settings");
    let (slots, used, senders, sending): (i32, i32, i32, i32) =
        (row.col(0)?, row.col(1)?, row.col(2)?, row.col(3)?);
    let slot_row = source
        .query_opt(
            "select active, wal_status, (pg_current_wal_lsn() - restart_lsn)::int8, plugin \
             from pg_replication_slots where slot_name = $1",
            &[&config.source().slot],
        )
        .await?;
    let free_slot = slot_row.is_some() || used < slots;
    r.check(
        if free_slot { Level::Ok } else { Level::Fail },
        format!("max_replication_slots = {slots} ({used} used)"),
        "raise max_replication_slots (restart needed)",
    );
    r.check(
        if sending < senders {
            Level::Ok
        } else {
            Level::Warn
        },
        format!("max_wal_senders = {senders} ({sending} streaming)"),
        "raise max_wal_senders (restart needed)",
    );
    let keep = setting(source, "max_slot_wal_keep_size").await?;
    if keep == "-1" {
        r.check(Level::Warn, "max_slot_wal_keep_size = -1 (unlimited)", "set max_slot_wal_keep_size (e.g. '50GB') so a stopped consumer cannot fill the disk; a slot that exceeds it is invalidated and walfold stops loudly");
    } else {
        r.check(Level::Ok, format!("max_slot_wal_keep_size = {keep}"), "");
    }
    let row = source
        .query_one(
            "select rolreplication or rolsuper or exists (select 1 from pg_roles m \
             where m.rolname = 'rds_replication' and pg_has_role(current_user, m.oid, 'member')), \
             current_user::text, has_database_privilege(current_database(), 'create') \
             from pg_roles where rolname = current_user",
            &[],
        )
        .await?;
    let row = row.of("pg_roles");
    let (replication, role, db_create): (bool, String, bool) =
        (row.col(0)?, row.col(1)?, row.col(2)?);
    let role = walfold_config::quote_ident(&role);
    r.check(
        if replication { Level::Ok } else { Level::Fail },
        format!("the source role {role} may replicate"),
        format!("alter role {role} replication (on RDS/Aurora: grant rds_replication to {role})"),
    );

    // Outbox tables and the publication: what `walfold run` refuses is a FAIL here.
    let publication = &config.source().publication;
    let shape = walfold_source::inspect(source, config).await?;
    for refusal in shape
        .refusals
        .iter()
        .chain(&shape.missing_columns)
        .chain(&shape.public_emit)
    {
        r.check(Level::Fail, &refusal.problem, &refusal.fix);
    }
    for warning in &shape.warnings {
        r.check(Level::Warn, warning, "");
    }
    let updates_or_deletes: bool = source
        .query_opt(
            "select pubupdate or pubdelete from pg_publication where pubname = $1",
            &[publication],
        )
        .await?
        .map(|row| row.of("pg_publication").col(0))
        .transpose()?
        .unwrap_or(false);
    for (o, t) in config.table_outboxes() {
        let exists: bool = source
            .query_one("select to_regclass($1) is not null", &[&t.quoted()])
            .await?
            .of("pg_class")
            .col(0)?;
        if !exists {
            continue;
        }
        r.check(Level::Ok, format!("outbox table {t} exists"), "");
        // A column (an expression's times without an offset are UTC by rule).
        let occurred_column = o
            .fields()
            .into_iter()
            .find(|f| f.key == "occurred_at")
            .filter(|f| f.is_column())
            .map_or_else(String::new, |f| f.value.to_owned());
        let occurred_at: Option<String> = source
            .query_opt(
                "select format_type(atttypid, atttypmod) from pg_attribute \
                 where attrelid = $1::text::regclass and attname = $2 and not attisdropped",
                &[&t.quoted(), &occurred_column],
            )
            .await?
            .map(|row| row.of("pg_attribute").col(0))
            .transpose()?;
        if occurred_at.as_deref() == Some("timestamp without time zone") {
            r.check(
                Level::Warn,
                format!("{t}.{occurred_column}: timestamp without time zone, read as UTC"),
                "write UTC times into it, or make it timestamptz",
            );
        }
        let select: bool = source
            .query_one("select has_table_privilege($1, 'select')", &[&t.quoted()])
            .await?
            .of("pg_class")
            .col(0)?;
        r.check(
            if select { Level::Ok } else { Level::Warn },
            format!("the source role may read {t} (needed by `walfold backfill` only)"),
            format!("grant select on {t} to {role}"),
        );
        writers_of_table(r, source, &t).await?;
        if updates_or_deletes {
            let identity: String = source
                .query_one(
                    "select relreplident::text from pg_class where oid = $1::text::regclass",
                    &[&t.quoted()],
                )
                .await?
                .of("pg_class")
                .col(0)?;
            r.check(
                if identity == "n" { Level::Fail } else { Level::Ok },
                format!("{t}: replica identity {identity} (the publication publishes updates/deletes)"),
                format!("publish only inserts (alter publication {publication} set (publish = 'insert, truncate')), or give {t} a primary key"),
            );
        }
    }
    versions_for_guards(r, config, source).await?;
    let message_outboxes: Vec<_> = config
        .outboxes()
        .filter(|o| o.message_prefix.is_some())
        .collect();
    let version: i32 = if message_outboxes.is_empty() {
        0
    } else {
        source
            .query_one("select current_setting('server_version_num')::int", &[])
            .await?
            .of("pg_settings")
            .col(0)?
    };
    for o in &message_outboxes {
        r.check(
            if version >= 140000 { Level::Ok } else { Level::Fail },
            format!(
                "{}: transactional messages under this prefix are events (the server sends them from PostgreSQL 14)",
                o.describe()
            ),
            "upgrade the source to PostgreSQL 14 or later, or write events to an outbox table",
        );
    }
    if !message_outboxes.is_empty() {
        // While PUBLIC may, the check above FAILed (or warned: allow_public_emit).
        let emitters = walfold_source::emitters(source).await?;
        if !emitters.public {
            let names: Vec<String> = message_outboxes.iter().map(|o| o.describe()).collect();
            r.check(
                Level::Ok,
                format!(
                    "roles that may write events into {} (execute pg_logical_emit_message): {}",
                    names.join(", "),
                    roles(&emitters.roles)
                ),
                "",
            );
        }
    } else if walfold_source::emitters(source).await?.public {
        // Not events, but the slot sends every one: read whole before its prefix is
        // known to be none of walfold's.
        r.check(
            Level::Warn,
            "any role may write logical messages into the WAL walfold reads \
             (pg_logical_emit_message is PUBLIC's): walfold skips those of other prefixes, \
             but reads each whole first, so one of hundreds of MB raises its memory by as much \
             (and again on every restart until the slot passes it)",
            "revoke execute on function pg_logical_emit_message from public, granting it to \
             the roles that need it (walfold's source role for its heartbeats)",
        );
    }
    heartbeat_right(r, config, source, &role).await?;
    // A slot walfold has read from goes on only through the publication it was read
    // through (see the source's checks): creating another is no fix.
    let schema = walfold_store::Schema::new(&config.target.schema);
    let (ingested, read_through) = match target {
        Some(t) => (
            walfold_store::ingested_through(t, &schema, &config.source().slot)
                .await
                .ok()
                .flatten(),
            walfold_store::read_through(t, &schema, &config.source().slot)
                .await
                .ok()
                .flatten(),
        ),
        None => (None, None),
    };
    let read_from = ingested.is_some() && slot_row.is_some();
    let back = match &read_through {
        Some(r) if r != publication => format!("set source.publication back to {r}"),
        _ => "if it is gone, see docs/OPERATIONS.md: a lost slot".to_owned(),
    };
    if !shape.publication_exists && read_from {
        r.check(
            Level::Fail,
            format!("publication {publication} does not exist, and walfold has read slot {} through {}", config.source().slot, read_through.as_deref().unwrap_or("another")),
            format!("walfold will not create it: a publication created now is not there for the changes the slot holds; {back}"),
        );
    } else if !shape.publication_exists {
        let not_owned = not_owned(source, config).await?;
        let may = db_create && not_owned.is_empty();
        r.check(
            if may { Level::Warn } else { Level::Fail },
            format!("publication {publication} does not exist"),
            if may {
                format!(
                    "walfold creates it on start as {role}, or create it as the outbox tables' owner: {}",
                    walfold_source::create_publication(config)
                )
            } else {
                format!(
                    "walfold cannot create it as {role} ({}): create it as the outbox tables' owner: {}",
                    if db_create {
                        format!("it does not own {}", not_owned.join(", "))
                    } else {
                        "no create on the database".to_owned()
                    },
                    walfold_source::create_publication(config)
                )
            },
        );
    } else {
        if read_from && read_through.as_ref().is_some_and(|r| r != publication) {
            r.check(
                Level::Warn,
                format!(
                    "walfold has read slot {} through publication {}, not {publication}",
                    config.source().slot,
                    read_through.as_deref().unwrap_or_default()
                ),
                format!("walfold refuses {publication} unless it is older than the changes the slot holds; {back}"),
            );
        }
        if shape.refusals.is_empty() && shape.unpublished.is_empty() {
            r.check(
                Level::Ok,
                format!("publication {publication} covers exactly the outbox tables"),
                "",
            );
        } else if !shape.unpublished.is_empty() {
            let missing: Vec<String> = shape.unpublished.iter().map(ToString::to_string).collect();
            // `alter publication … add table` needs both the publication and the tables.
            let not_owned = not_owned(source, config).await?;
            let owns_publication: bool = source
                .query_one(
                    "select pg_has_role(pubowner, 'usage') from pg_publication where pubname = $1",
                    &[publication],
                )
                .await?
                .try_get(0)?;
            let quoted: Vec<String> = shape.unpublished.iter().map(|t| t.quoted()).collect();
            let owns = owns_publication
                && shape
                    .unpublished
                    .iter()
                    .all(|t| !not_owned.contains(&t.to_string()));
            r.check(
                if owns { Level::Warn } else { Level::Fail },
                format!("publication {publication} lacks {}", missing.join(", ")),
                if owns {
                    format!("walfold adds them on start as {role}, or add them as their owner")
                } else {
                    format!(
                        "walfold cannot add them as {role} (that needs ownership of the publication and the tables): as their owner, alter publication {} add table {}",
                        walfold_config::quote_ident(publication),
                        quoted.join(", ")
                    )
                },
            );
        }
        // A FAIL for a partitioned outbox without it is among the refusals above.
        match (shape.via_root, shape.partitioned.is_empty()) {
            (true, _) => r.check(
                Level::Ok,
                format!("publication {publication}: publish_via_partition_root = true"),
                "",
            ),
            (false, true) => r.check(
                Level::Ok,
                format!("publication {publication}: publish_via_partition_root = false (no outbox is partitioned)"),
                "",
            ),
            (false, false) => {}
        }
    }

    // The slot.
    let slot = &config.source().slot;
    match slot_row {
        None if ingested.is_some() => r.check(
            Level::Fail,
            format!("slot {slot} is missing, but walfold had ingested through it up to {}", ingested.unwrap_or_default()),
            "events committed since may be lost: recreate the slot, `walfold backfill` the outbox, or set on_slot_lost = \"recreate\" to record the gap and go on",
        ),
        None => r.check(Level::Ok, format!("slot {slot} does not exist yet (created on first start)"), ""),
        Some(row) => {
            let row = row.of("pg_replication_slots");
            let (active, wal_status, retained, plugin): (bool, Option<String>, Option<i64>, Option<String>) =
                (row.col(0)?, row.col(1)?, row.col(2)?, row.col(3)?);
            if plugin.as_deref() != Some("pgoutput") {
                r.check(Level::Fail, format!("slot {slot} uses plugin {plugin:?}"), "choose another source.slot, or drop this slot");
            }
            match wal_status.as_deref() {
                Some("lost") => r.check(
                    Level::Fail,
                    format!("slot {slot} is invalidated (wal_status = lost)"),
                    "WAL it needed was removed: events may be missing; see docs/OPERATIONS.md: a lost slot",
                ),
                Some("unreserved") => r.check(Level::Warn, format!("slot {slot}: wal_status = unreserved"), "the slot is about to lose WAL: make sure walfold runs and keeps up"),
                other => r.check(Level::Ok, format!("slot {slot}: wal_status = {}", other.unwrap_or("-")), ""),
            }
            r.check(
                if active { Level::Ok } else { Level::Warn },
                format!("slot {slot} active = {active}"),
                "no walfold is streaming it: start `walfold run`; an inactive slot keeps WAL",
            );
            let mb = retained.unwrap_or(0) / (1024 * 1024);
            r.check(
                if mb > max_retained_mb { Level::Warn } else { Level::Ok },
                format!("slot {slot} retains {mb} MB of WAL (threshold {max_retained_mb} MB)"),
                "walfold is behind or stopped: check `walfold status` and the daemon's log",
            );
            ha::slot_checks(r, config, source, ingested.as_deref()).await?;
        }
    }
    ha::hosts(r, config).await?;
    Ok(())
}

/// Roles for a line of `doctor`: at most ten names, and superusers, who may do anything.
fn roles(names: &[String]) -> String {
    const SHOWN: usize = 10;
    match names.len() {
        0 => "superusers only".to_owned(),
        n if n > SHOWN => format!(
            "{} and {} more, and superusers",
            names[..SHOWN].join(", "),
            n - SHOWN
        ),
        _ => format!("{}, and superusers", names.join(", ")),
    }
}

/// A projection that needs each event's version (a `table` one's guard, a strict one's
/// order) dead-letters every event that comes without one: an outbox whose version is
/// a column the table does not have gives none.
async fn versions_for_guards(
    r: &mut Report,
    config: &SourceView<'_>,
    source: &Client,
) -> Result<(), CheckError> {
    let name = &config.source().name;
    let needing: Vec<&str> = config
        .config
        .projection
        .iter()
        .filter(|p| {
            matches!(p.kind, ProjectionKind::Table { .. }) || p.version_mode == VersionMode::Strict
        })
        .filter(|p| p.sources.as_ref().is_none_or(|s| s.contains(name)))
        .map(|p| p.name.as_str())
        .collect();
    if needing.is_empty() {
        return Ok(());
    }
    let mut without = Vec::new();
    let mut with = 0;
    for (o, t) in config.table_outboxes() {
        let Some(field) = o.fields().into_iter().find(|f| f.key == "version") else {
            continue;
        };
        let present: bool = !field.is_column()
            || source
                .query_one(
                    "select exists (select 1 from pg_attribute where attrelid = \
                     to_regclass($1) and attname = $2 and attnum > 0 and not attisdropped)",
                    &[&t.quoted(), &field.value],
                )
                .await?
                .of("pg_attribute")
                .col(0)?;
        if present {
            with += 1;
        } else {
            without.push(format!("{t} (no column {})", field.value));
        }
    }
    if without.is_empty() {
        return Ok(());
    }
    // A message outbox's events may carry a version of their own.
    let messages = config.outboxes().any(|o| o.message_prefix.is_some());
    let all = with == 0 && !messages;
    r.check(
        if all { Level::Fail } else { Level::Warn },
        format!(
            "{} each event's version (a `table` projection's guard, a strict one's order), \
             and {} give none: {}",
            match needing.as_slice() {
                [one] => format!("projection {one} needs"),
                several => format!("projections {} need", several.join(", ")),
            },
            without.join(", "),
            if all {
                "every event is dead-lettered"
            } else {
                "their events are dead-lettered unless the projections' event_types or \
                 aggregate_types leave them out"
            }
        ),
        "map the version under [[outbox]] (`version = \"COLUMN\"`, or an expression), or \
         write those projections as `sql` ones that need none",
    );
    Ok(())
}

/// Who can write `table`'s events: whoever may insert into it (informational), and a
/// warning when that is PUBLIC; and the security-definer functions that insert into it
/// for their callers.
async fn writers_of_table(
    r: &mut Report,
    source: &Client,
    table: &walfold_config::QualifiedName,
) -> Result<(), CheckError> {
    let writers = walfold_source::inserters(source, &table.quoted()).await?;
    if writers.public {
        r.check(
            Level::Warn,
            format!("any role may insert into {table}, and so write its events"),
            format!(
                "revoke insert on {} from public; grant insert on {} to <producing role>",
                table.quoted(),
                table.quoted()
            ),
        );
    } else {
        r.check(
            Level::Ok,
            format!(
                "roles that may write events into {table} (insert into it, a partition of it \
                 or an updatable view on it): {}",
                roles(&writers.roles)
            ),
            "",
        );
    }
    if !writers.views.is_empty() {
        r.check(
            Level::Ok,
            match writers.views.as_slice() {
                [one] => format!(
                    "view {one} writes rows into {table} as its owner: whoever may insert into \
                     it writes events"
                ),
                several => format!(
                    "views {} write rows into {table} as their owners: whoever may insert into \
                     them writes events",
                    several.join(", ")
                ),
            },
            "",
        );
    }
    for d in walfold_source::definers(source, &table.quoted(), &table.name).await? {
        let (level, who) = if d.public {
            (Level::Warn, "any role".to_owned())
        } else if !d.triggers_on.is_empty() {
            (
                Level::Ok,
                format!(
                    "whoever writes {} (its triggers call it)",
                    d.triggers_on.join(", ")
                ),
            )
        } else {
            (
                Level::Ok,
                roles(&[vec![d.owner.clone()], d.callers.clone()].concat()),
            )
        };
        r.check(
            level,
            format!(
                "security-definer function {} names {table} and runs as {}, who may insert \
                 into it: {who} may write events through it",
                d.function, d.owner
            ),
            format!(
                "revoke execute on function {} from public; grant execute on function {} \
                 to <producing role>",
                d.function, d.function
            ),
        );
    }
    Ok(())
}

/// Heartbeats call `pg_logical_emit_message` as the source role: once that is revoked
/// from PUBLIC, the role needs its own grant (or no heartbeats).
async fn heartbeat_right(
    r: &mut Report,
    config: &SourceView<'_>,
    source: &Client,
    role: &str,
) -> Result<(), CheckError> {
    if config.source().heartbeat_interval_s == 0 {
        return Ok(());
    }
    let rows = source
        .query(
            "select 'pg_logical_emit_message(' || oidvectortypes(p.proargtypes) || ')', \
             has_function_privilege(p.oid, 'execute') from pg_proc p \
             where p.proname = 'pg_logical_emit_message' \
             and p.pronamespace = 'pg_catalog'::regnamespace \
             and p.proargtypes[2] = 'text'::regtype order by p.oid",
            &[],
        )
        .await?;
    let mut functions: Vec<String> = Vec::with_capacity(rows.len());
    for row in &rows {
        let row = row.of("pg_proc");
        if row.col::<bool>(1)? {
            return Ok(());
        }
        functions.push(row.col(0)?);
    }
    r.check(
        Level::Warn,
        format!("the source role {role} may not execute pg_logical_emit_message: walfold's heartbeats fail, so on a database where no outbox row is written the slot does not advance"),
        format!(
            "grant execute on function {} to {role}, or set source.heartbeat_interval_s = 0",
            functions.join(", ")
        ),
    );
    Ok(())
}

/// The table outboxes (that exist) whose owner the source role is not: it cannot put
/// them in a publication.
async fn not_owned(source: &Client, config: &SourceView<'_>) -> Result<Vec<String>, CheckError> {
    let mut out = Vec::new();
    for (_, t) in config.table_outboxes() {
        let owns: Option<bool> = source
            .query_opt(
                "select pg_has_role(c.relowner, 'usage') from pg_class c \
                 where c.oid = to_regclass($1)",
                &[&t.quoted()],
            )
            .await?
            .map(|row| row.of("pg_class").col(0))
            .transpose()?;
        if owns == Some(false) {
            out.push(t.to_string());
        }
    }
    Ok(out)
}

/// Slots walfold ingested through that no source of the config uses any more (a
/// source's slot renamed, a source removed): on its server such a slot keeps WAL.
/// Phantoms and unfilled slot gaps of each source's slot (see docs/OPERATIONS.md, After a
/// failover).
async fn failover_leftovers(r: &mut Report, config: &Config, target: &Client) {
    let schema = walfold_store::Schema::new(config.target.schema.as_str());
    for source in config.sources() {
        let Ok(s) = walfold_store::failover_summary(target, &schema, &source.slot).await else {
            continue;
        };
        let name = &config.target.schema;
        if s.phantoms > 0 {
            r.check(
                Level::Warn,
                format!(
                    "slot {}: {} phantoms from seq {} (events read from an old primary past a failover's fork that the new primary does not have; they may be in read models)",
                    source.slot,
                    s.phantoms,
                    s.first_seq.unwrap_or(0)
                ),
                format!("`walfold phantoms list --source {}` shows them with the read models they reached: rebuild those projections (walfold rebuild, which skips them); or, for rows the application deleted, accept them: walfold phantoms accept EVENT_ID --reason …", source.name),
            );
        }
        if s.open_gaps > 0 {
            r.check(
                Level::Warn,
                format!(
                    "slot {}: {} slot gaps not filled (events committed in them may be missing; see {name}.slot_gap)",
                    source.slot, s.open_gaps
                ),
                format!("backfill the table outboxes (walfold backfill), then mark the gaps filled: update {name}.slot_gap set filled_at = now() where slot = '{}' and filled_at is null; a message outbox's events in a gap are lost", source.slot),
            );
        }
    }
}

async fn abandoned_slots(r: &mut Report, config: &Config, target: &Client) {
    let schema = walfold_store::Schema::new(&config.target.schema);
    let Ok(slots) = walfold_store::ingested_slots(target, &schema).await else {
        return;
    };
    for walfold_store::IngestedSlot { slot, lsn } in slots {
        if config.sources().iter().any(|s| s.slot == slot) {
            continue;
        }
        r.check(
            Level::Warn,
            format!("walfold ingested through slot {slot} (up to {lsn}), which no [[source]] uses now"),
            format!("if a source's slot was renamed by mistake, set it back; otherwise drop the old slot on its server (select pg_drop_replication_slot('{slot}')), which keeps WAL until it is dropped"),
        );
    }
}

/// walfold's connection budget on a target beside what the server allows and what
/// else is connected: a warning when the budget would not fit.
async fn connections(
    r: &mut Report,
    config: &Config,
    home: &walfold_engine::Target,
    target: &Client,
    on: &str,
) -> Result<(), CheckError> {
    let row = target
        .query_one(
            "select current_setting('max_connections')::int8 as max, \
             current_setting('superuser_reserved_connections')::int8 as reserved, \
             (select count(*) from pg_stat_activity where backend_type = 'client backend') as used, \
             (select count(*) from pg_stat_activity where backend_type = 'client backend' \
               and application_name like 'walfold%') as walfold",
            &[],
        )
        .await?;
    let row = row.of("pg_stat_activity");
    let (max, reserved, used, walfold): (i64, i64, i64, i64) = (
        row.col("max")?,
        row.col("reserved")?,
        row.col("used")?,
        row.col("walfold")?,
    );
    let budget = home.connection_budget(config) as i64;
    let allowed = max - reserved;
    // This doctor's own connection is among those in use.
    let others = (used - walfold - 1).max(0);
    let key = match &home.name {
        Some(name) => format!("targets.{name}.pool_size"),
        None => "target.pool_size".to_owned(),
    };
    let what = format!(
        "walfold takes at most {budget} connections{on} ({key} + {} of its own); the server \
         allows {allowed} ({max} - {reserved} reserved), {others} used by others now",
        budget - budget_pool(config, home)
    );
    if budget + others <= allowed {
        r.check(Level::Ok, what, "");
    } else {
        r.check(
            Level::Warn,
            what,
            format!("lower {key}, or raise max_connections (restart needed)"),
        );
    }
    Ok(())
}

fn budget_pool(config: &Config, home: &walfold_engine::Target) -> i64 {
    match &home.name {
        Some(name) => config.targets[name].pool_size as i64,
        None => config.target.pool_size as i64,
    }
}

/// The rights walfold needs on one target: its schema, and the tables of the
/// projections whose state lives there.
/// A role that may write walfold's own tables writes events (`event_log`) or makes
/// them apply again (`processed_message`, `checkpoint`): walfold grants nothing there,
/// so any such role other than walfold's was granted it by hand.
async fn schema_writers(
    r: &mut Report,
    target: &Client,
    schema: &str,
    on: &str,
) -> Result<(), CheckError> {
    let others: Vec<String> = target
        .query(
            "select distinct r.rolname::text from pg_roles r, pg_class c \
             where c.relnamespace = $1::text::regnamespace and c.relkind in ('r', 'p') \
             and r.rolcanlogin and not r.rolsuper and r.rolname <> current_user \
             and has_table_privilege(r.oid, c.oid, 'insert, update, delete, truncate') \
             order by 1",
            &[&walfold_config::quote_ident(schema)],
        )
        .await?
        .iter()
        .map(|row| row.of("pg_roles").col(0))
        .collect::<Result<_, _>>()?;
    if others.is_empty() {
        r.check(
            Level::Ok,
            format!("no role but walfold's (and superusers) may write its schema {schema}{on}"),
            "",
        );
    } else {
        r.check(
            Level::Warn,
            format!(
                "roles other than walfold's may write its schema {schema}{on}: {} (a row in \
                 event_log is an event; a claim or checkpoint changed applies events again)",
                others.join(", ")
            ),
            format!(
                "revoke insert, update, delete, truncate on all tables in schema {} from {}",
                walfold_config::quote_ident(schema),
                others.join(", ")
            ),
        );
    }
    Ok(())
}

/// How many of the latest events a projection's filters are compared with.
const FILTER_SAMPLE: i64 = 10_000;

/// A projection whose `event_types` or `aggregate_types` name none of what the log's
/// latest events carry applies nothing, silently: `OrderPlaced` against a log of
/// `order.placed`. Compared exactly, as the projector does.
async fn filters_meet_the_log(
    r: &mut Report,
    config: &Config,
    target: &Client,
) -> Result<(), CheckError> {
    let schema = walfold_engine::Target::main(config).schema;
    let log = schema.sql("{schema}.event_log");
    let exists: bool = target
        .query_one("select to_regclass($1) is not null", &[&log])
        .await?
        .of("pg_class")
        .col(0)?;
    if !exists {
        return Ok(());
    }
    let row = target
        .query_one(
            &schema.sql(
                "with latest as (select event_type, aggregate_type from {schema}.event_log \
                 order by seq desc limit $1) \
                 select array(select distinct event_type from latest order by 1) as events, \
                 array(select distinct aggregate_type from latest order by 1) as aggregates",
            ),
            &[&FILTER_SAMPLE],
        )
        .await?;
    let row = row.of("event_log");
    let seen: [(&str, Vec<String>); 2] = [
        ("event_types", row.col("events")?),
        ("aggregate_types", row.col("aggregates")?),
    ];
    for p in &config.projection {
        for (key, seen) in &seen {
            let wanted = match *key {
                "event_types" => &p.event_types,
                _ => &p.aggregate_types,
            };
            let Some(wanted) = wanted.as_ref().filter(|_| !seen.is_empty()) else {
                continue;
            };
            if wanted.iter().any(|w| seen.contains(w)) {
                continue;
            }
            let shown: Vec<&str> = seen.iter().take(10).map(String::as_str).collect();
            r.check(
                Level::Warn,
                format!(
                    "projection {}: none of its {key} ({}) is among those of the latest {} \
                     events in the log ({}{}): it applies none of them",
                    p.name,
                    wanted.join(", "),
                    FILTER_SAMPLE,
                    crate::text::escape_controls(&shown.join(", ")),
                    if seen.len() > shown.len() {
                        ", …"
                    } else {
                        ""
                    }
                ),
                format!(
                    "{key} compare exactly, case included: name them as the log does \
                     (`walfold events` shows them)"
                ),
            );
        }
    }
    Ok(())
}

async fn target_checks(
    r: &mut Report,
    config: &Config,
    home: &walfold_engine::Target,
    target: &Client,
) -> Result<(), CheckError> {
    let schema = home.schema.name();
    let on = if home.is_extra() {
        format!(" on target {}", home.label())
    } else {
        String::new()
    };
    // What `walfold run` does with the schema (`walfold_store::migrate`): create it if
    // missing (create on the database), then its tables (create in the schema).
    let access = walfold_store::schema_access(target, schema).await?;
    let role = walfold_config::quote_ident(&access.role);
    let what = if access.exists {
        format!("the target role {role} may create walfold's tables in its schema {schema}{on}")
    } else {
        format!("the target role {role} may create walfold's schema {schema}{on}")
    };
    match access.missing(schema) {
        None => r.check(Level::Ok, what, ""),
        Some(fix) => r.check(Level::Fail, what, fix),
    }
    connections(r, config, home, target, &on).await?;
    if access.exists {
        schema_writers(r, target, schema, &on).await?;
    }
    for p in home.projections(config) {
        let Some(t) = p.storage() else { continue };
        let row = target
            .query_one(
                "select to_regclass($1) is not null and has_table_privilege($1, 'select') \
                 and has_table_privilege($1, 'insert') and has_table_privilege($1, 'update')",
                &[&t.quoted()],
            )
            .await;
        let ok = row.is_ok_and(|r| r.of("pg_class").col::<bool>(0).unwrap_or(false));
        r.check(
            if ok { Level::Ok } else { Level::Fail },
            format!("projection {}: table {t} exists and is writable{on}", p.name),
            format!("create {t}, or grant select, insert, update (and delete if the projection deletes) on {t} to {role}"),
        );
        if !ok {
            continue;
        }
        // A rebuild creates the shadow table beside this one (with its foreign keys) and
        // swaps them by renaming: it needs `create` on the schema, `references` on the
        // tables its foreign keys point at, and to own the table (or be in its owner's
        // role).
        let rebuild = target
            .query_one(
                "select has_schema_privilege(c.relnamespace, 'create') as create, \
                 pg_has_role(c.relowner, 'usage') as owns, \
                 array(select k.confrelid::regclass::text from pg_constraint k \
                       where k.conrelid = c.oid and k.contype = 'f' \
                         and not has_table_privilege(k.confrelid, 'references')) as unreferenced \
                 from pg_class c where c.oid = $1::text::regclass",
                &[&t.quoted()],
            )
            .await?;
        let mut missing: Vec<String> = Vec::new();
        let rebuild = rebuild.of("pg_class");
        if !rebuild.col::<bool>("owns")? {
            missing.push(format!(
                "alter table {} owner to {role} (a rebuild renames it)",
                t.quoted()
            ));
        }
        if !rebuild.col::<bool>("create")? {
            missing.push(format!(
                "grant create on schema {} to {role}",
                walfold_config::quote_ident(&t.schema)
            ));
        }
        let unreferenced: Vec<String> = rebuild.col("unreferenced")?;
        if !unreferenced.is_empty() {
            missing.push(format!(
                "grant references on {} to {role} (its foreign keys)",
                unreferenced.join(", ")
            ));
        }
        r.check(
            if missing.is_empty() { Level::Ok } else { Level::Warn },
            format!("projection {}: the target role may rebuild {t} (create in its schema, own the table){on}", p.name),
            format!("{}; only `walfold rebuild` needs this", missing.join("; ")),
        );
    }
    Ok(())
}

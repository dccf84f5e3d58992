//! `walfold doctor`: checks the source and target for what walfold needs and what makes
//! CDC hurt a database (a slot holding WAL without limit, a lost slot, missing rights),
//! printing each check with ok/warn/fail and the fix. Exits 1 when a check fails.

use std::path::Path;

use tokio_postgres::Client;
use walfold_config::Config;

use crate::run::load;
use crate::Failure;

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
    let target = walfold_store::connect(config.target_url()).await.ok();
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
        match walfold_store::connect(&view.source().url).await {
            Ok(source) => {
                r.check(Level::Ok, format!("{what} reachable"), "");
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
                let checked = source_checks(r, &view, &source, target.as_ref(), max_retained_mb)
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
    match &target {
        Some(t) => {
            target_checks(r, config, &walfold_engine::Target::main(config), t)
                .await
                .map_err(Failure::runtime)?;
            abandoned_slots(r, config, t).await;
        }
        None => r.check(Level::Fail, "target unreachable", "check target.url"),
    }
    for t in walfold_engine::Target::all(config)
        .iter()
        .filter(|t| t.is_extra())
    {
        match walfold_store::connect(&t.url).await {
            Ok(c) => {
                r.check(Level::Ok, format!("target {} reachable", t.label()), "");
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

async fn setting(c: &Client, name: &str) -> Result<String, tokio_postgres::Error> {
    Ok(c.query_one("select current_setting($1)", &[&name])
        .await?
        .get(0))
}

/// The role and database a client is connected as, quoted where SQL needs it: what the
/// fixes name.
async fn connected_as(c: &Client) -> Result<(String, String), tokio_postgres::Error> {
    let row = c
        .query_one(
            "select quote_ident(current_user), quote_ident(current_database())",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

async fn source_checks(
    r: &mut Report,
    config: &Config,
    source: &Client,
    target: Option<&Client>,
    max_retained_mb: i64,
) -> Result<(), tokio_postgres::Error> {
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
    let (slots, used, senders, sending): (i32, i32, i32, i32) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
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
    let (role, _) = connected_as(source).await?;
    let replication: bool = source
        .query_one(
            "select rolreplication or rolsuper or exists (select 1 from pg_roles m \
             where m.rolname = 'rds_replication' and pg_has_role(current_user, m.oid, 'member')) \
             from pg_roles where rolname = current_user",
            &[],
        )
        .await?
        .get(0);
    r.check(
        if replication { Level::Ok } else { Level::Fail },
        "the source role may replicate",
        format!("alter role {role} replication (on RDS/Aurora: grant rds_replication to {role})"),
    );

    // Outbox tables and the publication: what `walfold run` refuses is a FAIL here.
    let publication = &config.source().publication;
    let shape = walfold_source::inspect(source, config).await?;
    for refusal in shape.refusals.iter().chain(&shape.missing_columns) {
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
        .is_some_and(|row| row.get(0));
    for (o, t) in config.table_outboxes() {
        let exists: bool = source
            .query_one("select to_regclass($1) is not null", &[&t.quoted()])
            .await?
            .get(0);
        if !exists {
            continue;
        }
        r.check(Level::Ok, format!("outbox table {t} exists"), "");
        let occurred_at: Option<String> = source
            .query_opt(
                "select format_type(atttypid, atttypmod) from pg_attribute \
                 where attrelid = $1::text::regclass and attname = $2 and not attisdropped",
                &[&t.quoted(), &o.occurred_at],
            )
            .await?
            .map(|row| row.get(0));
        if occurred_at.as_deref() == Some("timestamp without time zone") {
            r.check(
                Level::Warn,
                format!(
                    "{t}.{}: timestamp without time zone, read as UTC",
                    o.occurred_at
                ),
                "write UTC times into it, or make it timestamptz",
            );
        }
        let select: bool = source
            .query_one("select has_table_privilege($1, 'select')", &[&t.quoted()])
            .await?
            .get(0);
        r.check(
            if select { Level::Ok } else { Level::Warn },
            format!("the source role may read {t} (needed by `walfold backfill` only)"),
            format!("grant select on {t} to {role}"),
        );
        if updates_or_deletes {
            let identity: String = source
                .query_one(
                    "select relreplident::text from pg_class where oid = $1::text::regclass",
                    &[&t.quoted()],
                )
                .await?
                .get(0);
            r.check(
                if identity == "n" { Level::Fail } else { Level::Ok },
                format!("{t}: replica identity {identity} (the publication publishes updates/deletes)"),
                format!("publish only inserts (alter publication {publication} set (publish = 'insert, truncate')), or give {t} a primary key"),
            );
        }
    }
    let message_outboxes: Vec<_> = config
        .outbox
        .iter()
        .filter(|o| o.message_prefix.is_some())
        .collect();
    let version: i32 = if message_outboxes.is_empty() {
        0
    } else {
        source
            .query_one("select current_setting('server_version_num')::int", &[])
            .await?
            .get(0)
    };
    for o in message_outboxes {
        r.check(
            if version >= 140000 { Level::Ok } else { Level::Fail },
            format!(
                "{}: transactional messages under this prefix are events (the server sends them from PostgreSQL 14)",
                o.describe()
            ),
            "upgrade the source to PostgreSQL 14 or later, or write events to an outbox table",
        );
    }
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
        _ => "if it is gone, see README, Operations: a lost slot".to_owned(),
    };
    if !shape.publication_exists && read_from {
        r.check(
            Level::Fail,
            format!("publication {publication} does not exist, and walfold has read slot {} through {}", config.source().slot, read_through.as_deref().unwrap_or("another")),
            format!("walfold will not create it: a publication created now is not there for the changes the slot holds; {back}"),
        );
    } else if !shape.publication_exists {
        r.check(
            Level::Warn,
            format!("publication {publication} does not exist"),
            "walfold creates it on start (needs create on the database and ownership of the outbox tables), or create it as their owner",
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
            r.check(
                Level::Warn,
                format!("publication {publication} lacks {}", missing.join(", ")),
                "walfold adds them on start (needs ownership of the tables), or add them as their owner",
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
            let (active, wal_status, retained, plugin): (bool, Option<String>, Option<i64>, Option<String>) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            if plugin.as_deref() != Some("pgoutput") {
                r.check(Level::Fail, format!("slot {slot} uses plugin {plugin:?}"), "choose another source.slot, or drop this slot");
            }
            match wal_status.as_deref() {
                Some("lost") => r.check(
                    Level::Fail,
                    format!("slot {slot} is invalidated (wal_status = lost)"),
                    "WAL it needed was removed: events may be missing; see README, Operations: a lost slot",
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
        }
    }
    Ok(())
}

/// Slots walfold ingested through that no source of the config uses any more (a
/// source's slot renamed, a source removed): on its server such a slot keeps WAL.
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

/// The rights walfold needs on one target: its schema, and the tables of the
/// projections whose state lives there.
async fn target_checks(
    r: &mut Report,
    config: &Config,
    home: &walfold_engine::Target,
    target: &Client,
) -> Result<(), tokio_postgres::Error> {
    let schema = home.schema.name();
    let on = if home.is_extra() {
        format!(" on target {}", home.label())
    } else {
        String::new()
    };
    let (role, database) = connected_as(target).await?;
    let row = target
        .query_one(
            "select exists (select 1 from pg_namespace where nspname = $1), \
             has_database_privilege(current_database(), 'create'), \
             coalesce((select has_schema_privilege(oid, 'create') from pg_namespace where nspname = $1), false)",
            &[&schema],
        )
        .await?;
    let (exists, db_create, schema_create): (bool, bool, bool) =
        (row.get(0), row.get(1), row.get(2));
    r.check(
        if (exists && schema_create) || (!exists && db_create) { Level::Ok } else { Level::Fail },
        format!("the target role may create walfold's schema {schema} and its tables{on}"),
        format!("grant create on database {database} to {role} (or create schema {schema} authorization {role})"),
    );
    for p in home.projections(config) {
        let Some(t) = p.storage() else { continue };
        let row = target
            .query_one(
                "select to_regclass($1) is not null and has_table_privilege($1, 'select') \
                 and has_table_privilege($1, 'insert') and has_table_privilege($1, 'update')",
                &[&t.quoted()],
            )
            .await;
        let ok = row.map(|r| r.get::<_, bool>(0)).unwrap_or(false);
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
        if !rebuild.get::<_, bool>("owns") {
            missing.push(format!(
                "alter table {} owner to {role} (a rebuild renames it)",
                t.quoted()
            ));
        }
        if !rebuild.get::<_, bool>("create") {
            missing.push(format!(
                "grant create on schema {} to {role}",
                walfold_config::quote_ident(&t.schema)
            ));
        }
        let unreferenced: Vec<String> = rebuild.get("unreferenced");
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

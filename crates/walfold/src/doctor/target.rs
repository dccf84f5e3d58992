//! Doctor's checks of one target: the rights walfold needs there (its schema, the
//! tables of the projections whose state lives there, and to rebuild them), its
//! connection budget beside what the server allows, and who else may write its schema.

use tokio_postgres::Client;
use walfold_config::{quote_ident, Config, QualifiedName};
use walfold_engine::Target;
use walfold_store::target_shape::{self, Connections, TableAccess};
use walfold_store::{SchemaAccess, StoreError};

use super::finding::{Finding, Level};

/// A target as its checks read it.
struct Facts {
    access: SchemaAccess,
    connections: Connections,
    /// Roles other than walfold's that may write its schema (when the schema exists).
    writers: Option<Vec<String>>,
    /// Each projection's table here, by projection.
    tables: Vec<(String, QualifiedName, TableAccess)>,
}

async fn read(config: &Config, home: &Target, client: &Client) -> Result<Facts, StoreError> {
    let schema = home.schema.name();
    let access = walfold_store::schema_access(client, schema).await?;
    let connections = target_shape::connections(client).await?;
    let writers = match access.exists {
        true => Some(target_shape::schema_writers(client, schema).await?),
        false => None,
    };
    let mut tables = Vec::new();
    for p in home.projections(config) {
        let Some(t) = p.storage() else { continue };
        let access = target_shape::table_access(client, &t).await?;
        tables.push((p.name.clone(), t, access));
    }
    Ok(Facts {
        access,
        connections,
        writers,
        tables,
    })
}

/// Every check of target `home`, reached through `client`.
pub(super) async fn checks(
    config: &Config,
    home: &Target,
    client: &Client,
    instances: Option<i64>,
) -> Result<Vec<Finding>, StoreError> {
    let facts = read(config, home, client).await?;
    let on = if home.is_extra() {
        format!(" on target {}", home.label())
    } else {
        String::new()
    };
    let schema = home.schema.name();
    let mut found = vec![
        schema_rights(&facts.access, schema, &on),
        connections(config, home, &facts.connections, instances, &on),
    ];
    if let Some(others) = &facts.writers {
        found.push(schema_writers(others, schema, &on));
    }
    let role = quote_ident(&facts.access.role);
    for (name, t, access) in &facts.tables {
        found.extend(projection_table(name, t, access, &role, &on));
    }
    Ok(found)
}

/// What `walfold run` does with the schema (`walfold_store::migrate`): create it if
/// missing (create on the database), then its tables (create in the schema).
fn schema_rights(access: &SchemaAccess, schema: &str, on: &str) -> Finding {
    let role = quote_ident(&access.role);
    let what = if access.exists {
        format!("the target role {role} may create walfold's tables in its schema {schema}{on}")
    } else {
        format!("the target role {role} may create walfold's schema {schema}{on}")
    };
    match access.missing(schema) {
        None => Finding::ok(what),
        Some(fix) => Finding::fail(what, fix),
    }
}

/// walfold's connection budget on a target beside what the server allows and what
/// else is connected: a warning when the budget would not fit.
fn connections(
    config: &Config,
    home: &Target,
    c: &Connections,
    instances: Option<i64>,
    on: &str,
) -> Finding {
    let budget = home.connection_budget(config) as i64;
    let n = instances.unwrap_or(0).max(1);
    let allowed = c.max - c.reserved;
    // This doctor's own connection is among those in use.
    let others = (c.used - c.walfold - 1).max(0);
    let (key, pool) = match &home.name {
        Some(name) => (
            format!("targets.{name}.pool_size"),
            config.targets[name].pool_size as i64,
        ),
        None => (
            "target.pool_size".to_owned(),
            config.target.pool_size as i64,
        ),
    };
    let running = match instances {
        Some(n) if n > 1 => format!(", {} for the {n} instances running now", n * budget),
        _ => String::new(),
    };
    let what = format!(
        "walfold takes at most {budget} connections{on} ({key} + {} of its own) per \
         instance{running}; the server allows {allowed} ({} - {} reserved), {others} used by \
         others now",
        budget - pool,
        c.max,
        c.reserved
    );
    // The instances running now are among those in use: only their budget's rest counts.
    Finding::unless(
        n * budget + others <= allowed,
        Level::Warn,
        what,
        format!("lower {key}, or raise max_connections (restart needed)"),
    )
}

/// A role that may write walfold's own tables writes events (`event_log`) or makes
/// them apply again (`processed_message`, `checkpoint`): walfold grants nothing there,
/// so any such role other than walfold's was granted it by hand.
fn schema_writers(others: &[String], schema: &str, on: &str) -> Finding {
    if others.is_empty() {
        return Finding::ok(format!(
            "no role but walfold's (and superusers) may write its schema {schema}{on}"
        ));
    }
    Finding::warn(
        format!(
            "roles other than walfold's may write its schema {schema}{on}: {} (a row in \
             event_log is an event; a claim or checkpoint changed applies events again)",
            others.join(", ")
        ),
        format!(
            "revoke insert, update, delete, truncate on all tables in schema {} from {}",
            quote_ident(schema),
            others.join(", ")
        ),
    )
}

/// A projection's table: writable, and what a rebuild needs (it creates the shadow
/// table beside this one, with its foreign keys, and swaps them by renaming: `create`
/// on the schema, `references` on the tables its foreign keys point at, and to own the
/// table or be in its owner's role).
fn projection_table(
    projection: &str,
    t: &QualifiedName,
    access: &TableAccess,
    role: &str,
    on: &str,
) -> Vec<Finding> {
    let writable = Finding::unless(
        access.writable,
        Level::Fail,
        format!("projection {projection}: table {t} exists and is writable{on}"),
        format!("create {t}, or grant select, insert, update (and delete if the projection deletes) on {t} to {role}"),
    );
    let Some(rebuild) = &access.rebuild else {
        return vec![writable];
    };
    let mut missing: Vec<String> = Vec::new();
    if !rebuild.owns {
        missing.push(format!(
            "alter table {} owner to {role} (a rebuild renames it)",
            t.quoted()
        ));
    }
    if !rebuild.create {
        missing.push(format!(
            "grant create on schema {} to {role}",
            quote_ident(&t.schema)
        ));
    }
    if !rebuild.unreferenced.is_empty() {
        missing.push(format!(
            "grant references on {} to {role} (its foreign keys)",
            rebuild.unreferenced.join(", ")
        ));
    }
    vec![
        writable,
        Finding::unless(
            missing.is_empty(),
            Level::Warn,
            format!("projection {projection}: the target role may rebuild {t} (create in its schema, own the table){on}"),
            format!("{}; only `walfold rebuild` needs this", missing.join("; ")),
        ),
    ]
}

//! Who can write an outbox's events: for a table outbox, whoever may insert into the
//! table; for a message outbox, whoever may execute `pg_logical_emit_message`, which
//! PostgreSQL grants to PUBLIC unless it is revoked. walfold refuses a message outbox
//! that any role can write to, unless the config accepts that (`allow_public_emit`).

use tokio_postgres::Client;
use walfold_config::OutboxConfig;
use walfold_pg::RowExt;
use walfold_store::StoreError;

use crate::error::Refusal;

/// `$select` over `writable`: the relations through which a row lands in table `$1`
/// (quoted): the table, its partitions (at any depth), and the automatically updatable
/// views on any of them or on such a view, at any depth (an insert into one is checked
/// against the relation below as the view's owner, whoever inserts). A view's rewrite
/// rule depends (`pg_depend`) on the relations it reads.
macro_rules! concat_insert {
    ($select:literal) => {
        concat!(
            "with recursive parts(oid) as (select $1::text::regclass::oid \
             union select i.inhrelid from pg_inherits i join parts p on i.inhparent = p.oid), \
             views(oid) as (select w.ev_class from pg_rewrite w \
               join pg_depend d on d.classid = 'pg_rewrite'::regclass and d.objid = w.oid \
               join parts p on d.refobjid = p.oid \
               where w.ev_class not in (select oid from parts) \
               and pg_relation_is_updatable(w.ev_class, false) & 8 = 8 \
             union select w.ev_class from pg_rewrite w \
               join pg_depend d on d.classid = 'pg_rewrite'::regclass and d.objid = w.oid \
               join views v on d.refobjid = v.oid \
               where w.ev_class <> v.oid \
               and pg_relation_is_updatable(w.ev_class, false) & 8 = 8), \
             writable(oid) as (select oid from parts union select oid from views) ",
            $select
        )
    };
}

/// The overloads of `pg_catalog.pg_logical_emit_message` (two before PostgreSQL 17, with a
/// fourth argument from 17 on: read from `pg_proc`, never assumed), as
/// `pg_logical_emit_message(boolean, text, text)`, and whether PUBLIC may execute each.
const EMIT_FUNCTIONS: &str =
    "select 'pg_logical_emit_message(' || oidvectortypes(p.proargtypes) || ')' as signature, \
     has_function_privilege('public', p.oid, 'execute') as public \
     from pg_proc p where p.proname = 'pg_logical_emit_message' \
     and p.pronamespace = 'pg_catalog'::regnamespace order by p.oid";

/// The login roles, other than superusers, that may execute an overload of
/// `pg_logical_emit_message`.
const EMITTERS: &str = "select r.rolname::text from pg_roles r \
     where r.rolcanlogin and not r.rolsuper and exists (select from pg_proc p \
       where p.proname = 'pg_logical_emit_message' and p.pronamespace = 'pg_catalog'::regnamespace \
       and has_function_privilege(r.oid, p.oid, 'execute')) order by 1";

/// The login roles, other than superusers, that may insert into the table `$1` (quoted)
/// through any relation of `writable` ([`concat_insert`]), by a grant on the relation or on any of its columns.
const INSERTERS: &str = concat_insert!(
    "select r.rolname::text from pg_roles r \
     where r.rolcanlogin and not r.rolsuper and exists (select from writable w \
       where has_any_column_privilege(r.oid, w.oid, 'insert')) order by 1"
);

/// Whether PUBLIC may insert into the table `$1` (quoted) through any relation of `writable` ([`concat_insert`]).
const PUBLIC_INSERTS: &str = concat_insert!(
    "select exists (select from writable w \
       where has_any_column_privilege('public', w.oid, 'insert')) as public"
);

/// The views through which a row lands in table `$1` (quoted), as `schema.name`.
const WRITABLE_VIEWS: &str = concat_insert!(
    "select n.nspname || '.' || c.relname as view from writable w \
     join pg_class c on c.oid = w.oid join pg_namespace n on n.oid = c.relnamespace \
     where c.relkind = 'v' order by 1"
);

/// Security-definer functions outside extensions whose body names a relation of
/// `writable` ([`concat_insert`]: the table `$1`, a partition, a view on it or on such a
/// view) that their owner may insert into: whoever may call one writes the outbox's
/// events through it, with its owner's rights. A trigger function runs for whoever
/// writes the tables whose triggers call it. `names`: the relation named (the table
/// when the body names it).
const DEFINERS: &str = concat_insert!(
    ", named(proc, relation, direct) as (select p.oid, n.nspname || '.' || c.relname, \
       w.oid = $1::text::regclass::oid from pg_proc p, writable w \
       join pg_class c on c.oid = w.oid join pg_namespace n on n.oid = c.relnamespace \
       where p.prosecdef and strpos(lower(p.prosrc), lower(c.relname)) > 0 \
       and has_any_column_privilege(p.proowner, w.oid, 'insert')) \
     select p.oid::regprocedure::text as function, \
     pg_get_userbyid(p.proowner)::text as owner, \
     has_function_privilege('public', p.oid, 'execute') as public, \
     array(select r.rolname::text from pg_roles r where r.rolcanlogin and not r.rolsuper \
       and r.oid <> p.proowner and has_function_privilege(r.oid, p.oid, 'execute') \
       order by 1) as callers, \
     array(select distinct t.tgrelid::regclass::text from pg_trigger t \
       where t.tgfoid = p.oid and not t.tgisinternal order by 1) as tables, \
     (select m.relation from named m where m.proc = p.oid \
      order by m.direct desc, m.relation limit 1) as names, \
     exists (select from named m where m.proc = p.oid and m.direct) as direct \
     from pg_proc p \
     where exists (select from named m where m.proc = p.oid) \
     and not exists (select from pg_depend d where d.classid = 'pg_proc'::regclass \
       and d.objid = p.oid and d.deptype = 'e') \
     order by 1"
);

/// A security-definer function that may write a table outbox's events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definer {
    /// `schema.name(argument types)`.
    pub function: String,
    pub owner: String,
    /// PUBLIC may call it: any role writes events through it.
    pub public: bool,
    /// The login roles other than its owner and superusers that may call it.
    pub callers: Vec<String>,
    /// The tables whose triggers call it.
    pub triggers_on: Vec<String>,
    /// The relation its body names, when that is not the outbox table itself: a
    /// partition, or a view on it (or on such a view) that writes rows into it.
    pub through: Option<String>,
}

/// The security-definer functions that write into `table` (quoted), found by their body
/// naming it or a relation that writes into it (a partition, a view, a view on a view):
/// what `inserters` cannot see. A function that builds the name at run time is not
/// found.
pub async fn definers(source: &Client, table: &str) -> Result<Vec<Definer>, StoreError> {
    source
        .query(DEFINERS, &[&table])
        .await
        .map_err(StoreError::db(
            "reading the functions that may write events",
        ))?
        .iter()
        .map(|r| {
            let r = r.of("pg_proc");
            Ok(Definer {
                function: r.col("function")?,
                owner: r.col("owner")?,
                public: r.col("public")?,
                callers: r.col("callers")?,
                triggers_on: r.col("tables")?,
                through: match r.col::<bool>("direct")? {
                    true => None,
                    false => r.col("names")?,
                },
            })
        })
        .collect()
}

/// What the source's grants let any role do to the configured message outboxes: a
/// refusal for those that do not accept it, a warning for those that do.
#[derive(Debug, Default)]
pub(crate) struct PublicEmit {
    pub(crate) refusal: Option<Refusal>,
    pub(crate) warnings: Vec<String>,
}

/// Checks `pg_logical_emit_message`'s grants when `outboxes` has message outboxes.
pub(crate) async fn public_emit(
    source: &Client,
    outboxes: impl Iterator<Item = &OutboxConfig>,
    heartbeats: bool,
) -> Result<PublicEmit, StoreError> {
    let mut found = PublicEmit::default();
    let messages: Vec<&OutboxConfig> = outboxes.filter(|o| o.message_prefix.is_some()).collect();
    if messages.is_empty() {
        return Ok(found);
    }
    let grants = emit_grants(source).await?;
    if !grants.public {
        return Ok(found);
    }
    let fix = lock_down(
        &grants.functions,
        grants.role.as_deref().filter(|_| heartbeats),
    );
    let (accepted, refused): (Vec<&OutboxConfig>, Vec<&OutboxConfig>) =
        messages.into_iter().partition(|o| o.allow_public_emit);
    for o in accepted {
        found.warnings.push(format!(
            "any role that may log in to the source database can write events into {}: \
             pg_logical_emit_message is executable by PUBLIC, and allow_public_emit = true \
             accepts that. To allow only the producer: {fix}",
            o.describe()
        ));
    }
    if !refused.is_empty() {
        let names: Vec<String> = refused.iter().map(|o| o.describe()).collect();
        let prefixes: Vec<String> = refused
            .iter()
            .filter_map(|o| o.message_prefix.as_deref())
            .map(|p| format!("message_prefix = {p:?}"))
            .collect();
        found.refusal = Some(Refusal {
            problem: format!(
                "pg_logical_emit_message is executable by PUBLIC: any role that may log in to \
                 the source database can write events into {}",
                names.join(", ")
            ),
            fix: format!(
                "{fix}; or, to accept events from any role, set allow_public_emit = true on the \
                 [[outbox]] with {}",
                prefixes.join(", ")
            ),
        });
    }
    Ok(found)
}

/// The statements that leave `pg_logical_emit_message` to the producer (and to walfold's
/// own `role`, whose heartbeats call it).
fn lock_down(functions: &[String], role: Option<&str>) -> String {
    let list = functions.join(", ");
    let to = match role {
        Some(role) => format!(
            "<producing role>, {} (walfold's heartbeats; or set source.heartbeat_interval_s = 0)",
            walfold_config::quote_ident(role)
        ),
        None => "<producing role>".to_owned(),
    };
    format!(
        "as a superuser, revoke execute on function {list} from public; then grant execute on \
         function {list} to {to}"
    )
}

/// `pg_logical_emit_message` on the source: what locking it down to the producer names.
#[derive(Debug, Clone)]
pub struct EmitGrants {
    /// Its overloads, as `pg_logical_emit_message(boolean, text, text)`.
    pub functions: Vec<String>,
    /// Whether PUBLIC may execute one of them now.
    pub public: bool,
    /// The role connected (walfold's source role), unless it is a superuser: only then
    /// do its heartbeats need a grant.
    pub role: Option<String>,
}

/// Reads [`EmitGrants`] (`walfold run`'s check, `walfold init`'s statements).
pub async fn emit_grants(source: &Client) -> Result<EmitGrants, StoreError> {
    let (functions, public) = emit_functions(source).await?;
    let row = source
        .query_one(
            "select current_user::text, rolsuper from pg_roles where rolname = current_user",
            &[],
        )
        .await
        .map_err(StoreError::db("reading the source role"))?;
    let row = row.of("pg_roles");
    let (role, superuser): (String, bool) = (row.col(0)?, row.col(1)?);
    Ok(EmitGrants {
        functions,
        public,
        role: (!superuser).then_some(role),
    })
}

/// The overloads of `pg_logical_emit_message`, and whether PUBLIC may execute one.
async fn emit_functions(source: &Client) -> Result<(Vec<String>, bool), StoreError> {
    let rows = source
        .query(EMIT_FUNCTIONS, &[])
        .await
        .map_err(StoreError::db("reading pg_logical_emit_message's grants"))?;
    let mut functions = Vec::with_capacity(rows.len());
    let mut public = false;
    for row in &rows {
        let row = row.of("pg_proc");
        public |= row.col::<bool>("public")?;
        functions.push(row.col::<String>("signature")?);
    }
    Ok((functions, public))
}

/// Who can write an outbox's events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writers {
    /// Any role at all: PUBLIC has the right.
    pub public: bool,
    /// The login roles that have it, superusers aside (who have every right).
    pub roles: Vec<String>,
    /// For a table outbox: the automatically updatable views through which a row lands
    /// in it (their grants count, checked against the table as the view's owner).
    pub views: Vec<String>,
}

/// Who may execute `pg_logical_emit_message`: who can write a message outbox's events.
pub async fn emitters(source: &Client) -> Result<Writers, StoreError> {
    let (_, public) = emit_functions(source).await?;
    Ok(Writers {
        public,
        roles: roles(source, EMITTERS, &[]).await?,
        views: Vec::new(),
    })
}

/// Who may insert into `table` (quoted): who can write a table outbox's events.
pub async fn inserters(source: &Client, table: &str) -> Result<Writers, StoreError> {
    let public = source
        .query_one(PUBLIC_INSERTS, &[&table])
        .await
        .map_err(StoreError::db("reading the outbox's grants"))?
        .of("pg_class")
        .col("public")?;
    let views = source
        .query(WRITABLE_VIEWS, &[&table])
        .await
        .map_err(StoreError::db("reading the outbox's views"))?
        .iter()
        .map(|r| r.of("pg_class").col("view"))
        .collect::<Result<_, _>>()?;
    Ok(Writers {
        public,
        roles: roles(source, INSERTERS, &[&table]).await?,
        views,
    })
}

async fn roles(
    source: &Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<String>, StoreError> {
    source
        .query(sql, params)
        .await
        .map_err(StoreError::db("reading who may write events"))?
        .iter()
        .map(|r| Ok(r.of("pg_roles").col(0)?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fix_names_every_overload_and_walfolds_role() {
        let functions = [
            "pg_logical_emit_message(boolean, text, text)".to_owned(),
            "pg_logical_emit_message(boolean, text, bytea)".to_owned(),
        ];
        let fix = lock_down(&functions, Some("walfold_repl"));
        assert!(fix.contains(
            "revoke execute on function pg_logical_emit_message(boolean, text, text), \
             pg_logical_emit_message(boolean, text, bytea) from public; then grant execute on \
             function pg_logical_emit_message(boolean, text, text), \
             pg_logical_emit_message(boolean, text, bytea) to <producing role>, \"walfold_repl\""
        ));
        assert!(!lock_down(&functions, None).contains("heartbeat"));
    }
}

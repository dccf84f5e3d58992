//! What a rebuild does to the read model's own tables: create the shadow table from the
//! live one, swap them, drop the one left over. These tables are named by the config,
//! so the DDL is built at run time from validated, quoted names and from what the
//! catalog returns (keywords, `regclass`/`regrole` output, deparsed expressions); the
//! catalog reads themselves are constant statements with bound parameters.

use tokio_postgres::GenericClient;
use walfold_config::{quote_ident, QualifiedName};

use crate::error::StoreError;
use crate::refusal::Refusal;
use walfold_pg::RowExt;

/// Whether the table `$1` (quoted) exists.
const EXISTS: &str = "select to_regclass($1) is not null as found";

/// The views, foreign keys from other tables and triggers that would stay with table
/// `$1` (quoted) through a rename, as lists of names (null: none).
const DEPENDENTS: &str = "select \
       (select string_agg(distinct r.ev_class::regclass::text, ', ') from pg_depend d \
        join pg_rewrite r on r.oid = d.objid \
        where d.refobjid = $1::text::regclass and r.ev_class <> $1::text::regclass) as views, \
       (select string_agg(conname || ' on ' || conrelid::regclass::text, ', ') \
        from pg_constraint where contype = 'f' and confrelid = $1::text::regclass) \
         as foreign_keys, \
       (select string_agg(tgname, ', ') from pg_trigger \
        where tgrelid = $1::text::regclass and not tgisinternal) as triggers";

/// Table `$1`'s grants to roles other than its owner.
const GRANTS: &str = "select a.privilege_type, \
     case when a.grantee = 0 then 'public' else a.grantee::regrole::text end as grantee \
     from pg_class c, aclexplode(c.relacl) a \
     where c.oid = $1::text::regclass and a.grantee <> c.relowner";

/// Table `$1`'s foreign keys, by name.
const FOREIGN_KEYS: &str = "select conname::text as name, pg_get_constraintdef(oid) as definition \
     from pg_constraint where conrelid = $1::text::regclass and contype = 'f' order by conname";

/// Whether table `$1` has row-level security enabled, and forced.
const ROW_SECURITY: &str = "select relrowsecurity as enabled, relforcerowsecurity as forced \
     from pg_class where oid = $1::text::regclass";

/// The policies of table `$2` in schema `$1`, with their roles quoted.
const POLICIES: &str = "select policyname::text as name, permissive, \
     array(select case when r = 'public' then 'public' else quote_ident(r) end \
           from unnest(roles) r)::text[] as roles, cmd, qual, with_check \
     from pg_policies where schemaname = $1 and tablename = $2 order by policyname";

/// The sequences table `$1` owns, with the owning column, where table `$2` has a column
/// of that name.
const OWNED_SEQUENCES: &str =
    "select d.objid::regclass::text as sequence, a.attname::text as owning_column \
     from pg_depend d \
     join pg_class c on c.oid = d.objid and c.relkind = 'S' \
     join pg_attribute a on a.attrelid = d.refobjid and a.attnum = d.refobjsubid \
     where d.classid = 'pg_class'::regclass and d.refclassid = 'pg_class'::regclass \
       and d.refobjid = to_regclass($1) and d.deptype = 'a' \
       and exists (select 1 from pg_attribute t where t.attrelid = to_regclass($2) \
                   and t.attname = a.attname and not t.attisdropped)";

/// A sibling table name, `live` + `suffix`, refused when it would not fit in 63 bytes.
pub(super) fn sibling(live: &QualifiedName, suffix: &str) -> Result<QualifiedName, StoreError> {
    let name = format!("{}{suffix}", live.name);
    if name.len() > 63 {
        return Err(Refusal::NameTooLong {
            name,
            live: live.clone(),
        }
        .into());
    }
    Ok(QualifiedName {
        schema: live.schema.clone(),
        name,
    })
}

async fn exists(tx: &impl GenericClient, table: &QualifiedName) -> Result<bool, StoreError> {
    Ok(tx
        .query_one(EXISTS, &[&table.quoted()])
        .await
        .map_err(StoreError::db("looking up a table"))?
        .of("pg_class")
        .col("found")?)
}

/// Creates `shadow` from `live`'s definition, with what `like … including all` leaves
/// out (grants, foreign keys, row security and policies), after checking that `live`
/// exists, that the names `shadow` and `retired` are free, and that nothing a rename
/// would leave behind depends on `live`.
pub(super) async fn create_shadow(
    tx: &impl GenericClient,
    live: &QualifiedName,
    shadow: &QualifiedName,
    retired: &QualifiedName,
) -> Result<(), StoreError> {
    if !exists(tx, live).await? {
        return Err(Refusal::NoLiveTable { live: live.clone() }.into());
    }
    for t in [shadow, retired] {
        if exists(tx, t).await? {
            return Err(Refusal::NameTaken { table: t.clone() }.into());
        }
    }
    refuse_dependents(tx, live).await?;
    // The switch-over renames the live table, which only its owner may: found out here,
    // not after a replay of hours.
    let row = tx
        .query_one(
            "select pg_has_role(relowner, 'usage') as owns, current_user::text as role \
             from pg_class where oid = $1::text::regclass",
            &[&live.quoted()],
        )
        .await
        .map_err(StoreError::db("reading the live table's owner"))?;
    let row = row.of("pg_class");
    if !row.col::<bool>("owns")? {
        let role: String = row.col("role")?;
        return Err(Refusal::NotOwner {
            role,
            live: live.clone(),
        }
        .into());
    }
    tx.batch_execute(&format!(
        "create table {} (like {} including all)",
        shadow.quoted(),
        live.quoted()
    ))
    .await
    .map_err(StoreError::db("creating the shadow table"))?;
    copy_grants(tx, live, shadow).await?;
    copy_constraints_and_policies(tx, live, shadow).await
}

/// Locks both tables for the swap. Readers of the live table wait for this transaction
/// only; a reader that holds the table for longer makes the switch time out and be
/// tried again.
pub(super) async fn lock_for_swap(
    tx: &impl GenericClient,
    live: &QualifiedName,
    shadow: &QualifiedName,
) -> Result<(), StoreError> {
    tx.batch_execute(&format!(
        "set local lock_timeout = '5s'; lock table {}, {} in access exclusive mode;",
        live.quoted(),
        shadow.quoted(),
    ))
    .await
    .map_err(StoreError::db("locking the live and shadow tables"))
}

/// The live table takes the retired table's name, the shadow table the live one's.
pub(super) async fn swap(
    tx: &impl GenericClient,
    live: &QualifiedName,
    shadow: &QualifiedName,
    retired: &QualifiedName,
) -> Result<(), StoreError> {
    tx.batch_execute(&format!(
        "alter table {l} rename to {r}; alter table {sh} rename to {ln};",
        l = live.quoted(),
        sh = shadow.quoted(),
        r = quote_ident(&retired.name),
        ln = quote_ident(&live.name),
    ))
    .await
    .map_err(StoreError::db("swapping the live and shadow tables"))
}

pub(super) async fn drop_table(
    tx: &impl GenericClient,
    table: &QualifiedName,
) -> Result<(), tokio_postgres::Error> {
    tx.batch_execute(&format!("drop table if exists {}", table.quoted()))
        .await
}

/// Makes `to` own the sequences `from` owns (by column name), so dropping `from` keeps
/// the sequences that `to`'s defaults use (`like … including all` copies a `serial`
/// column's default, which names the original sequence).
pub(super) async fn hand_over_sequences(
    tx: &impl GenericClient,
    from: &QualifiedName,
    to: &QualifiedName,
) -> Result<(), StoreError> {
    let rows = tx
        .query(OWNED_SEQUENCES, &[&from.quoted(), &to.quoted()])
        .await
        .map_err(StoreError::db("reading the retired table's sequences"))?;
    for r in rows {
        // `regclass` output is already quoted where needed.
        let r = r.of("pg_depend");
        let (sequence, column): (String, String) = (r.col("sequence")?, r.col("owning_column")?);
        tx.batch_execute(&format!(
            "alter sequence {sequence} owned by {}.{}",
            to.quoted(),
            quote_ident(&column)
        ))
        .await
        .map_err(StoreError::db("handing a sequence to the live table"))?;
    }
    Ok(())
}

/// Gives the shadow table what `like … including all` leaves out and a rename would
/// otherwise drop from the live read model: foreign keys to other tables, and row-level
/// security with its policies.
async fn copy_constraints_and_policies(
    tx: &impl GenericClient,
    live: &QualifiedName,
    shadow: &QualifiedName,
) -> Result<(), StoreError> {
    let db = StoreError::db("copying foreign keys and policies to the shadow table");
    let fks = tx
        .query(FOREIGN_KEYS, &[&live.quoted()])
        .await
        .map_err(StoreError::db("reading the live table's foreign keys"))?;
    let mut ddl = String::new();
    for r in fks {
        let r = r.of("pg_constraint");
        let (name, definition): (String, String) = (r.col("name")?, r.col("definition")?);
        ddl.push_str(&format!(
            "alter table {} add constraint {} {definition};\n",
            shadow.quoted(),
            quote_ident(&name)
        ));
    }
    let rls = tx
        .query_one(ROW_SECURITY, &[&live.quoted()])
        .await
        .map_err(StoreError::db("reading the live table's row security"))?;
    let rls = rls.of("pg_class");
    let (enabled, forced): (bool, bool) = (rls.col("enabled")?, rls.col("forced")?);
    if enabled {
        ddl.push_str(&format!(
            "alter table {} enable row level security;\n",
            shadow.quoted()
        ));
    }
    if forced {
        ddl.push_str(&format!(
            "alter table {} force row level security;\n",
            shadow.quoted()
        ));
    }
    let policies = tx
        .query(POLICIES, &[&live.schema, &live.name])
        .await
        .map_err(StoreError::db("reading the live table's policies"))?;
    for r in policies {
        let r = r.of("pg_policies");
        let (name, permissive, roles, cmd): (String, String, Vec<String>, String) = (
            r.col("name")?,
            r.col("permissive")?,
            r.col("roles")?,
            r.col("cmd")?,
        );
        let (qual, check): (Option<String>, Option<String>) =
            (r.col("qual")?, r.col("with_check")?);
        // All from the catalog: keywords, quoted role names and deparsed expressions.
        ddl.push_str(&format!(
            "create policy {} on {} as {permissive} for {cmd} to {}{}{};\n",
            quote_ident(&name),
            shadow.quoted(),
            roles.join(", "),
            qual.map_or_else(String::new, |q| format!(" using ({q})")),
            check.map_or_else(String::new, |c| format!(" with check ({c})")),
        ));
    }
    if !ddl.is_empty() {
        tx.batch_execute(&ddl).await.map_err(db)?;
    }
    Ok(())
}

/// Refuses a live table that a rename would leave behind: views and rules read it by
/// OID, foreign keys point at it, triggers would not be copied to the shadow table.
async fn refuse_dependents(
    tx: &impl GenericClient,
    live: &QualifiedName,
) -> Result<(), StoreError> {
    let row = tx
        .query_one(DEPENDENTS, &[&live.quoted()])
        .await
        .map_err(StoreError::db("looking for the live table's dependents"))?;
    let row = row.of("pg_depend");
    let mut found: Vec<String> = Vec::new();
    for (what, column) in [
        ("views", "views"),
        ("foreign keys", "foreign_keys"),
        ("triggers", "triggers"),
    ] {
        if let Some(names) = row.col::<Option<String>>(column)? {
            found.push(format!("{what} {names}"));
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    Err(Refusal::Dependents {
        live: live.clone(),
        found: found.join("; "),
    }
    .into())
}

/// Gives the shadow table the live table's grants (`like` does not copy them).
async fn copy_grants(
    tx: &impl GenericClient,
    live: &QualifiedName,
    shadow: &QualifiedName,
) -> Result<(), StoreError> {
    let rows = tx
        .query(GRANTS, &[&live.quoted()])
        .await
        .map_err(StoreError::db("reading the live table's grants"))?;
    for r in rows {
        // Both come from the catalog: a privilege keyword, and a role name that
        // `regrole` output already quotes where needed.
        let r = r.of("aclexplode");
        let (privilege, grantee): (String, String) = (r.col("privilege_type")?, r.col("grantee")?);
        if privilege
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b == b' ')
        {
            tx.batch_execute(&format!(
                "grant {privilege} on {} to {grantee}",
                shadow.quoted()
            ))
            .await
            .map_err(StoreError::db("copying the live table's grants"))?;
        }
    }
    Ok(())
}

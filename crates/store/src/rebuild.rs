//! Rebuilds: a new subscriber ID replays the event log into a shadow table beside the
//! live one; when it has caught up, one transaction swaps the tables and makes the new
//! subscriber the projection's active one. The old table stays, retired, until
//! `finish`. Every change of state is one transaction, so a crash leaves either the old
//! state or the new one.

use std::time::Duration;

use tokio_postgres::{Client, GenericClient};
use walfold_config::QualifiedName;

use crate::error::StoreError;
use crate::leader::Fence;
use walfold_config::quote_ident;
use walfold_event::DeadLetterStatus;

walfold_event::stored_enum! {
    /// Where a rebuild is: the `rebuild.state` column, whose check constraint allows
    /// exactly these.
    pub enum RebuildState {
        /// Replaying the log into the shadow table.
        Running = "running",
        /// An abort was requested; the leader stops its projectors, then ends it.
        Aborting = "aborting",
        /// Switched over; the retired table stays until `finish`.
        Switched = "switched",
        /// Switched, and the retired table dropped.
        Finished = "finished",
        /// Ended without switching; the shadow table dropped.
        Aborted = "aborted",
    }
}

impl RebuildState {
    /// Not ended yet: what [`open`] reads (one per projection at most).
    pub const OPEN: &'static [RebuildState] = &[
        RebuildState::Running,
        RebuildState::Aborting,
        RebuildState::Switched,
    ];
    /// Not switched and not ended: its subscriber replays, or is being stopped.
    pub const REPLAYING: &'static [RebuildState] = &[RebuildState::Running, RebuildState::Aborting];
}

/// A rebuild as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Rebuild {
    /// The new subscriber ID (the rebuild's identity).
    pub subscriber: String,
    pub projection: String,
    /// The subscriber that served the live table when the rebuild started.
    pub previous: String,
    pub live: String,
    pub shadow: String,
    pub retired: String,
    pub state: RebuildState,
    pub requested_at_unix: f64,
    pub switched_at_unix: Option<f64>,
}

impl Rebuild {
    pub fn live_table(&self) -> QualifiedName {
        parse(&self.live)
    }
    pub fn shadow_table(&self) -> QualifiedName {
        parse(&self.shadow)
    }
    pub fn retired_table(&self) -> QualifiedName {
        parse(&self.retired)
    }
    /// Switched over, with the retired table kept longer than `after`.
    pub fn retired_longer_than(&self, after: Duration, now_unix: f64) -> bool {
        self.state == RebuildState::Switched
            && self
                .switched_at_unix
                .is_some_and(|t| now_unix - t >= after.as_secs_f64())
    }
}

fn parse(s: &str) -> QualifiedName {
    QualifiedName::parse(s).unwrap_or_else(|_| QualifiedName {
        schema: "public".into(),
        name: s.to_owned(),
    })
}

/// A sibling table name, `live` + `suffix`, refused when it would not fit in 63 bytes.
fn sibling(live: &QualifiedName, suffix: &str) -> Result<QualifiedName, StoreError> {
    let name = format!("{}{suffix}", live.name);
    if name.len() > 63 {
        return Err(StoreError::Refused(format!(
            "table name {name} would be longer than PostgreSQL's 63 bytes; rename {live} first"
        )));
    }
    Ok(QualifiedName {
        schema: live.schema.clone(),
        name,
    })
}

const COLUMNS: &str = "subscriber_id, projection, previous_subscriber, live_table, shadow_table, \
     retired_table, state, extract(epoch from requested_at)::float8, \
     extract(epoch from switched_at)::float8";

fn from_row(r: &tokio_postgres::Row) -> Rebuild {
    Rebuild {
        subscriber: r.get(0),
        projection: r.get(1),
        previous: r.get(2),
        live: r.get(3),
        shadow: r.get(4),
        retired: r.get(5),
        state: r.get(6),
        requested_at_unix: r.get(7),
        switched_at_unix: r.get(8),
    }
}

/// Rebuilds not ended yet (running, aborting, or switched with a retired table kept).
pub async fn open(client: &impl GenericClient, schema: &str) -> Result<Vec<Rebuild>, StoreError> {
    read_open(client, schema, "").await
}

/// [`open`], waiting for a switch-over or abort in progress to commit: what a new leader
/// plans from, so it never starts projectors on tables about to be renamed or dropped.
pub async fn open_settled(
    client: &impl GenericClient,
    schema: &str,
) -> Result<Vec<Rebuild>, StoreError> {
    read_open(client, schema, " for share").await
}

async fn read_open(
    client: &impl GenericClient,
    schema: &str,
    lock: &str,
) -> Result<Vec<Rebuild>, StoreError> {
    let rows = client
        .query(
            &format!(
                "select {COLUMNS} from {}.rebuild \
                 where state = any($1) order by requested_at{lock}",
                quote_ident(schema)
            ),
            &[&RebuildState::OPEN],
        )
        .await
        .map_err(StoreError::db("reading rebuilds"))?;
    Ok(rows.iter().map(from_row).collect())
}

/// Starts a rebuild of `projection` (whose live table is `live`, served by `previous`)
/// under the unused subscriber ID `subscriber`: creates the shadow table from the live
/// table's definition and records the rebuild, in one transaction.
pub async fn start(
    client: &mut Client,
    schema: &str,
    projection: &str,
    live: &QualifiedName,
    previous: &str,
    subscriber: &str,
) -> Result<Rebuild, StoreError> {
    let s = quote_ident(schema);
    let shadow = sibling(live, "__rebuild")?;
    let retired = sibling(live, "__retired")?;
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("starting a rebuild"))?;
    if let Some(open) = open(&tx, schema)
        .await?
        .into_iter()
        .find(|r| r.projection == projection)
    {
        return Err(StoreError::Refused(format!(
            "projection {projection} already has a rebuild ({}, state {}); \
             wait for it to switch and run `walfold rebuild {projection} --finish`, or `--abort` it",
            open.subscriber, open.state
        )));
    }
    let used: bool = tx
        .query_one(
            &format!(
                "select exists (select 1 from {s}.checkpoint where subscriber_id = $1) \
                 or exists (select 1 from {s}.processed_message where subscriber_id = $1) \
                 or exists (select 1 from {s}.rebuild where subscriber_id = $1) \
                 or exists (select 1 from {s}.projection where subscriber_id = $1)"
            ),
            &[&subscriber],
        )
        .await
        .map_err(StoreError::db("checking the subscriber ID"))?
        .get(0);
    if used {
        return Err(StoreError::Refused(format!(
            "subscriber ID {subscriber} has been used before; a rebuild needs a new one \
             (its claims must start empty), e.g. {subscriber}.2"
        )));
    }
    let exists = |t: &QualifiedName| {
        let name = t.quoted();
        let tx = &tx;
        async move {
            tx.query_one("select to_regclass($1) is not null", &[&name])
                .await
                .map(|r| r.get::<_, bool>(0))
                .map_err(StoreError::db("looking up a table"))
        }
    };
    if !exists(live).await? {
        return Err(StoreError::Refused(format!(
            "the live table {live} does not exist"
        )));
    }
    for t in [&shadow, &retired] {
        if exists(t).await? {
            return Err(StoreError::Refused(format!(
                "table {t} exists already; walfold needs that name for the rebuild: drop or rename it"
            )));
        }
    }
    refuse_dependents(&tx, live).await?;
    tx.batch_execute(&format!(
        "create table {} (like {} including all)",
        shadow.quoted(),
        live.quoted()
    ))
    .await
    .map_err(StoreError::db("creating the shadow table"))?;
    copy_grants(&tx, live, &shadow).await?;
    copy_constraints_and_policies(&tx, live, &shadow).await?;
    let row = tx
        .query_one(
            &format!(
                "insert into {s}.rebuild (subscriber_id, projection, previous_subscriber, \
                 live_table, shadow_table, retired_table, state) \
                 values ($1, $2, $3, $4, $5, $6, $7) returning {COLUMNS}"
            ),
            &[
                &subscriber,
                &projection,
                &previous,
                &live.to_string(),
                &shadow.to_string(),
                &retired.to_string(),
                &RebuildState::Running,
            ],
        )
        .await
        .map_err(StoreError::db("recording the rebuild"))?;
    let rebuild = from_row(&row);
    tx.commit()
        .await
        .map_err(StoreError::db("starting a rebuild"))?;
    Ok(rebuild)
}

/// Whether a rebuild may switch over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Still replaying.
    Behind,
    /// Every partition is within the slack of the head.
    Ready,
    /// Caught up, but this many of its dead letters are open: the rebuilt table would
    /// lack those events. Retry or discard them first.
    Blocked(i64),
}

/// Whether every partition of the rebuild's subscriber has read to within `slack` events
/// of the log's head, with no open dead letter. `log_head` is the head of the event log
/// when it lives in another database (a projection on an extra target); `None` reads
/// it here.
pub async fn readiness(
    client: &Client,
    schema: &str,
    subscriber: &str,
    partitions: u32,
    slack: i64,
    log_head: Option<i64>,
) -> Result<Readiness, StoreError> {
    let s = quote_ident(schema);
    let row = client
        .query_one(
            &format!(
                "select count(*), coalesce(min(position), 0), \
                 (select coalesce(max(seq), 0) from {s}.event_log), \
                 (select count(*) from {s}.dead_letter where subscriber_id = $1 \
                  and status = any($2)) \
                 from {s}.checkpoint where subscriber_id = $1"
            ),
            &[&subscriber, &DeadLetterStatus::OPEN_OR_RETRYING],
        )
        .await
        .map_err(StoreError::db("reading a rebuild's progress"))?;
    let (n, min, head, dead): (i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    let head = log_head.unwrap_or(head);
    Ok(if n < i64::from(partitions) || head - min > slack {
        Readiness::Behind
    } else if dead > 0 {
        Readiness::Blocked(dead)
    } else {
        Readiness::Ready
    })
}

/// The switch-over, in one transaction: the live table is retired, the shadow table takes
/// its name, and the rebuild's subscriber becomes the projection's active one (the old
/// one's open dead letters are discarded and its aggregates released: nothing runs it
/// any more). The caller leads (its `fence` is checked inside the transaction) and has
/// stopped every projector writing either table. Returns false when the rebuild is no
/// longer running (aborted meanwhile).
pub async fn switch(
    client: &mut Client,
    schema: &str,
    rebuild: &Rebuild,
    fence: &Fence,
) -> Result<bool, StoreError> {
    let s = quote_ident(schema);
    let (live, shadow, retired) = (
        rebuild.live_table(),
        rebuild.shadow_table(),
        rebuild.retired_table(),
    );
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("switching over"))?;
    let moved = tx
        .execute(
            &format!(
                "update {s}.rebuild set state = $2, switched_at = now() \
                 where subscriber_id = $1 and state = $3"
            ),
            &[
                &rebuild.subscriber,
                &RebuildState::Switched,
                &RebuildState::Running,
            ],
        )
        .await
        .map_err(StoreError::db("switching over"))?;
    if moved == 0 {
        return Ok(false);
    }
    // Readers of the live table wait for this transaction only; a reader that holds the
    // table for longer makes the switch time out and be tried again.
    tx.batch_execute(&format!(
        "set local lock_timeout = '5s'; lock table {}, {} in access exclusive mode;",
        live.quoted(),
        shadow.quoted(),
    ))
    .await
    .map_err(StoreError::db("locking the live and shadow tables"))?;
    fence.check(&tx).await?;
    tx.batch_execute(&format!(
        "alter table {l} rename to {r}; alter table {sh} rename to {ln};",
        l = live.quoted(),
        sh = shadow.quoted(),
        r = walfold_config::quote_ident(&retired.name),
        ln = walfold_config::quote_ident(&live.name),
    ))
    .await
    .map_err(StoreError::db("swapping the live and shadow tables"))?;
    tx.execute(
        &format!("delete from {s}.parked_aggregate where subscriber_id = $1"),
        &[&rebuild.previous],
    )
    .await
    .map_err(StoreError::db("retiring the previous subscriber"))?;
    discard_unresolved(
        &tx,
        &s,
        &rebuild.previous,
        "subscriber replaced by a rebuild",
    )
    .await
    .map_err(StoreError::db("retiring the previous subscriber"))?;
    tx.execute(
        &format!(
            "update {s}.projection set subscriber_id = $2, updated_at = now() where name = $1"
        ),
        &[&rebuild.projection, &rebuild.subscriber],
    )
    .await
    .map_err(StoreError::db("recording the new active subscriber"))?;
    tx.commit()
        .await
        .map_err(StoreError::db("switching over"))?;
    Ok(true)
}

/// Asks the leader to abort the running rebuild of `projection` (it stops the rebuild's
/// projectors first, then calls [`abort`]).
pub async fn request_abort(
    client: &Client,
    schema: &str,
    projection: &str,
) -> Result<Rebuild, StoreError> {
    let s = quote_ident(schema);
    let row = client
        .query_opt(
            &format!(
                "update {s}.rebuild set state = $2 \
                 where projection = $1 and state = any($3) returning {COLUMNS}"
            ),
            &[
                &projection,
                &RebuildState::Aborting,
                &RebuildState::REPLAYING,
            ],
        )
        .await
        .map_err(StoreError::db("aborting a rebuild"))?;
    match row {
        Some(r) => Ok(from_row(&r)),
        None => Err(StoreError::Refused(
            not_open(client, schema, projection, "abort").await?,
        )),
    }
}

async fn not_open(
    client: &Client,
    schema: &str,
    projection: &str,
    action: &str,
) -> Result<String, StoreError> {
    let open = open(client, schema).await?;
    Ok(match open.iter().find(|r| r.projection == projection) {
        Some(r) if r.state == RebuildState::Switched => format!(
            "the rebuild of {projection} has switched over already; nothing to {action} \
             (run `walfold rebuild {projection} --finish` to drop the retired table)"
        ),
        Some(r) => format!(
            "the rebuild of {projection} is still {}; it switches over once it has caught up",
            r.state
        ),
        None => format!("projection {projection} has no rebuild to {action}"),
    })
}

/// Ends an aborting or running rebuild: drops the shadow table and the new subscriber's
/// checkpoints and parked aggregates, in one transaction; nothing live is touched. The
/// caller leads (its `fence` is checked inside the transaction) and runs no projector of
/// this rebuild. Claims are removed afterwards by [`forget_claims`] (or `prune`).
pub async fn abort(
    client: &mut Client,
    schema: &str,
    rebuild: &Rebuild,
    fence: &Fence,
) -> Result<(), StoreError> {
    let s = quote_ident(schema);
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("aborting a rebuild"))?;
    let n = tx
        .execute(
            &format!(
                "update {s}.rebuild set state = $2, ended_at = now() \
                 where subscriber_id = $1 and state = any($3)"
            ),
            &[
                &rebuild.subscriber,
                &RebuildState::Aborted,
                &RebuildState::REPLAYING,
            ],
        )
        .await
        .map_err(StoreError::db("aborting a rebuild"))?;
    if n == 1 {
        fence.check(&tx).await?;
        tx.batch_execute(&format!(
            "drop table if exists {}",
            rebuild.shadow_table().quoted()
        ))
        .await
        .map_err(StoreError::db("dropping the shadow table"))?;
        retire_subscriber(&tx, schema, &rebuild.subscriber, "rebuild aborted").await?;
    }
    tx.commit()
        .await
        .map_err(StoreError::db("aborting a rebuild"))?;
    Ok(())
}

/// Ends a switched rebuild: drops the retired table and the previous subscriber's
/// checkpoints and parked aggregates, in one transaction. Sequences the retired table
/// owns (a `serial` column, whose sequence the live table's default shares) pass to the
/// live table first. The daemon passes its `fence`; the CLI may finish without one
/// (nothing runs on a retired table). Returns the rebuild.
pub async fn finish(
    client: &mut Client,
    schema: &str,
    projection: &str,
    fence: Option<&Fence>,
) -> Result<Rebuild, StoreError> {
    let s = quote_ident(schema);
    let tx = client
        .transaction()
        .await
        .map_err(StoreError::db("finishing a rebuild"))?;
    let row = tx
        .query_opt(
            &format!(
                "update {s}.rebuild set state = $2, ended_at = now() \
                 where projection = $1 and state = $3 returning {COLUMNS}"
            ),
            &[
                &projection,
                &RebuildState::Finished,
                &RebuildState::Switched,
            ],
        )
        .await
        .map_err(StoreError::db("finishing a rebuild"))?;
    let Some(row) = row else {
        drop(tx);
        return Err(StoreError::Refused(
            not_open(client, schema, projection, "finish").await?,
        ));
    };
    let rebuild = from_row(&row);
    if let Some(fence) = fence {
        fence.check(&tx).await?;
    }
    hand_over_sequences(&tx, &rebuild.retired_table(), &rebuild.live_table()).await?;
    tx.batch_execute(&format!(
        "drop table if exists {}",
        rebuild.retired_table().quoted()
    ))
    .await
    .map_err(StoreError::db("dropping the retired table"))?;
    retire_subscriber(
        &tx,
        schema,
        &rebuild.previous,
        "subscriber retired by a rebuild",
    )
    .await?;
    tx.commit()
        .await
        .map_err(StoreError::db("finishing a rebuild"))?;
    Ok(rebuild)
}

async fn retire_subscriber(
    tx: &impl GenericClient,
    schema: &str,
    subscriber: &str,
    why: &str,
) -> Result<(), StoreError> {
    let s = quote_ident(schema);
    for sql in [
        format!("delete from {s}.checkpoint where subscriber_id = $1 and $2::text is not null"),
        format!(
            "delete from {s}.parked_aggregate where subscriber_id = $1 and $2::text is not null"
        ),
        format!(
            "delete from {s}.aggregate_version where subscriber_id = $1 and $2::text is not null"
        ),
    ] {
        tx.execute(&sql, &[&subscriber, &why])
            .await
            .map_err(StoreError::db("retiring a subscriber"))?;
    }
    discard_unresolved(tx, &s, subscriber, why)
        .await
        .map_err(StoreError::db("retiring a subscriber"))?;
    Ok(())
}

/// Discards the dead letters of a subscriber nothing runs any more, with `why` as the
/// resolution (`s` is the quoted schema).
async fn discard_unresolved(
    tx: &impl GenericClient,
    s: &str,
    subscriber: &str,
    why: &str,
) -> Result<u64, tokio_postgres::Error> {
    tx.execute(
        &format!(
            "update {s}.dead_letter set status = $3, resolution = $2, resolved_at = now() \
             where subscriber_id = $1 and status = any($4)"
        ),
        &[
            &subscriber,
            &why,
            &DeadLetterStatus::Discarded,
            &DeadLetterStatus::UNRESOLVED,
        ],
    )
    .await
}

/// Deletes a retired subscriber's claims in batches of `batch` rows (short transactions,
/// no long locks); returns how many.
pub async fn forget_claims(
    client: &Client,
    schema: &str,
    subscriber: &str,
    batch: i64,
) -> Result<u64, StoreError> {
    let sql = format!(
        "delete from {s}.processed_message where ctid = any(array( \
         select ctid from {s}.processed_message where subscriber_id = $1 limit $2))",
        s = quote_ident(schema)
    );
    let mut total = 0;
    loop {
        let n = client
            .execute(&sql, &[&subscriber, &batch])
            .await
            .map_err(StoreError::db("deleting a retired subscriber's claims"))?;
        total += n;
        if n < batch as u64 {
            return Ok(total);
        }
    }
}

/// Makes `to` own the sequences `from` owns (by column name), so dropping `from` keeps
/// the sequences that `to`'s defaults use (`like … including all` copies a `serial`
/// column's default, which names the original sequence).
async fn hand_over_sequences(
    tx: &impl GenericClient,
    from: &QualifiedName,
    to: &QualifiedName,
) -> Result<(), StoreError> {
    let rows = tx
        .query(
            "select d.objid::regclass::text, a.attname::text from pg_depend d \
             join pg_class c on c.oid = d.objid and c.relkind = 'S' \
             join pg_attribute a on a.attrelid = d.refobjid and a.attnum = d.refobjsubid \
             where d.classid = 'pg_class'::regclass and d.refclassid = 'pg_class'::regclass \
               and d.refobjid = to_regclass($1) and d.deptype = 'a' \
               and exists (select 1 from pg_attribute t where t.attrelid = to_regclass($2) \
                           and t.attname = a.attname and not t.attisdropped)",
            &[&from.quoted(), &to.quoted()],
        )
        .await
        .map_err(StoreError::db("reading the retired table's sequences"))?;
    for r in rows {
        // `regclass` output is already quoted where needed.
        let (sequence, column): (String, String) = (r.get(0), r.get(1));
        tx.batch_execute(&format!(
            "alter sequence {sequence} owned by {}.{}",
            to.quoted(),
            walfold_config::quote_ident(&column)
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
        .query(
            "select conname::text, pg_get_constraintdef(oid) from pg_constraint \
             where conrelid = $1::text::regclass and contype = 'f' order by conname",
            &[&live.quoted()],
        )
        .await
        .map_err(StoreError::db("reading the live table's foreign keys"))?;
    let mut ddl = String::new();
    for r in fks {
        let (name, definition): (String, String) = (r.get(0), r.get(1));
        ddl.push_str(&format!(
            "alter table {} add constraint {} {definition};\n",
            shadow.quoted(),
            walfold_config::quote_ident(&name)
        ));
    }
    let rls = tx
        .query_one(
            "select relrowsecurity, relforcerowsecurity from pg_class \
             where oid = $1::text::regclass",
            &[&live.quoted()],
        )
        .await
        .map_err(StoreError::db("reading the live table's row security"))?;
    let (enabled, forced): (bool, bool) = (rls.get(0), rls.get(1));
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
        .query(
            "select policyname::text, permissive, \
             array(select case when r = 'public' then 'public' else quote_ident(r) end \
                   from unnest(roles) r)::text[], cmd, qual, with_check \
             from pg_policies where schemaname = $1 and tablename = $2 order by policyname",
            &[&live.schema, &live.name],
        )
        .await
        .map_err(StoreError::db("reading the live table's policies"))?;
    for r in policies {
        let (name, permissive, roles, cmd): (String, String, Vec<String>, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        let (qual, check): (Option<String>, Option<String>) = (r.get(4), r.get(5));
        // All from the catalog: keywords, quoted role names and deparsed expressions.
        ddl.push_str(&format!(
            "create policy {} on {} as {permissive} for {cmd} to {}{}{};\n",
            walfold_config::quote_ident(&name),
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
        .query_one(
            "select \
               (select string_agg(distinct r.ev_class::regclass::text, ', ') from pg_depend d \
                join pg_rewrite r on r.oid = d.objid \
                where d.refobjid = $1::text::regclass and r.ev_class <> $1::text::regclass), \
               (select string_agg(conname || ' on ' || conrelid::regclass::text, ', ') \
                from pg_constraint where contype = 'f' and confrelid = $1::text::regclass), \
               (select string_agg(tgname, ', ') from pg_trigger \
                where tgrelid = $1::text::regclass and not tgisinternal)",
            &[&live.quoted()],
        )
        .await
        .map_err(StoreError::db("looking for the live table's dependents"))?;
    let found: Vec<String> = [("views", 0), ("foreign keys", 1), ("triggers", 2)]
        .iter()
        .filter_map(|(what, i)| {
            row.get::<_, Option<String>>(*i)
                .map(|names| format!("{what} {names}"))
        })
        .collect();
    if found.is_empty() {
        return Ok(());
    }
    Err(StoreError::Refused(format!(
        "{live} has {}: a rebuild swaps tables by renaming, which would leave them on the \
         retired table; drop them and recreate them after the switch-over",
        found.join("; ")
    )))
}

/// Gives the shadow table the live table's grants (`like` does not copy them).
async fn copy_grants(
    tx: &impl GenericClient,
    live: &QualifiedName,
    shadow: &QualifiedName,
) -> Result<(), StoreError> {
    let rows = tx
        .query(
            "select a.privilege_type, \
             case when a.grantee = 0 then 'public' else a.grantee::regrole::text end \
             from pg_class c, aclexplode(c.relacl) a \
             where c.oid = $1::text::regclass and a.grantee <> c.relowner",
            &[&live.quoted()],
        )
        .await
        .map_err(StoreError::db("reading the live table's grants"))?;
    for r in rows {
        // Both come from the catalog: a privilege keyword, and a role name that
        // `regrole` output already quotes where needed.
        let (privilege, grantee): (String, String) = (r.get(0), r.get(1));
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

#[cfg(test)]
mod tests {
    use super::RebuildState;
    use walfold_event::assert_round_trips;

    use crate::migrate::tests::checked_values;

    #[test]
    fn every_state_round_trips() {
        assert_round_trips(RebuildState::ALL, RebuildState::as_str);
    }

    #[test]
    fn the_check_constraint_allows_exactly_the_states() {
        let mut ours: Vec<&str> = RebuildState::ALL.iter().map(|s| s.as_str()).collect();
        ours.sort();
        assert_eq!(checked_values("state"), ours);
    }
}

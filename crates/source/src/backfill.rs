//! Backfill: imports the rows an outbox table already holds into the event log, in
//! keyset-paged batches, then leaves the rest to the slot.
//!
//! No gap: the slot is created (or found) before the first page is read. A row
//! committed before the slot's start is visible to every page's snapshot, so paging
//! finds it; a row committed after is in the slot's stream. A row that is both (inserted
//! while the backfill runs) is appended once: the event log's ID check makes the second
//! copy a duplicate. Backfilled events keep their producer IDs (derived as the stream
//! derives them: one [`Mapping`]) and enter the log in the page order (`order_by`, then
//! the ID's columns when the ID is columns, then the row's place in its table, so rows
//! that share an ID are each read once even across a page boundary). An ID that is no
//! columns (an expression, `expand`) has no key: each table holding the outbox's rows
//! (each partition of a partitioned one) is read in ranges of blocks, widened or
//! narrowed to about a batch of rows, so every page costs only its own rows (paging by
//! `(tableoid, ctid) > (…)` over the whole outbox scanned all of it for every page:
//! 8.2M tuples read for 200k rows in 40 pages).
//!
//! A rejected row (malformed, or an ID already in the log with other content) is
//! identified by a digest of its table and values, so backfilling again records it once.

use std::collections::HashMap;

use tokio_postgres::Client;
use uuid::Uuid;
use walfold_config::{quote_ident, OutboxConfig, SourceView};
use walfold_event::{Lsn, RowOrigin};
use walfold_pg::{connect, RowExt};
use walfold_pgoutput::{oid, Column, Relation, RelationColumn, Tuple};
use walfold_store::{EventLog, IngestCounts, LogOrder, StoreError};

use crate::error::SourceError;
use crate::outbox::{Mapped, Mapping, TxContext};
use crate::setup::prepare_source;

/// What a backfill did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackfillReport {
    pub rows: u64,
    pub appended: u64,
    pub duplicates: u64,
    pub id_conflicts: u64,
    pub malformed: u64,
    pub pages: u64,
    /// Rows not imported: a null ID (never an event) or a null order value.
    pub skipped: u64,
    /// Rows for which `where` is not true: no events.
    pub filtered: u64,
}

/// Imports `table`'s rows (one of the configured outboxes) in pages of `batch`,
/// ordered by `order_by` (default: the ID column) and then the ID column.
pub async fn backfill(
    config: &SourceView<'_>,
    table: &str,
    order_by: Option<&str>,
    batch: i64,
) -> Result<BackfillReport, SourceError> {
    let (outbox, _) = config.table_outbox(table).ok_or_else(|| {
        let tables: Vec<String> = config
            .table_outboxes()
            .map(|(_, t)| t.to_string())
            .collect();
        SourceError::NoSuchOutbox(
            if config
                .outboxes()
                .any(|o| o.message_prefix.as_deref() == Some(table))
            {
                format!(
                    "'{table}' is a message outbox: its events exist only in the WAL behind the \
                     slot, there are no rows to backfill (table outboxes: {})",
                    tables.join(", ")
                )
            } else {
                format!(
                    "{table} is no table [[outbox]] of the config (table outboxes: {})",
                    tables.join(", ")
                )
            },
        )
    })?;
    let target = connect(config.target_url()).await?;
    let schema = walfold_store::Schema::new(config.target.schema.as_str());
    let order = LogOrder::acquire(config.target_url(), &schema)
        .await
        .map_err(|e| match e {
            StoreError::Busy(_) => SourceError::BackfillBesideDaemon,
            other => other.into(),
        })?;
    let mut log = EventLog::open(
        target,
        &schema,
        &config.source().slot,
        &config.source().name,
        std::sync::Arc::new(order),
    )
    .await?;
    let source = source_session(config).await?;
    // The slot exists from here on: whatever commits later is in its stream.
    prepare_source(&source, config, &mut log).await?;
    import(
        &source,
        &mut log,
        outbox,
        order_by,
        batch,
        config.pipeline.max_event_bytes,
        None,
    )
    .await
}

/// A source session that renders values as the replication stream does.
pub(crate) async fn source_session(config: &SourceView<'_>) -> Result<Client, SourceError> {
    let source = connect(&config.source().url).await?;
    // Values as text exactly as the replication stream renders them (its session sets
    // the same), whatever the role's defaults: the same mapping applies, and a row's
    // digest is the same on every run.
    source
        .batch_execute("set datestyle = 'ISO'; set timezone = 'UTC'; set extra_float_digits = 3")
        .await
        .map_err(StoreError::db("configuring the source session"))?;
    Ok(source)
}

/// Rows per page of a gap's backfill.
const GAP_BATCH: i64 = 1000;

/// Fills this slot's gaps that no backfill has covered yet (`on_slot_lost =
/// "recreate"`): every table outbox is imported through `log` (events already in the
/// log are duplicates), after the new slot exists, so nothing committed since is
/// missed. The scan reads only rows whose transaction may have committed in the gaps
/// (the source's horizon before the first gap bounds their xmin, see `horizon`), and
/// reports its progress (logs, `slot_gap.scanned`). A gap is then closed as filled,
/// unless a message outbox follows the source: its events in the gap existed only in
/// WAL that is gone, so the gap stays open.
pub(crate) async fn fill_gaps(
    config: &SourceView<'_>,
    log: &mut EventLog,
) -> Result<(), SourceError> {
    let gaps = log.unfilled_gaps().await?;
    let Some(&(from, _)) = gaps.first() else {
        return Ok(());
    };
    let to = gaps.last().map_or(from, |g| g.1);
    let slot = &config.source().slot;
    let messages: Vec<&str> = config
        .outboxes()
        .filter_map(|o| o.message_prefix.as_deref())
        .collect();
    let source = source_session(config).await?;
    let bound = crate::horizon::bound(log, &source, from).await?;
    match bound {
        Some((at, xid)) => {
            tracing::warn!(slot = %slot, from = %from, to = %to, horizon = %at, since_xid = xid, "backfilling the slot gap: reading outbox rows of transactions from xid {xid} on (the oldest running at {at}, before the gap)")
        }
        None => {
            tracing::warn!(slot = %slot, from = %from, to = %to, "backfilling the slot gap: no recorded horizon before it, reading the whole outbox tables")
        }
    }
    let since = bound.map(|b| b.1);
    let mut progress = Progress {
        slot: slot.clone(),
        since_xid: since,
        scanned: 0,
        appended: 0,
        reported: std::time::Instant::now(),
    };
    log.gap_progress(0, since).await?;
    for (outbox, table) in config.table_outboxes() {
        tracing::warn!(slot = %slot, from = %from, to = %to, outbox = %table, "backfilling the outbox over the slot gap");
        let report = import(
            &source,
            log,
            outbox,
            None,
            GAP_BATCH,
            config.pipeline.max_event_bytes,
            Some(&mut progress),
        )
        .await?;
        tracing::warn!(slot = %slot, outbox = %table, rows = report.rows, appended = report.appended, duplicates = report.duplicates, "backfilled the outbox over the slot gap");
    }
    let appended = progress.appended;
    log.gap_progress(progress.scanned as i64, since).await?;
    let filled = messages.is_empty();
    log.fill_gaps(appended as i64, filled).await?;
    if filled {
        tracing::warn!(slot = %slot, from = %from, to = %to, scanned = progress.scanned, appended, "slot gap filled: every table outbox was backfilled over it");
    } else {
        tracing::error!(slot = %slot, from = %from, to = %to, scanned = progress.scanned, appended, prefixes = %messages.join(", "), "slot gap stays open: events of message outboxes committed in it may be lost (they exist only in WAL that is gone); table outboxes were backfilled");
    }
    Ok(())
}

/// A gap backfill's bound and counts, reported every few seconds while it runs.
struct Progress {
    slot: String,
    /// Only rows of transactions from this xid (64 bits) on; `None`: every row.
    since_xid: Option<i64>,
    scanned: u64,
    appended: u64,
    reported: std::time::Instant,
}

/// How often a running gap backfill reports.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Imports `outbox`'s rows in pages of `batch` through `log`.
async fn import(
    source: &Client,
    log: &mut EventLog,
    outbox: &OutboxConfig,
    order_by: Option<&str>,
    batch: i64,
    max_event_bytes: usize,
    mut progress: Option<&mut Progress>,
) -> Result<BackfillReport, SourceError> {
    let since = progress.as_ref().and_then(|p| p.since_xid);
    let mut pager = Pager::new(source, outbox, order_by).await?;
    // `age()` compares 32-bit xids: the bound's low 32 bits.
    pager.since_xid = since.map(|x| (x & 0xffff_ffff).to_string());
    pager.mapping = pager.mapping.with_max_bytes(max_event_bytes);
    let mut report = BackfillReport::default();
    let mut cursor: Option<Cursor> = None;
    loop {
        let (rows, next) = pager.page(source, cursor.as_ref(), batch).await?;
        if rows.is_empty() {
            report.skipped = source
                .query_one(&pager.skipped, &[])
                .await
                .map_err(StoreError::db("counting skipped rows"))?
                .of("the outbox")
                .col::<i64>(0)? as u64;
            return Ok(report);
        }
        report.pages += 1;
        report.rows += rows.len() as u64;
        let mut events = Vec::with_capacity(rows.len());
        let mut dead = Vec::new();
        for row in &rows {
            let mapped = pager.map(row);
            if let Mapped::Filtered = mapped {
                report.filtered += 1;
            }
            for outcome in mapped {
                match outcome {
                    Ok(e) => events.push(e),
                    Err(letter) => {
                        let mut letter = *letter;
                        letter.source_lsn = None;
                        dead.push(letter);
                    }
                }
            }
        }
        let counts = IngestCounts {
            malformed: dead.len() as u64,
            ignored_changes: 0,
        };
        let outcome = log.append(&events, &dead, None, counts).await?;
        report.appended += outcome.appended;
        report.duplicates += outcome.duplicates;
        report.id_conflicts += outcome.id_conflicts;
        report.malformed += dead.len() as u64;
        if let Some(p) = progress.as_deref_mut() {
            p.scanned += rows.len() as u64;
            p.appended += outcome.appended;
            if p.reported.elapsed() >= PROGRESS_EVERY {
                p.reported = std::time::Instant::now();
                tracing::warn!(slot = %p.slot, outbox = %pager.table, scanned = p.scanned, appended = p.appended, "backfilling the slot gap");
                log.gap_progress(p.scanned as i64, p.since_xid).await?;
            }
        }
        cursor = Some(next);
    }
}

/// Removes from `candidates` the events whose rows `outbox` holds (by the producer's
/// ID, mapped as ingest maps it); stops early once none is left. Memory is bounded by
/// the candidates, whatever the table's size.
pub(crate) async fn confirm(
    source: &Client,
    outbox: &OutboxConfig,
    candidates: &mut HashMap<Uuid, i64>,
) -> Result<(), SourceError> {
    let pager = Pager::new(source, outbox, None).await?;
    let mut cursor: Option<Cursor> = None;
    while !candidates.is_empty() {
        let (rows, next) = pager.page(source, cursor.as_ref(), GAP_BATCH).await?;
        if rows.is_empty() {
            break;
        }
        for row in &rows {
            for e in pager.map(row).into_iter().flatten() {
                candidates.remove(&e.id);
            }
        }
        cursor = Some(next);
    }
    Ok(())
}

/// Where the last page ended.
enum Cursor {
    /// Keyset pages: the last row's key, as text.
    Keyset {
        /// The key columns' values (`order_by`, then the ID's columns).
        keys: Vec<Option<String>>,
        /// `tableoid` (a partitioned outbox's rows are in several tables) and `ctid`:
        /// the row's place, which orders rows that share the rest of the key.
        table: String,
        ctid: String,
    },
    /// Block ranges: the next block of one of the tables holding rows.
    Blocks(Blocks),
}

/// Where block-range paging is: table `table` (of [`Paging::Blocks`]) from `block`,
/// `span` blocks at a time, and how many blocks that table had when last asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Blocks {
    table: usize,
    block: i64,
    span: i64,
    known: i64,
}

/// The widest block range one page reads (1 GiB of 8 kB blocks): ranges widen over
/// empty or sparse stretches, up to this.
const MAX_SPAN: i64 = 131_072;

impl Blocks {
    const START: Blocks = Blocks {
        table: 0,
        block: 0,
        span: 1,
        known: 0,
    };

    /// The next range's width: about `batch` rows by the density just read, at most
    /// four times wider (or, when empty, four times) than this one.
    fn next_span(&self, rows: usize, batch: i64) -> i64 {
        let rows = rows as i64;
        let wider = self.span.saturating_mul(4).min(MAX_SPAN);
        match rows {
            0 => wider,
            _ => (self.span.saturating_mul(batch.max(1)) / rows).clamp(1, wider),
        }
    }
}

/// How an outbox is paged.
enum Paging {
    /// By its keys (`order_by`, the ID's columns) and then each row's place: one
    /// statement over the whole outbox.
    Keyset,
    /// An ID that is no columns (an expression, one row's several events): each table
    /// holding rows (the outbox, or each partition of a partitioned one) in ranges of
    /// blocks (`ctid >= '(b,0)' and ctid < '(b+n,0)'`, a TID range scan from
    /// PostgreSQL 14), so a page costs its own rows, not every row before it. Each
    /// entry is the table's name (`oid::regclass`) and the page statement over it.
    Blocks(Vec<(String, String)>),
}

/// Blocks of relation `$1` now.
const BLOCKS: &str =
    "select pg_relation_size($1::text::regclass) / current_setting('block_size')::int8";

/// The tables holding an outbox's rows (`$1` and its partitions or children, in oid
/// order), each as its name.
const TABLES: &str = "with recursive tree(oid) as ( \
       select $1::text::regclass::oid \
       union select i.inhrelid from pg_inherits i join tree t on i.inhparent = t.oid) \
     select c.oid::regclass::text from tree t join pg_class c on c.oid = t.oid \
     where c.relkind = 'r' order by c.oid";

/// One row of a page.
struct PageRow {
    values: Vec<Option<String>>,
    table: String,
    ctid: String,
    digest: Uuid,
}

/// The keyset query over one outbox table; every column comes back as text, as in the
/// replication stream, so the same mapping applies.
struct Pager {
    mapping: Mapping,
    sql: String,
    /// Goes into each row's digest, so equal rows of two outboxes differ.
    table: String,
    /// Counts the rows paging cannot reach (a null key value).
    skipped: String,
    /// The key columns' positions in the row: `order_by`, then the ID's columns when the
    /// ID is columns (not an expression); the row's place orders the rest.
    keys: Vec<usize>,
    /// Only rows whose xmin is this 32-bit xid or newer, or frozen (a gap's bound).
    since_xid: Option<String>,
    paging: Paging,
}

impl Pager {
    async fn new(
        source: &Client,
        outbox: &OutboxConfig,
        order_by: Option<&str>,
    ) -> Result<Pager, SourceError> {
        let table = outbox
            .table_name()
            .ok_or_else(|| SourceError::MissingTable("a message outbox".into()))?;
        let (columns, relation) = table_relation(source, &table).await?;
        let position = |name: &str| columns.iter().position(|c| c.0 == name);
        let mapping = Mapping::new(outbox, &relation);
        if let Some((key, column)) = mapping.missing_required() {
            return Err(SourceError::MissingTable(format!(
                "{table}.{column} (outbox.{key})"
            )));
        }
        if let Some(refusal) = mapping.unreadable() {
            return Err(SourceError::Refused(refusal));
        }
        // The ID's columns key the pages when the ID is columns (an index usually
        // serves them); an ID computed by an expression (or one row's several events)
        // has none: the row's place alone orders the pages.
        let mut keys = Vec::new();
        if let Some(o) = order_by {
            keys.push(
                position(o).ok_or_else(|| SourceError::MissingTable(format!("{table}.{o}")))?,
            );
        }
        let id_fields: Vec<_> = outbox
            .fields()
            .into_iter()
            .filter(|f| f.key == "id")
            .collect();
        if outbox.set("expand").is_none() && id_fields.iter().all(|f| f.is_column()) {
            for f in &id_fields {
                if let Some(i) = position(f.value).filter(|i| !keys.contains(i)) {
                    keys.push(i);
                }
            }
        }
        // Each value's text as the stream sends it (the type's output function), which
        // `::text` is for every type but boolean: its cast says `true`, the stream `t`.
        // A mapping reading it (a composite ID's part, `filed::text`) must see one text
        // from both, or a backfilled row gets another event ID than the streamed one.
        let select: Vec<String> = columns
            .iter()
            .map(|(n, oid, _)| match *oid {
                oid::BOOL => format!(
                    "case {c} when true then 't' when false then 'f' end",
                    c = quote_ident(n)
                ),
                _ => format!("{}::text", quote_ident(n)),
            })
            .collect();
        let key_cols: Vec<String> = keys.iter().map(|&k| quote_ident(&columns[k].0)).collect();
        let key_params: Vec<String> = keys
            .iter()
            .enumerate()
            .map(|(n, &k)| format!("($1::text[])[{}]::{}", n + 1, columns[k].2))
            .collect();
        let not_null = if keys.is_empty() {
            "true".to_owned()
        } else {
            key_cols
                .iter()
                .map(|c| format!("{c} is not null"))
                .collect::<Vec<_>>()
                .join(" and ")
        };
        let place = "tableoid, ctid";
        let at = "$4::text::oid, $5::text::tid";
        // The order names the table's columns qualified: a bare name in `order by` is the
        // select list's column of that name first, and those are the values as text
        // (`"n"::text`, `ctid::text`), which sort otherwise than the keyset compares
        // them (`'10' < '9'`, `'(0,10)' < '(0,9)'`): a page would end past rows the next
        // one skips.
        let qualify = |c: &str| format!("{}.{c}", table.quoted());
        let place_order = format!("{}, {}", qualify("tableoid"), qualify("ctid"));
        let key_order: Vec<String> = key_cols.iter().map(|c| qualify(c)).collect();
        let (order, after) = if keys.is_empty() {
            // `$1` (no keys) is named only so the parameter list stays one.
            (
                place_order,
                format!("coalesce(cardinality($1::text[]), 0) = 0 and ({place}) > ({at})"),
            )
        } else {
            (
                format!("{}, {place_order}", key_order.join(", ")),
                format!(
                    "({}, {place}) > ({}, {at})",
                    key_cols.join(", "),
                    key_params.join(", ")
                ),
            )
        };
        let values = select.join(", ");
        let since = "($4::text is null or age(xmin) <= age($4::text::xid) or xmin = '2'::xid)";
        let paging = match keys.is_empty() {
            false => Paging::Keyset,
            true => {
                let tables = source
                    .query(TABLES, &[&table.quoted()])
                    .await
                    .map_err(StoreError::db("reading the outbox's partitions"))?;
                let mut statements = Vec::with_capacity(tables.len());
                for t in &tables {
                    let name: String = t.of("pg_class").col(0)?;
                    let sql = format!(
                        "select {values}, tableoid::text, ctid::text, \
                         md5($3::text || row({values})::text)::uuid \
                         from only {name} where ctid >= $1::text::tid and ctid < $2::text::tid \
                         and {since} order by ctid"
                    );
                    statements.push((name, sql));
                }
                Paging::Blocks(statements)
            }
        };
        let sql = format!(
            "select {values}, tableoid::text, ctid::text, md5($3::text || row({values})::text)::uuid \
             from {} where {not_null} and ($5::text is null or {after}) \
             and ($6::text is null or age(xmin) <= age($6::text::xid) or xmin = '2'::xid) \
             order by {order} limit $2",
            table.quoted()
        );
        let skipped = format!(
            "select count(*) from {} where not ({not_null})",
            table.quoted()
        );
        Ok(Pager {
            mapping,
            sql,
            table: table.to_string(),
            skipped,
            keys,
            since_xid: None,
            paging,
        })
    }

    /// A page's row as events (or the dead letters they would be).
    fn map(&self, row: &PageRow) -> Mapped {
        let tuple = Tuple {
            columns: row
                .values
                .iter()
                .map(|v| {
                    v.as_deref()
                        .map_or(Column::Null, |s| Column::Text(s.as_bytes()))
                })
                .collect(),
        };
        let tx = TxContext {
            commit_lsn: Lsn::ZERO,
            commit_time: None,
        };
        let origin = RowOrigin::Backfill { digest: row.digest };
        self.mapping.map(&tuple, tx, Some(origin))
    }

    /// Where the next keyset page starts: after the last row of `rows` (not empty).
    /// Rows with a null key value are not paged (a keyset cannot pass them).
    fn after(&self, rows: &[PageRow]) -> Cursor {
        let last = rows.last().expect("a non-empty page");
        Cursor::Keyset {
            keys: self.keys.iter().map(|&k| last.values[k].clone()).collect(),
            table: last.table.clone(),
            ctid: last.ctid.clone(),
        }
    }

    /// The page after `cursor` (`None`: the first), and where the next one starts; no
    /// rows: the outbox is read to its end.
    async fn page(
        &self,
        source: &Client,
        cursor: Option<&Cursor>,
        batch: i64,
    ) -> Result<(Vec<PageRow>, Cursor), SourceError> {
        let tables = match &self.paging {
            Paging::Keyset => {
                let rows = self.keyset_page(source, cursor, batch).await?;
                let next = match rows.is_empty() {
                    // Not read on: no rows is the end.
                    true => Cursor::Blocks(Blocks::START),
                    false => self.after(&rows),
                };
                return Ok((rows, next));
            }
            Paging::Blocks(tables) => tables,
        };
        let mut at = match cursor {
            Some(Cursor::Blocks(b)) => *b,
            _ => Blocks::START,
        };
        loop {
            let Some((name, sql)) = tables.get(at.table) else {
                return Ok((Vec::new(), Cursor::Blocks(at)));
            };
            if at.block >= at.known {
                // Asked again at the end: rows inserted meanwhile are read too, as a
                // keyset page would.
                at.known = source
                    .query_one(BLOCKS, &[name])
                    .await
                    .map_err(StoreError::db("reading the size of an outbox table"))?
                    .of("the outbox")
                    .col(0)?;
                if at.block >= at.known {
                    at = Blocks {
                        table: at.table + 1,
                        ..Blocks::START
                    };
                    continue;
                }
            }
            let end = at.block.saturating_add(at.span);
            let (from, to) = (format!("({},0)", at.block), format!("({end},0)"));
            let rows = self
                .read(source, sql, &[&from, &to, &self.table, &self.since_xid])
                .await?;
            at.span = at.next_span(rows.len(), batch);
            at.block = end;
            if !rows.is_empty() {
                return Ok((rows, Cursor::Blocks(at)));
            }
        }
    }

    async fn keyset_page(
        &self,
        source: &Client,
        cursor: Option<&Cursor>,
        batch: i64,
    ) -> Result<Vec<PageRow>, SourceError> {
        // No cursor (the first page): all null, every row qualifies.
        let (keys, table, ctid) = match cursor {
            Some(Cursor::Keyset { keys, table, ctid }) => (
                Some(keys.clone()),
                Some(table.as_str()),
                Some(ctid.as_str()),
            ),
            _ => (None, None, None),
        };
        self.read(
            source,
            &self.sql,
            &[&keys, &batch, &self.table, &table, &ctid, &self.since_xid],
        )
        .await
    }

    /// Runs a page's statement: the columns as text, then the row's table, place and
    /// digest.
    async fn read(
        &self,
        source: &Client,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<PageRow>, SourceError> {
        let rows = source.query(sql, params).await.map_err(|e| {
            let context = if walfold_event::is_insufficient_privilege(walfold_pg::sqlstate(&e)) {
                format!(
                    "reading an outbox page (grant select on {} to the source role, then \
                     run the backfill again; what it appended is recognised)",
                    self.table
                )
            } else {
                "reading an outbox page".into()
            };
            SourceError::from(StoreError::db(context)(e))
        })?;
        rows.iter()
            .map(|row| {
                let n = row.len() - 3;
                let r = row.of("the outbox");
                Ok(PageRow {
                    values: (0..n)
                        .map(|i| r.col::<Option<String>>(i))
                        .collect::<Result<_, _>>()?,
                    table: r.col(n)?,
                    ctid: r.col(n + 1)?,
                    digest: r.col(n + 2)?,
                })
            })
            .collect::<Result<_, StoreError>>()
            .map_err(SourceError::from)
    }
}

/// The columns of `table` (name, type OID, its type as `format_type` writes it) and the
/// relation a stream would describe it by, for reading its rows as the stream sends them.
pub(crate) async fn table_relation(
    client: &Client,
    table: &walfold_config::QualifiedName,
) -> Result<(Vec<(String, u32, String)>, Relation), SourceError> {
    let rows = client
        .query(
            "select a.attname::text, a.atttypid::int8, format_type(a.atttypid, a.atttypmod) \
             from pg_attribute a where a.attrelid = $1::text::regclass \
             and a.attnum > 0 and not a.attisdropped order by a.attnum",
            &[&table.quoted()],
        )
        .await
        .map_err(StoreError::db("reading the outbox's columns"))?;
    let columns: Vec<(String, u32, String)> = rows
        .iter()
        .map(|r| {
            let r = r.of("pg_attribute");
            Ok((r.col(0)?, r.col::<i64>(1)? as u32, r.col(2)?))
        })
        .collect::<Result<_, StoreError>>()?;
    let relation = Relation {
        xid: None,
        id: 0,
        namespace: table.schema.clone(),
        name: table.name.clone(),
        replica_identity: b'd',
        columns: columns
            .iter()
            .map(|(name, type_oid, _)| RelationColumn {
                flags: 0,
                name: name.clone(),
                type_oid: *type_oid,
                type_modifier: -1,
            })
            .collect(),
    };
    Ok((columns, relation))
}

#[cfg(test)]
mod tests {
    use super::{Blocks, MAX_SPAN};

    fn at(span: i64) -> Blocks {
        Blocks {
            span,
            ..Blocks::START
        }
    }

    #[test]
    fn a_range_widens_over_empty_blocks_and_fits_the_batch_by_density() {
        assert_eq!(at(1).next_span(0, 1000), 4);
        assert_eq!(at(MAX_SPAN).next_span(0, 1000), MAX_SPAN);
        // 40 rows a block: 25 blocks hold a batch of 1000, reached four-fold at most.
        assert_eq!(at(4).next_span(160, 1000), 16);
        assert_eq!(at(16).next_span(640, 1000), 25);
        assert_eq!(at(25).next_span(1000, 1000), 25);
        // Denser than thought: narrower at once, never below one block.
        assert_eq!(at(25).next_span(5000, 1000), 5);
        assert_eq!(at(1).next_span(291, 100), 1);
    }
}

//! The twin tables every case compares, and the events they apply.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use uuid::Uuid;
use walfold_config::{ProjectionConfig, ProjectionKind, QualifiedName, Statement};
use walfold_engine::{Applied, Event, Projection, SqlProjection};
use walfold_event::Lsn;
use walfold_tempdb::Cluster;

pub(crate) fn projection(table: &str, key: &str, columns: &[(&str, String)]) -> SqlProjection {
    let mut options = ProjectionConfig::new("state", "state.v1");
    let columns: BTreeMap<String, String> = columns
        .iter()
        .map(|(c, e)| ((*c).to_owned(), e.clone()))
        .collect();
    options.kind = ProjectionKind::Table {
        table: QualifiedName::parse(table).expect("a table name"),
        key: key.to_owned(),
        version_column: "version".to_owned(),
        columns,
    };
    let statement = options.statement(0).expect("a table projection");
    assert!(matches!(statement, Statement::Table(_)));
    SqlProjection::new(&statement, &walfold_store::Schema::new("walfold")).expect("compiles")
}

pub(crate) fn ev(seq: i64, id: &str, version: i64, payload: Value) -> Event {
    Event {
        seq,
        claim_seq: seq,
        id: Uuid::from_u128(seq as u128),
        aggregate_type: "order".into(),
        aggregate_id: id.into(),
        event_type: "OrderChanged".into(),
        version: Some(version),
        payload: payload.into(),
        headers: None,
        occurred_at: None,
        source_lsn: Lsn::ZERO,
        committed_at: None,
        source: "default".into(),
    }
}

/// Events `(id, version, status)` numbered from `first`.
pub(crate) fn evs(first: i64, list: &[(&str, i64, &str)]) -> Vec<Event> {
    list.iter()
        .enumerate()
        .map(|(i, (id, v, s))| ev(first + i as i64, id, *v, json!({"status": s, "n": i})))
        .collect()
}

pub(crate) type Outcome = Result<Vec<Applied>, String>;

pub(crate) struct Twin {
    pub db: String,
    pub client: tokio_postgres::Client,
    pub fast: SqlProjection,
    pub slow: SqlProjection,
}

/// `ddl` and `setup` and each column expression are written for a table `{t}`; each is
/// run once for `fast` and once for `slow` (which then gets the no-op trigger).
pub(crate) async fn twin(prefix: &str, ddl: &str, key: &str, columns: &[(&str, &str)]) -> Twin {
    let cluster = Cluster::shared();
    let db = cluster.create_database(prefix).expect("database");
    cluster
        .psql(
            &db,
            "create schema walfold;
             create function walfold_test_noop() returns trigger language plpgsql as
               $$ begin return new; end $$;",
        )
        .expect("walfold schema");
    for t in ["fast", "slow"] {
        cluster
            .psql(&db, &ddl.replace("{t}", t))
            .unwrap_or_else(|e| panic!("ddl for {t}: {e}"));
    }
    cluster
        .psql(
            &db,
            "create trigger keep_the_loop before insert or update on slow
               for each row execute function walfold_test_noop();",
        )
        .expect("trigger");
    let mut client = walfold_pg::connect(&cluster.url(&db))
        .await
        .expect("connect");
    let cols = |t: &str| -> Vec<(&str, String)> {
        columns
            .iter()
            .map(|(c, e)| (*c, e.replace("{t}", t)))
            .collect()
    };
    let fast = projection("public.fast", key, &cols("fast"));
    let slow = projection("public.slow", key, &cols("slow"));
    install_pair(&mut client, &fast, &slow, prefix).await;
    Twin {
        db,
        client,
        fast,
        slow,
    }
}

/// Installs both; `slow` must keep the loop (its no-op trigger or other obstacle).
pub(crate) async fn install_pair(
    client: &mut tokio_postgres::Client,
    fast: &SqlProjection,
    slow: &SqlProjection,
    tag: &str,
) {
    fast.install(client).await.expect("install fast");
    slow.install(client).await.expect("install slow");
    assert!(!slow.applies_in_rounds(), "the twin keeps the loop");
    eprintln!("[{tag}] rounds chosen: {}", fast.applies_in_rounds());
}

/// Applies `batch` with each; returns (rounds' outcome, loop's outcome).
pub(crate) async fn apply_pair(
    client: &mut tokio_postgres::Client,
    fast: &SqlProjection,
    slow: &SqlProjection,
    batch: &[Event],
) -> (Outcome, Outcome) {
    let f = apply(client, fast, batch).await;
    let s = apply(client, slow, batch).await;
    eprintln!("  rounds: {f:?}\n  loop:   {s:?}");
    (f, s)
}

async fn apply(
    client: &mut tokio_postgres::Client,
    p: &SqlProjection,
    events: &[Event],
) -> Outcome {
    let refs: Vec<&Event> = events.iter().collect();
    let tx = client.transaction().await.expect("begin");
    match p.apply_batch(&tx, &refs).await {
        Ok(applied) => {
            tx.commit().await.expect("commit");
            Ok(applied)
        }
        Err(e) => Err(format!("{:?} {:?}", e.kind(), e.sqlstate())),
    }
}

impl Twin {
    pub fn rows(&self, table: &str) -> String {
        Cluster::shared()
            .psql(
                &self.db,
                &format!(
                    "select coalesce(string_agg(row_to_json(x)::text, ' ' order by row_to_json(x)::text), '') \
                     from {table} x"
                ),
            )
            .expect("rows")
            .trim()
            .to_owned()
    }

    pub fn sql(&self, sql: &str) {
        for t in ["fast", "slow"] {
            Cluster::shared()
                .psql(&self.db, &sql.replace("{t}", t))
                .expect("sql");
        }
    }

    /// Applies `batch` to both; returns (rounds' outcome, loop's outcome).
    pub async fn both(&mut self, batch: &[Event]) -> (Outcome, Outcome) {
        apply_pair(&mut self.client, &self.fast, &self.slow, batch).await
    }

    /// Applies each batch to both and asserts outcomes equal after each, rows at the end.
    pub async fn same(&mut self, batches: &[Vec<Event>]) {
        for (i, batch) in batches.iter().enumerate() {
            let (f, s) = self.both(batch).await;
            assert_eq!(f, s, "batch {i}: outcomes of rounds vs loop");
        }
        let (f, s) = (self.rows("fast"), self.rows("slow"));
        eprintln!("  rows fast: {f}\n  rows slow: {s}");
        assert_eq!(f, s, "rows of rounds vs loop");
    }
}

pub(crate) const STATUS: &[(&str, &str)] = &[("status", ":payload.status")];

//! Using walfold as a library: a projection written in Rust runs on the same engine,
//! with the engine's claims and the projection's version guard.

use std::sync::Arc;

use walfold_config::{Config, ProjectionConfig};
use walfold_engine::Pipeline;
use walfold_examples::{AccountBalance, DDL};
use walfold_tests::{caught_up, slot_active, status, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_projection_credits_once_and_respects_versions() {
    let db = TestDb::new("library");
    db.psql(DDL);
    let config = Config::from_toml(&db.config(""), Vec::<(String, String)>::new()).unwrap();
    let mut options = ProjectionConfig::new("account_balance", "accounts.balance.v1");
    options.event_types = Some(vec!["AccountCredited".into(), "AccountDebited".into()]);
    options.parallelism = 2;
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(
        Pipeline::new(config)
            .with_projection(options, Arc::new(AccountBalance))
            .run(cancel.clone()),
    );
    let client = db.client().await;
    slot_active(&client).await;
    let credit = |id: u32, account: &str, version: i64, cents: i64, kind: &str| {
        format!(
            "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) values \
             ('00000000-0000-4000-8000-{id:012}', 'account', '{account}', '{kind}', {version}, '{{\"amount_cents\": {cents}}}');"
        )
    };
    db.psql(&format!(
        "begin; {} {} {} commit;",
        credit(1, "acc-1", 1, 10_000, "AccountCredited"),
        credit(2, "acc-1", 2, 2_500, "AccountDebited"),
        credit(3, "acc-2", 1, 700, "AccountCredited"),
    ));
    // A redelivered credit (same event ID) and a late, older event.
    db.psql(&credit(1, "acc-1", 1, 10_000, "AccountCredited"));
    db.psql(&credit(4, "acc-2", 1, 999, "AccountCredited"));
    caught_up(&client, 4, 4).await;
    assert_eq!(
        db.psql("select string_agg(account_id || '=' || balance_cents || '@' || version, ',' order by account_id) from account_balance"),
        "acc-1=7500@2,acc-2=700@1"
    );
    let s = status(&client).await.unwrap();
    let sub = s
        .subscribers
        .iter()
        .find(|x| x.subscriber == "accounts.balance.v1")
        .unwrap();
    assert_eq!((sub.applied, sub.stale, sub.partitions), (3, 1, 2));
    cancel.cancel();
    task.await.unwrap().unwrap();
}

/// A projection whose `apply` panics: a bug, not an event's fault.
struct Panics;

impl walfold_engine::Projection for Panics {
    fn apply<'a>(
        &'a self,
        _tx: &'a tokio_postgres::Transaction<'a>,
        _event: &'a walfold_engine::Event,
    ) -> futures::future::BoxFuture<
        'a,
        Result<walfold_engine::Applied, walfold_engine::ProjectionError>,
    > {
        Box::pin(async { panic!("the projection's bug") })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_projection_is_validated_like_a_config_projection() {
    let toml =
        "[source]\nurl = \"postgresql://walfold@localhost/app\"\n[[outbox]]\ntable = \"outbox\"\n";
    let config = Config::from_toml(toml, Vec::<(String, String)>::new()).unwrap();
    let mut options = ProjectionConfig::new("panics", "panics.v1");
    options.parallelism = 0;
    // Refused before any database is touched (none answers at that URL).
    let err = Pipeline::new(config)
        .with_projection(options, Arc::new(Panics))
        .run(tokio_util::sync::CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, walfold_engine::EngineError::Config(c)
            if c.problems().iter().any(|p| p.key == "with_projection(\"panics\").parallelism")),
        "{err}"
    );
    assert_eq!(err.kind(), walfold_event::ErrorKind::Definite);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_rust_projection_stops_the_pipeline_naming_its_task() {
    let db = TestDb::new("library_panic");
    let config = Config::from_toml(&db.config(""), Vec::<(String, String)>::new()).unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(
        Pipeline::new(config)
            .with_projection(
                ProjectionConfig::new("panics", "panics.v1"),
                Arc::new(Panics),
            )
            .run(cancel.clone()),
    );
    let client = db.client().await;
    slot_active(&client).await;
    db.psql(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) values \
         ('00000000-0000-4000-8000-000000000001', 'account', 'acc-1', 'AccountCredited', 1, '{}');",
    );
    let result = tokio::time::timeout(std::time::Duration::from_secs(60), task)
        .await
        .expect("the pipeline stops")
        .unwrap();
    match result {
        Err(walfold_engine::EngineError::Panicked { task, message }) => {
            assert_eq!(task, "panics[0]");
            assert_eq!(message, "the projection's bug");
        }
        other => panic!("expected a panic of the projector, got {other:?}"),
    }
}

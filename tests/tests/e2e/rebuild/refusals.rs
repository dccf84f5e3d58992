//! What would replay wrongly is refused up front: a new subscriber ID for a table
//! another one built, a statement naming its live table.

use walfold_tests::{count, difference, Daemon, TestDb};

use super::{
    config, projected, rebuild_state, start_rebuild, subscriber_caught_up, TOTALS_FROM_LOG,
};

/// A new `subscriber` in the config for a table another subscriber built would apply
/// every event to it again (a running total doubles): refused, naming the rebuild that
/// moves it; once the table is empty, the new ID starts over from the first event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_subscriber_id_is_refused_for_a_table_another_one_built() {
    let db = TestDb::new("newsub");
    let text = config(&db, "");
    let (mut d, client) = projected(&db, &text, 2_000, 50, "orders.total.v1").await;
    d.kill();
    let renamed = text.replace("orders.total.v1", "orders.total.v9");
    let mut refused = Daemon::start(&renamed, &[]);
    let code = refused.wait_exit("the daemon to refuse the new ID").await;
    assert_ne!(code, Some(0), "{}", refused.log_text());
    let log = refused.log_text();
    assert!(
        log.contains("rebuild order_total --subscriber orders.total.v9"),
        "{log}"
    );
    assert_eq!(
        count(
            &client,
            "select count(*) from walfold.checkpoint where subscriber_id = 'orders.total.v9'"
        )
        .await,
        0,
        "the new ID applied nothing"
    );
    let totals = || {
        difference(
            &client,
            "select order_id, total from order_total",
            TOTALS_FROM_LOG,
        )
    };
    assert_eq!(totals().await, 0, "the totals are untouched");

    // Emptied, the table is rebuilt from the first event under the new ID, once.
    db.psql("truncate order_total");
    let (_d, _) = Daemon::streaming(&db, &renamed).await;
    subscriber_caught_up(&client, "orders.total.v9", 60).await;
    assert_eq!(
        totals().await,
        0,
        "every event applied once under the new ID"
    );
    assert_eq!(
        db.psql("select subscriber_id from walfold.projection where name = 'order_total'"),
        "orders.total.v9"
    );
}

/// A statement that names its live table besides `{table}` cannot run on the rebuild's
/// shadow table: `walfold rebuild` refuses it up front (saying to use an alias) and
/// leaves nothing behind, instead of a replay that fails at every batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_whose_statement_names_the_live_table_is_refused_up_front() {
    let db = TestDb::new("unaliased");
    let text = config(&db, "").replace(
        "insert into {table} as t (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))\n\
         on conflict (order_id) do update set total = t.total + excluded.total",
        "insert into {table} (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))\n\
         on conflict (order_id) do update set total = order_total.total + excluded.total",
    );
    assert!(text.contains("order_total.total"), "{text}");
    let (d, client) = projected(&db, &text, 200, 10, "orders.total.v1").await;
    let (code, _, err) = start_rebuild(d.config_path(), "order_total", "orders.total.v2");
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("order_total__rebuild") && err.contains("alias"),
        "{err}"
    );
    assert_eq!(
        db.psql("select to_regclass('order_total__rebuild') is null"),
        "t"
    );
    assert_eq!(rebuild_state(&client, "orders.total.v2").await, "-");
    // The live projection goes on.
    db.psql(&walfold_tests::insert_event(
        "00000000-0000-4000-8000-0000000000c1",
        "o-1",
        "OrderChanged",
        99,
        r#"{"amount": "5"}"#,
    ));
    subscriber_caught_up(&client, "orders.total.v1", 60).await;
    assert_eq!(
        difference(
            &client,
            "select order_id, total from order_total",
            TOTALS_FROM_LOG
        )
        .await,
        0
    );
}

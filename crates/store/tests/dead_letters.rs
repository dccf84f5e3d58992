//! Recording an ingest dead letter looks for the same raw row recorded under the other
//! kind of identity (streamed or backfilled): through an index, so a transaction of many
//! malformed rows costs each the same, not one look at every earlier letter (a stranger's
//! 100k malformed rows held ingest for 34 minutes).

use walfold_event::{DeadLetter, Lsn, Reason, RowOrigin};
use walfold_store::{DeadLetters, Schema};
use walfold_tempdb::Cluster;

#[tokio::test]
async fn an_ingest_dead_letter_finds_its_raw_row_through_an_index() {
    let cluster = Cluster::shared();
    let db = cluster.create_database("dl_raw").expect("database");
    let url = cluster.url(&db);
    let schema = Schema::new("walfold");
    walfold_store::migrate(&url, &schema)
        .await
        .expect("migrate");
    cluster
        .psql(
            &db,
            "insert into walfold.dead_letter (reason, error, raw, change_lsn, change_index, \
             source, status) select 'malformed', 'x', jsonb_build_object('g', g, 'pad', \
             repeat('q', 500)), ('0/' || to_hex(100000 + g))::pg_lsn, 0, 'default', 'open' \
             from generate_series(1, 20000) g; analyze walfold.dead_letter;",
        )
        .expect("letters");
    let client = walfold_pg::connect(&url).await.expect("connect");
    let letters = DeadLetters::prepare_for(&client, &schema, Some("default"))
        .await
        .expect("prepare");
    let letter = |lsn: u64, g: i64| DeadLetter {
        subscriber_id: None,
        event_id: None,
        seq: None,
        aggregate_type: None,
        aggregate_id: None,
        reason: Reason::Malformed,
        error: "missing aggregate_id".into(),
        raw: Some(serde_json::json!({ "g": g, "pad": "q".repeat(500) })),
        existing: None,
        attempts: 1,
        source_lsn: Some(Lsn(lsn)),
        origin: Some(RowOrigin::Wal {
            lsn: Lsn(lsn),
            index: 0,
            element: 0,
        }),
    };
    let scans = || async {
        client
            .query_one("select pg_stat_force_next_flush()", &[])
            .await
            .expect("flush");
        client
            .query_one(
                "select idx_scan from pg_stat_user_indexes \
                 where indexrelname = 'dead_letter_ingest_raw'",
                &[],
            )
            .await
            .expect("index stats")
            .get::<_, i64>(0)
    };
    // The generic plan, which the server keeps for the prepared statement after five
    // executions: it cannot tell a streamed row from a backfilled one, so it looked at
    // every ingest letter (custom plans use the backfilled rows' small partial index).
    client
        .batch_execute("set plan_cache_mode = force_generic_plan")
        .await
        .expect("generic plans");
    let before = scans().await;
    for n in 0..8u64 {
        let id = letters
            .record(&client, &letter(0x1_0000_0000 + n, 1_000_000 + n as i64))
            .await
            .expect("record");
        assert!(id.is_some(), "recorded");
    }
    assert!(
        scans().await >= before + 8,
        "the look went through the index"
    );
    // Recorded once: the same change again is not a second letter.
    let again = letters
        .record(&client, &letter(0x1_0000_0000, 1_000_000))
        .await
        .expect("record");
    assert_eq!(again, None);
}

//! `walfold phantoms list` finds the subscribers that claimed each phantom through the
//! claims' `(subscriber_id, seq)` index: the claims a target keeps grow with history,
//! and an operator lists phantoms right after a failover.

use uuid::Uuid;
use walfold_store::{Operator, Schema};
use walfold_tempdb::Cluster;

#[tokio::test]
async fn the_subscribers_that_claimed_a_phantom_are_found_without_reading_every_claim() {
    let cluster = Cluster::shared();
    let db = cluster.create_database("phantom_claims").expect("database");
    let url = cluster.url(&db);
    let schema = Schema::new("walfold");
    walfold_store::migrate(&url, &schema)
        .await
        .expect("migrate");
    // 3 subscribers × 40 000 claims on seqs 1..=40 000 (IDs derived from the seq), and
    // one claim made before the seq key (seq null), by its ID only.
    let id = |seq: i64| Uuid::from_u64_pair(0x5eed, seq as u64);
    cluster
        .psql(
            &db,
            "insert into walfold.processed_message (subscriber_id, seq, message_id) \
             select s, i, ('00000000-0000-5eed-0000-' || lpad(to_hex(i), 12, '0'))::uuid \
             from unnest(array['a.v1', 'b.v1', 'c.v1']) s, generate_series(1, 40000) i \
             where not (s = 'c.v1' and i = 777); \
             alter table walfold.processed_message drop constraint processed_message_claimed_by_seq; \
             insert into walfold.processed_message (subscriber_id, seq, message_id) \
             values ('old.v1', null, '00000000-0000-5eed-0000-00000000beef'); \
             alter table walfold.processed_message add constraint processed_message_claimed_by_seq \
             check (seq is not null) not valid; \
             analyze walfold.processed_message",
        )
        .expect("claims");
    let operator = Operator::connect(&url, &schema).await.expect("operator");
    let scans = || async {
        let client = walfold_pg::connect(&url).await.expect("connect");
        client
            .batch_execute("select pg_stat_clear_snapshot()")
            .await
            .unwrap();
        let row = client
            .query_one(
                "select seq_scan from pg_stat_user_tables \
                 where relid = 'walfold.processed_message'::regclass",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0)
    };
    let before = scans().await;
    let mut found = operator
        .claimed(&[(id(777), 777), (id(40_000), 40_000), (id(0xbeef), 0xbeef)])
        .await
        .expect("claimed");
    found.sort();
    // Flush this session's statistics (its scans) before they are read elsewhere.
    operator
        .client()
        .batch_execute("select pg_stat_force_next_flush()")
        .await
        .unwrap();
    operator.client().batch_execute("select 1").await.unwrap();
    let mut expected = vec![
        (id(777), "a.v1".to_owned()),
        (id(777), "b.v1".to_owned()),
        (id(40_000), "a.v1".to_owned()),
        (id(40_000), "b.v1".to_owned()),
        (id(40_000), "c.v1".to_owned()),
        (id(0xbeef), "old.v1".to_owned()),
    ];
    expected.sort();
    assert_eq!(found, expected);
    assert_eq!(scans().await, before, "a sequential scan of the claims");
    // A seq claimed for another ID is not a claim of this one.
    assert_eq!(
        operator
            .claimed(&[(Uuid::nil(), 5)])
            .await
            .expect("claimed"),
        vec![]
    );
}

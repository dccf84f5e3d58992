//! A projector's page of the event log is cut by payload bytes as well as rows: an event
//! larger than the bound is read alone, and a page cut short says where it stopped.

use walfold_store::{read_page, read_sql, Filter, Schema};
use walfold_tempdb::Cluster;

fn all() -> Filter {
    Filter {
        partition: 0,
        partitions: 1,
        event_types: None,
        aggregate_types: None,
        sources: None,
    }
}

#[tokio::test]
async fn pages_are_cut_by_bytes_and_a_larger_event_comes_alone() {
    let cluster = Cluster::shared();
    let db = cluster.create_database("pages").expect("database");
    let url = cluster.url(&db);
    let schema = Schema::new("walfold");
    walfold_store::migrate(&url, &schema)
        .await
        .expect("migrate");
    // Payload sizes: 1 KB, 1 KB, 3 KB (larger than the bound), 1 KB, 1 KB, 1 KB, and
    // one appended before `bytes` was recorded (its stored size counts).
    let sizes = [1000, 1000, 3000, 1000, 1000, 1000];
    let mut sql = String::new();
    for (i, size) in sizes.iter().enumerate() {
        let seq = i + 1;
        sql.push_str(&format!(
            "insert into walfold.event_log (seq, event_id, aggregate_type, aggregate_id, \
             event_type, payload, partition_hash, source_lsn, source, bytes) values ({seq}, \
             gen_random_uuid(), 'a', 'a{seq}', 't', jsonb_build_object('s', repeat('x', {})), \
             0, '0/1', 'default', {size});",
            size - 10
        ));
    }
    sql.push_str(
        "insert into walfold.event_log (seq, event_id, aggregate_type, aggregate_id, \
         event_type, payload, partition_hash, source_lsn, source) values (7, \
         gen_random_uuid(), 'a', 'a7', 't', jsonb_build_object('s', repeat(md5('x'), 100)), \
         0, '0/1', 'default');",
    );
    cluster.psql(&db, &sql).expect("events");
    let client = walfold_pg::connect(&url).await.expect("connect");
    let sql = read_sql(&schema);
    let read = |after: i64| {
        let (client, sql) = (&client, &sql);
        async move {
            read_page(client, sql, after, &all(), 100, 2500)
                .await
                .expect("page")
        }
    };
    let seqs = |p: &walfold_store::Page| p.events.iter().map(|e| e.seq).collect::<Vec<_>>();
    let page = read(0).await;
    assert_eq!(seqs(&page), [1, 2], "cut at 2500 bytes");
    assert_eq!((page.position, page.caught_up), (2, false));
    let page = read(2).await;
    assert_eq!(seqs(&page), [3], "larger than the bound: alone");
    assert_eq!((page.position, page.caught_up), (3, false));
    assert!(page.bytes > 2500);
    let page = read(3).await;
    assert_eq!(seqs(&page), [4, 5]);
    let page = read(5).await;
    assert_eq!(
        seqs(&page),
        [6, 7],
        "the last event counts as its stored size"
    );
    assert_eq!((page.position, page.caught_up), (7, true));
    // In rows as before.
    let page = read_page(&client, &sql, 0, &all(), 1, 1 << 20)
        .await
        .unwrap();
    assert_eq!((seqs(&page), page.position), (vec![1], 1));
}

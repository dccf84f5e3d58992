//! What `walfold init` will not write silently for a framework whose rows carry no
//! aggregate and hold one row per event and per listener (Spring Modulith, on a table
//! without rows yet): it stops and asks for `--where` rather than fold each event once
//! per listener; the aggregate ID it cannot propose is written as the stand-in it is,
//! marked in the file and on standard output; a `table` projection keyed on it is
//! refused; and `walfold doctor` warns about a projection keyed on it.

use walfold_tests::walfold;

use super::{bare_db, config, spring_modulith};

const LISTENER: &str =
    "com.example.inventory.InventoryManagement.on(com.example.order.OrderCompleted)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_asks_for_a_listener_and_marks_a_stand_in_aggregate_on_an_empty_modulith_table() {
    let db = bare_db("fw_init_standin");
    db.psql(spring_modulith::DDL);
    db.psql(
        "create table order_view (order_id text primary key, status text, version bigint not null)",
    );
    let dir = std::env::temp_dir().join(format!("walfold-init-standin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = |n: &str| {
        let p = dir.join(n);
        let _ = std::fs::remove_file(&p);
        p.to_str().unwrap().to_owned()
    };
    let url = db.url();
    let base = [
        "init",
        "--url",
        url.as_str(),
        "--table",
        "public.event_publication",
    ];
    let run = |extra: &[&str], out: &str| {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(["-o", out]);
        args.extend(extra);
        walfold(&args, &[])
    };

    // No rows to pick a listener from: init stops and asks, writing nothing.
    let first = path("first.toml");
    let (code, out, err) = run(&[], &first);
    assert_eq!(code, 2, "{out}\n{err}");
    for part in [
        "one row per event and per listener_id",
        "no rows yet to pick one listener_id from",
        "--where \"listener_id = '…'\"",
    ] {
        assert!(err.contains(part), "no `{part}` in:\n{err}");
    }
    assert!(!std::path::Path::new(&first).exists());

    // With the listener named: written, the aggregate ID a stand-in, marked as one.
    let listener = format!("listener_id = '{LISTENER}'");
    let second = path("second.toml");
    let (code, out, err) = run(&["--where", &listener], &second);
    assert_eq!(code, 0, "{out}\n{err}");
    let text = std::fs::read_to_string(&second).unwrap();
    for part in [
        &format!("where = \"{listener}\"\n"),
        "# STAND-IN: aggregate_id is the publication's own `id`",
        "aggregate_id = \"id\"\n",
    ] {
        assert!(text.contains(part), "no `{part}` in:\n{text}");
    }
    assert!(out.contains("aggregate_id: STAND-IN `id`"), "{out}");

    // A `table` projection keyed on the stand-in: refused, saying why.
    let third = path("third.toml");
    let (code, out, err) = run(
        &["--where", &listener, "--read-model", "public.order_view"],
        &third,
    );
    assert_eq!(code, 2, "{out}\n{err}");
    for part in [
        "keyed on the aggregate ID",
        "stand-in, `id`",
        "--aggregate-id",
    ] {
        assert!(err.contains(part), "no `{part}` in:\n{err}");
    }
    assert!(!std::path::Path::new(&third).exists());

    // doctor warns about a projection keyed on the stand-in, and not once it is set.
    let outbox = &text[text.find("[[outbox]]").unwrap()..text.find("[target]").unwrap()];
    let projection = "[[projection]]\nname = \"orders\"\nsubscriber = \"orders.v1\"\n\
        sql = \"insert into customer_revenue (customer_id, orders, total) values (:aggregate_id, 1, 0) on conflict do nothing\"\n";
    let doctor = |outbox: &str| {
        let cfg = walfold_tests::write_config(&config(
            &db,
            "standin",
            &format!("{outbox}\n{projection}"),
        ));
        walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]).1
    };
    let out = doctor(outbox);
    for part in [
        "projection orders is keyed on the aggregate ID",
        "aggregate_id is a stand-in, `id`",
        "one read-model row per message",
    ] {
        assert!(out.contains(part), "no `{part}` in:\n{out}");
    }
    let set = outbox.replace(
        "aggregate_id = \"id\"\n",
        "aggregate_id = \"serialized_event::jsonb->>'orderId'\"\n",
    );
    assert_ne!(set, outbox);
    let out = doctor(&set);
    assert!(!out.contains("stand-in"), "{out}");
}

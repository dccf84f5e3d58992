//! Who can write an event, and the least privilege walfold runs with: a message outbox
//! that any role can write to is refused until `pg_logical_emit_message` is revoked from
//! PUBLIC (or the config accepts it), and the least-privilege recipe of
//! `docs/SECURITY.md`, run word for word, is enough for every command.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use walfold_tempdb::{Cluster, Options};
use walfold_tests::{
    caught_up, config_builder, eventually, insert_event, slot_active, walfold, write_config,
    Daemon, TestDb, REVOKE_PUBLIC_EMIT,
};

/// `pg_logical_emit_message(true, 'walfold:accounts', …)` of a `Credited` event.
fn credit(id: u32, version: i64, amount: &str) -> String {
    format!(
        "select 'x' from pg_logical_emit_message(true, 'walfold:accounts', \
         '{{\"id\": \"00000000-0000-4000-8000-{id:012}\", \"aggregate_type\": \"account\", \
         \"aggregate_id\": \"acc-1\", \"event_type\": \"Credited\", \"version\": {version}, \
         \"payload\": {{\"amount\": \"{amount}\"}}}}');"
    )
}

/// A role that may log in to `db` and was granted nothing, connected over TCP.
async fn intruder(db: &TestDb) -> tokio_postgres::Client {
    db.psql("create role intruder login");
    let url = format!(
        "postgresql://intruder@127.0.0.1:{}/{}",
        db.cluster.port(),
        db.name
    );
    walfold_pg::connect(&url).await.expect("intruder connects")
}

/// A role with LOGIN and no grant emitted a `Credited` of a million under a message
/// outbox's prefix, and walfold folded it into the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_outbox_any_role_can_write_to_is_refused_until_emit_is_revoked() {
    let db = TestDb::new("public_emit");
    let config = db.config("\n[[outbox]]\nmessage_prefix = \"walfold:accounts\"\n");
    let overloads = db.psql(
        "select string_agg('pg_logical_emit_message(' || oidvectortypes(proargtypes) || ')', \
         ', ' order by oid) from pg_proc where proname = 'pg_logical_emit_message'",
    );
    let revoke = format!("revoke execute on function {overloads} from public");

    // PostgreSQL's default: PUBLIC may execute it. A definite refusal, before any slot.
    let mut d = Daemon::start(&config, &[]);
    assert_eq!(d.wait_exit("the daemon to refuse").await, Some(1));
    let log = d.log_text();
    for says in [
        "pg_logical_emit_message is executable by PUBLIC: any role that may log in to the \
         source database can write events into messages 'walfold:accounts'",
        &revoke,
        "set allow_public_emit = true on the [[outbox]] with message_prefix = \"walfold:accounts\"",
    ] {
        assert!(log.contains(says), "no `{says}` in:\n{log}");
    }
    assert_eq!(
        db.psql("select count(*) from pg_replication_slots where database = current_database()"),
        "0"
    );
    let (code, out, _) = walfold(&["doctor", "-c", d.config_path()], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  pg_logical_emit_message is executable by PUBLIC")
            && out.contains(&revoke),
        "{out}"
    );

    // Revoked: it runs, the producer's events fold, a role without the grant cannot emit.
    db.psql(REVOKE_PUBLIC_EMIT);
    let (code, out, _) = walfold(&["doctor", "-c", d.config_path()], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "ok    roles that may write events into messages 'walfold:accounts' (execute \
             pg_logical_emit_message): superusers only"
        ),
        "{out}"
    );
    let (mut d, client) = Daemon::streaming(&db, &config).await;
    let intruder = intruder(&db).await;
    let denied = intruder
        .batch_execute(&credit(2, 1, "1000000"))
        .await
        .expect_err("a role without the grant emits");
    assert_eq!(
        denied.code(),
        Some(&SqlState::INSUFFICIENT_PRIVILEGE),
        "{denied:?}"
    );
    db.psql(&credit(1, 1, "100"));
    caught_up(&client, 1, 3).await;
    assert_eq!(db.psql("select amount from ledger"), "100");
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));

    // Opted in: PUBLIC may emit again, and walfold follows it, warning at start.
    db.psql(
        &REVOKE_PUBLIC_EMIT
            .replace("revoke execute", "grant execute")
            .replace("from public", "to public"),
    );
    let opted = config.replace(
        "message_prefix = \"walfold:accounts\"\n",
        "message_prefix = \"walfold:accounts\"\nallow_public_emit = true\n",
    );
    assert_ne!(opted, config);
    let (d, client) = Daemon::streaming(&db, &opted).await;
    eventually(Duration::from_secs(10), "the warning", || {
        let log = d.log_text();
        async move {
            log.contains(
                "any role that may log in to the source database can write events into \
                 messages 'walfold:accounts'",
            )
        }
    })
    .await;
    let (code, out, _) = walfold(&["doctor", "-c", d.config_path()], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("warn  any role that may log in to the source database can write events"),
        "{out}"
    );
    intruder
        .batch_execute(&credit(2, 2, "1000000"))
        .await
        .unwrap();
    caught_up(&client, 2, 3).await;
    assert_eq!(db.psql("select sum(amount) from ledger"), "1000100");
}

/// `walfold init --message-prefix` writes the statements a message outbox needs; run as
/// written (the producer named), they make doctor pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_writes_the_grants_that_leave_a_message_outbox_to_its_producer() {
    let db = TestDb::new("init_emit");
    let path = write_config("");
    std::fs::remove_file(&path).unwrap();
    let file = path.to_str().unwrap();
    let url = db.url();
    let (code, out, err) = walfold(
        &[
            "init",
            "--url",
            &url,
            "--message-prefix",
            "walfold:accounts",
            "-o",
            file,
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("only the producer may write events")
            && out.contains("FAIL  pg_logical_emit_message is executable by PUBLIC"),
        "{out}"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("message_prefix = \"walfold:accounts\""),
        "{text}"
    );
    let statements: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .filter(|l| l.starts_with("revoke ") || l.starts_with("grant "))
        .collect();
    assert_eq!(statements.len(), 2, "{text}");
    db.psql("create role app_producer login");
    db.psql(
        &statements
            .join("\n")
            .replace("<producing role>", "app_producer"),
    );
    let (code, out, _) = walfold(&["doctor", "-c", file], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "ok    roles that may write events into messages 'walfold:accounts' (execute \
             pg_logical_emit_message): app_producer, and superusers"
        ),
        "{out}"
    );
}

const REPL_PASSWORD: &str = "repl-secret";
const WRITER_PASSWORD: &str = "writer-secret";

/// The least-privilege block of `docs/SECURITY.md`, as written there.
fn documented_recipe() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/SECURITY.md");
    let page = std::fs::read_to_string(path).expect("docs/SECURITY.md");
    let start = page
        .find("\n## Least privilege\n")
        .expect("docs/SECURITY.md has a Least privilege section");
    let section = &page[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    section
        .split("```sql\n")
        .skip(1)
        .map(|b| &b[..b.find("```").expect("the block closes")])
        .find(|b| b.contains("create role walfold_repl"))
        .expect("Least privilege creates walfold_repl in an sql block")
        .to_owned()
}

/// The first sql block of `docs/SECURITY.md`'s Least privilege section after `marker`.
fn page_block_after(marker: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/SECURITY.md");
    let page = std::fs::read_to_string(path).expect("docs/SECURITY.md");
    let at = page
        .find(marker)
        .expect("the marker is in docs/SECURITY.md");
    let block = &page[at..];
    let block = &block[block.find("```sql\n").expect("an sql block follows") + 7..];
    block[..block.find("```").expect("the block closes")].to_owned()
}

/// The projection the recipe's read model serves.
const ORDER_STATUS: &str = r#"
[[projection]]
name = "order_status"
subscriber = "orders.status.v1"
table = "read_model.order_status"
key = "order_id"
version_column = "version"
columns = { status = ":payload.status" }
"#;

/// The least-privilege recipe of `docs/SECURITY.md`, word for word: two scram-sha-256 roles, one that reads
/// the WAL and the outbox only (the publication made by an admin), one that owns only
/// walfold's schema and the read models' (no superuser, no create on the database). With
/// them `run`, `doctor`, `status`, `dead-letters`, `rebuild`, `prune` and `migrate` all
/// work, doctor says nothing false, and nothing of walfold's lands on the source but
/// its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_least_privilege_recipe_runs_every_command() {
    let cluster: &'static Cluster = Box::leak(Box::new(
        Cluster::start(Options {
            scram_roles: vec!["walfold_repl".into(), "walfold_writer".into()],
            ..Options::default()
        })
        .expect("private cluster"),
    ));
    let db = TestDb::on(cluster, "least");
    let recipe = documented_recipe();
    assert_eq!(recipe.matches("'…'").count(), 2, "{recipe}");
    db.psql(
        &recipe
            .replacen("'…'", &format!("'{REPL_PASSWORD}'"), 1)
            .replacen("'…'", &format!("'{WRITER_PASSWORD}'"), 1),
    );
    // What the recipe gave: scram passwords, no superuser, no create on the database.
    assert_eq!(
        db.psql(
            "select string_agg(format('%s %s %s %s', rolname, rolsuper::text, \
             rolreplication::text, (rolpassword like 'SCRAM-SHA-256$%')::text), ', ' \
             order by rolname) from pg_authid \
             where rolname like 'walfold\\_%' and rolname <> 'walfold_scram'"
        ),
        "walfold_repl false true true, walfold_writer false false true"
    );
    assert_eq!(
        db.psql(
            "select has_database_privilege('walfold_repl', current_database(), 'create') \
             or has_database_privilege('walfold_writer', current_database(), 'create')"
        ),
        "f"
    );
    let at = format!("127.0.0.1:{}/{}", cluster.port(), db.name);
    assert!(
        walfold_pg::connect(&format!("postgresql://walfold_repl@{at}"))
            .await
            .is_err(),
        "pg_hba asks these roles for their scram-sha-256 password"
    );

    // The file names the roles; the passwords come from the environment.
    let config = config_builder(&format!("postgresql://walfold_repl@{at}"))
        .set("target", "url", format!("postgresql://walfold_writer@{at}"))
        .set("log", "level", "info")
        .text(ORDER_STATUS)
        .to_toml();
    let source_url = format!("postgresql://walfold_repl:{REPL_PASSWORD}@{at}");
    let target_url = format!("postgresql://walfold_writer:{WRITER_PASSWORD}@{at}");
    let envs = [
        ("WALFOLD_SOURCE__URL", source_url.as_str()),
        ("WALFOLD_TARGET__URL", target_url.as_str()),
    ];
    let path = write_config(&config);
    let cfg = path.to_str().unwrap();
    let cli = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["-c", cfg]);
        walfold(&all, &envs)
    };
    let doctor = |when: &str| {
        let (code, out, err) = cli(&["doctor"]);
        assert_eq!(code, 0, "doctor {when}:\n{out}\n{err}");
        for says in [
            "ok    the source role \"walfold_repl\" may replicate",
            "ok    the target role \"walfold_writer\" may create walfold's tables in its schema walfold",
            "ok    publication walfold_outbox covers exactly the outbox tables",
            "ok    roles that may write events into public.outbox (insert into it, a partition of \
             it or an updatable view on it): superusers only",
            "ok    projection order_status: table read_model.order_status exists and is writable",
            "ok    projection order_status: the target role may rebuild read_model.order_status",
        ] {
            assert!(out.contains(says), "doctor {when}: no `{says}` in:\n{out}");
        }
        // Every warning is true of this server: it does not limit the WAL a slot keeps.
        let warnings: Vec<&str> = out.lines().filter(|l| l.starts_with("warn")).collect();
        assert_eq!(
            warnings,
            ["warn  max_slot_wal_keep_size = -1 (unlimited)"],
            "doctor {when}:\n{out}"
        );
    };
    doctor("before the first start");

    let mut d = Daemon::start(&config, &envs);
    let admin = db.client().await;
    slot_active(&admin).await;
    let order = |id: u32, order: &str, version: i64, status: &str| {
        insert_event(
            &format!("00000000-0000-4000-8000-{id:012}"),
            order,
            "OrderChanged",
            version,
            &format!(r#"{{"status": "{status}"}}"#),
        )
    };
    // The producer (the outbox's owner) writes; one row cannot be an event.
    db.psql(&format!(
        "{}{}{}{} insert into outbox (id, aggregate_type, aggregate_id, event_type, version, \
         payload) values (null, 'order', 'o-9', 'OrderChanged', 1, '{{}}');",
        order(1, "o-1", 1, "placed"),
        order(2, "o-1", 2, "paid"),
        order(3, "o-2", 1, "placed"),
        order(4, "o-1", 1, "late"),
    ));
    caught_up(&admin, 4, 1).await;
    let read_model = "select string_agg(format('%s %s %s', order_id, status, version), ', ' \
                      order by order_id) from read_model.order_status";
    assert_eq!(db.psql(read_model), "o-1 paid 2, o-2 placed 1");
    doctor("while it runs");

    // The application's role, with the recipe's grant made as walfold's writer, waits
    // for its write and reads it, with no right on walfold's tables.
    let grant = page_block_after("After walfold's first start");
    let writer = walfold_pg::connect(&target_url).await.unwrap();
    writer.batch_execute(&grant).await.unwrap();
    db.psql(&order(6, "o-3", 1, "placed"));
    let waited = db.psql(
        "set role app_reader;          select status from walfold.wait_for('order_status', pg_current_wal_lsn(), '10 s')",
    );
    assert!(waited.ends_with("folded"), "{waited}");
    let denied = db.cluster.psql(
        &db.name,
        "set role app_reader; select count(*) from walfold.event_log",
    );
    assert!(denied.is_err(), "{denied:?}");
    let read = db.psql(
        "set role app_reader; select status from read_model.order_status where order_id = 'o-3'",
    );
    assert!(read.ends_with("placed"), "{read}");

    let (code, out, err) = cli(&["status"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("orders.status.v1"), "{out}");
    let (code, out, err) = cli(&["migrate"]);
    assert_eq!(code, 0, "{out}\n{err}");

    let (code, out, err) = cli(&["dead-letters", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let letters: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(letters[0]["reason"], "malformed", "{letters}");
    let id = letters[0]["id"].as_i64().unwrap().to_string();
    let (code, _, err) = cli(&["dead-letters", "discard", &id, "--reason", "not an event"]);
    assert_eq!(code, 0, "{err}");

    let (code, out, err) = cli(&[
        "rebuild",
        "order_status",
        "--subscriber",
        "orders.status.v2",
        "--wait",
    ]);
    assert_eq!(code, 0, "rebuild:\n{out}\n{err}");
    assert!(out.contains("switched over"), "{out}\n{err}");
    let (code, out, err) = cli(&["rebuild", "order_status", "--finish"]);
    assert_eq!(code, 0, "rebuild --finish:\n{out}\n{err}");
    assert_eq!(
        db.psql(read_model),
        "o-1 paid 2, o-2 placed 1, o-3 placed 1"
    );
    db.psql(&order(5, "o-2", 2, "paid"));
    eventually(
        Duration::from_secs(30),
        "the rebuilt table to follow",
        || async { db.psql(read_model) == "o-1 paid 2, o-2 paid 2, o-3 placed 1" },
    )
    .await;
    let (code, out, err) = cli(&["prune"]);
    assert_eq!(code, 0, "{out}\n{err}");

    // walfold created nothing on the source but its slot, and only inside its two
    // schemas on the target.
    assert_eq!(
        db.psql(
            "select (select count(*) from pg_class where relowner = 'walfold_repl'::regrole) \
             + (select count(*) from pg_namespace where nspowner = 'walfold_repl'::regrole) \
             + (select count(*) from pg_proc where proowner = 'walfold_repl'::regrole) \
             + (select count(*) from pg_type where typowner = 'walfold_repl'::regrole) \
             + (select count(*) from pg_publication where pubowner = 'walfold_repl'::regrole)"
        ),
        "0"
    );
    assert_eq!(
        db.psql("select string_agg(slot_name, ', ') from pg_replication_slots"),
        "walfold"
    );
    assert_eq!(
        db.psql("select string_agg(pubname, ', ') from pg_publication"),
        "walfold_outbox"
    );
    assert_eq!(
        db.psql(
            "select (select count(*) from pg_class where relowner = 'walfold_writer'::regrole \
               and relnamespace not in ('walfold'::regnamespace, 'read_model'::regnamespace, \
                 'pg_toast'::regnamespace)) \
             + (select count(*) from pg_proc where proowner = 'walfold_writer'::regrole \
               and pronamespace <> 'walfold'::regnamespace)"
        ),
        "0"
    );
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
}

/// A role that may create schemas in the database makes one named after walfold's role
/// (`"$user"`, first in PostgreSQL's default search_path) holding a `ledger` with a
/// trigger. walfold's unqualified `insert into ledger` must still reach `public.ledger`:
/// the intruder's table gets nothing and its trigger never runs as walfold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_named_after_walfolds_role_cannot_capture_a_projection() {
    let db = TestDb::new("shadow_schema");
    let role = db.psql("select current_user");
    let intruder = intruder(&db).await;
    db.psql(&format!(
        "grant create on database {} to intruder; grant usage, create on schema public to intruder",
        db.name
    ));
    intruder
        .batch_execute(&format!(
            "create schema {role}; grant usage on schema {role} to public; \
             create table {role}.ledger (event_id uuid, order_id text, amount numeric); \
             grant insert on {role}.ledger to public; \
             create table public.captured (who text); \
             grant insert on public.captured to public; \
             create function {role}.steal() returns trigger language plpgsql as \
               $$ begin insert into public.captured values (current_user); return new; end $$; \
             create trigger steal before insert on {role}.ledger \
               for each row execute function {role}.steal();"
        ))
        .await
        .expect("the intruder shadows ledger");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    db.psql(&insert_event(
        "00000000-0000-4000-8000-000000000001",
        "o-1",
        "OrderPlaced",
        1,
        r#"{"amount": "5"}"#,
    ));
    caught_up(&client, 1, 3).await;
    assert_eq!(db.psql("select count(*) from public.ledger"), "1");
    assert_eq!(db.psql(&format!("select count(*) from {role}.ledger")), "0");
    assert_eq!(db.psql("select count(*) from public.captured"), "0");
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
}

/// A grant on the outbox's columns lets a role insert events as surely as one on the
/// table: doctor names it among the roles that may write events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_a_role_that_may_insert_into_the_outboxs_columns() {
    let db = TestDb::new("column_writer");
    db.psql(
        "create role column_writer login; \
         grant insert (id, aggregate_type, aggregate_id, event_type, version, payload) \
         on outbox to column_writer",
    );
    let path = write_config(&db.config(""));
    let (code, out, err) = walfold(&["doctor", "-c", path.to_str().unwrap()], &[]);
    assert!(code <= 1, "{out}\n{err}");
    assert!(
        out.contains(
            "roles that may write events into public.outbox (insert into it, a partition of \
             it or an updatable view on it): column_writer, and superusers"
        ),
        "{out}"
    );
}

/// An updatable view on the outbox writes into it with its owner's rights, and a
/// partition takes rows as its table: their grants write events too (a stranger's
/// reporting role wrote one through a view, an ETL role through a partition), so doctor
/// counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_counts_the_views_and_partitions_that_write_into_an_outbox() {
    let db = TestDb::new("view_writer");
    db.psql(
        "create role via_view login; create role via_partition login; \
         create view outbox_compat as select * from outbox; \
         grant insert on outbox_compat to via_view; \
         create table parted (like outbox) partition by list (aggregate_type); \
         create table parted_order partition of parted for values in ('order'); \
         grant insert on parted_order to via_partition",
    );
    let path = write_config(&db.config(""));
    let (_, out, _) = walfold(&["doctor", "-c", path.to_str().unwrap()], &[]);
    assert!(
        out.contains("public.outbox (insert into it, a partition of it or an updatable view on it): via_view, and superusers"),
        "{out}"
    );
    assert!(
        out.contains("view public.outbox_compat writes rows into public.outbox as its owner"),
        "{out}"
    );
    // Without a message outbox, any role's logical messages are no concern: walfold
    // leaves a large one in the stream unread (memory::large_logical_messages_…).
    assert!(
        !out.contains("any role may write logical messages"),
        "{out}"
    );
    let (code, out, err) = walfold(
        &[
            "init",
            "--url",
            &db.url(),
            "--table",
            "public.parted",
            "-o",
            "-",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let line = "roles that may write events into public.parted (insert into it, a partition \
                of it or an updatable view on it): via_partition, and superusers";
    assert!(out.contains(line) || err.contains(line), "{out}{err}");
}

/// A security-definer function that inserts into the outbox writes events for whoever
/// may call it, which the table's grants do not show (a stranger's reporting role wrote
/// a credit through one): doctor names it and who may call it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_a_security_definer_function_that_writes_events() {
    let db = TestDb::new("definer_writer");
    db.psql(
        "create role reporter login;          create function publish(kind text, body jsonb) returns void language sql          security definer as $$ insert into public.outbox (id, aggregate_type, aggregate_id,          event_type, version, payload) values (gen_random_uuid(), 'order', 'o-1', kind, 1, body) $$;          create function innocent() returns int language sql security definer as $$ select 1 $$",
    );
    let path = write_config(&db.config(""));
    let doctor = || {
        let (code, out, err) = walfold(&["doctor", "-c", path.to_str().unwrap()], &[]);
        assert!(code <= 1, "{out}\n{err}");
        out
    };
    let out = doctor();
    assert!(
        out.lines().any(|l| l.starts_with("warn")
            && l.contains("security-definer function publish(text,jsonb) names public.outbox")
            && l.contains("any role may write events through it")),
        "{out}"
    );
    assert!(!out.contains("innocent"), "{out}");
    db.psql(
        "revoke execute on function publish(text, jsonb) from public;          grant execute on function publish(text, jsonb) to reporter",
    );
    let out = doctor();
    assert!(
        out.lines().any(|l| l.starts_with("ok")
            && l.contains("security-definer function publish(text,jsonb)")
            && l.contains("postgres, reporter, and superusers may write events through it")),
        "{out}"
    );
}

/// Found by a stranger: `init --read-model` through the source role of the least
/// privilege layout, which may not see the read model's schema, said only "db error".
#[test]
fn init_says_why_it_cannot_read_the_read_model() {
    let db = TestDb::new("init_unseen");
    db.psql(
        "create role sees_outbox login; grant select on outbox to sees_outbox; \
         create schema hidden; create table hidden.order_status \
         (order_id text primary key, status text, version bigint not null)",
    );
    let url = format!(
        "postgresql://sees_outbox@127.0.0.1:{}/{}",
        db.cluster.port(),
        db.name
    );
    let (code, out, err) = walfold(
        &[
            "init",
            "--url",
            &url,
            "--read-model",
            "hidden.order_status",
            "-o",
            "-",
        ],
        &[],
    );
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("--read-model hidden.order_status: cannot read it through --url")
            && err.contains("permission denied for schema hidden"),
        "{err}"
    );
}

/// Found on call: `pg_logical_emit_message` granted to PUBLIC after the start went
/// unnoticed until a restart (only doctor saw it). The running check says it within a
/// period: a warning, and `walfold_public_emit` at 1 until it is revoked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emit_granted_to_public_while_running_is_said_and_counted() {
    let db = TestDb::new("public_emit_later");
    db.psql(REVOKE_PUBLIC_EMIT);
    let port = walfold_tests::free_port();
    let config = db.config(&format!(
        "\n[[outbox]]\nmessage_prefix = \"walfold:accounts\"\n\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"
    ));
    let (d, _client) = Daemon::streaming(&db, &config).await;
    let gauge = move || {
        walfold_tests::http_get(port, "/metrics")
            .1
            .lines()
            .find(|l| l.starts_with("walfold_public_emit{"))
            .map(|l| l.rsplit(' ').next().unwrap_or("").to_owned())
    };
    db.psql(
        &REVOKE_PUBLIC_EMIT
            .replace("revoke execute", "grant execute")
            .replace("from public", "to public"),
    );
    eventually(Duration::from_secs(20), "the warning and the gauge", || {
        let said = d
            .log_text()
            .contains("any role may now write events into a message outbox");
        let counted = gauge().as_deref() == Some("1");
        async move { said && counted }
    })
    .await;
    db.psql(REVOKE_PUBLIC_EMIT);
    eventually(Duration::from_secs(20), "the gauge back at 0", || {
        let counted = gauge().as_deref() == Some("0");
        async move { counted }
    })
    .await;
}

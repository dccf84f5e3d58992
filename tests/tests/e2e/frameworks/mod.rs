//! The outbox and event-store tables that frameworks create, each created as its
//! framework creates it and written as its framework writes it (the facts read from the
//! framework's own repository, cited in each file; the statements are ours), folded by
//! the real daemon twice: through the config `docs/FRAMEWORKS.md` shows for it,
//! and through the config `walfold init` writes for the table. Each read model must
//! equal a fold computed independently (in SQL over the rows written), the malformed
//! row must be a dead letter with its reason, and nothing may count twice.
//!
//! One database per run on the shared cluster; the two runs of a framework go side by
//! side, each with its own slot.
//!
//! Shared helpers only here; one file per framework.

mod akka_jdbc;
mod axon;
mod commanded;
mod debezium;
mod emmett;
mod eventsourcing;
mod eventuate_local;
mod eventuate_tram;
mod eventuous;
mod init_stand_ins;
mod marten;
mod masstransit;
mod message_db;
mod nservicebus;
mod rails_event_store;
mod spatie;
mod spring_modulith;
mod watermill;
mod wolverine;

use std::time::Duration;

use walfold_config::builder::ConfigBuilder;
use walfold_tests::{eventually, free_port, walfold, Daemon, TestDb};

/// A database on the shared cluster without the suites' standard outbox: a framework's
/// own tables only (so `walfold init` finds the framework's table and nothing else).
pub fn bare_db(prefix: &str) -> TestDb {
    let cluster = walfold_tempdb::Cluster::shared();
    let name = cluster.create_database(prefix).expect("create database");
    TestDb { cluster, name }
}

/// The config block of `docs/FRAMEWORKS.md` (a ```toml block) that sets
/// `preset = "<preset>"`, word for word.
pub fn documented_block(preset: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/FRAMEWORKS.md");
    let page = std::fs::read_to_string(path).expect("docs/FRAMEWORKS.md");
    let wanted = format!("preset = \"{preset}\"");
    page.split("```toml\n")
        .skip(1)
        .map(|b| &b[..b.find("```").expect("the block closes")])
        .find(|b| b.contains(&wanted))
        .unwrap_or_else(|| panic!("docs/FRAMEWORKS.md has no block with `{wanted}`"))
        .to_owned()
}

/// The `[[projection]]` tables of a config block (what follows its first one).
pub fn projections_of(block: &str) -> &str {
    &block[block
        .find("[[projection]]")
        .expect("the block has a [[projection]]")..]
}

/// A whole config around `blocks` (`[[outbox]]` and `[[projection]]` text): the
/// database as source and target, its own slot, short backoffs.
pub fn config(db: &TestDb, slot: &str, blocks: &str) -> String {
    ConfigBuilder::new(&db.url())
        .source("slot", slot)
        .set("pipeline", "max_backoff_ms", 1000)
        .set("pipeline", "shutdown_timeout_s", 20)
        .set("log", "level", "info")
        .text(blocks)
        .to_toml()
}

/// One framework's table, what its framework writes into it, and what the read model
/// must hold afterwards.
pub struct Framework {
    /// The preset (and the databases' prefix).
    pub preset: &'static str,
    /// The framework's tables as it creates them, then the read model's.
    pub ddl: &'static str,
    /// `--read-model` for `walfold init` (a `table` projection it generates); `None`:
    /// init's `[[outbox]]` with the documented block's projections.
    pub init_read_model: Option<&'static str>,
    /// The framework's own client writes instead of statements of ours:
    /// `tests/emmett/write.mjs` (Node and the npm package) creates the schema after `ddl`
    /// and appends the events before `writes`.
    pub node_writer: bool,
    /// Text the file `walfold init` writes must hold (what it proposes where the
    /// framework's rows have no column for a field, a stand-in's mark).
    pub init_writes: &'static [&'static str],
    /// What the framework wrote before walfold came (and before `walfold init` looks at
    /// the table): not streamed, not in the fold.
    pub history: Vec<String>,
    /// What the framework writes: each a transaction of its own, in order.
    pub writes: Vec<String>,
    /// What it does to those rows later (marks them dispatched, deletes them): run after
    /// the expected fold is computed. walfold must not see these as events.
    pub later: Vec<String>,
    /// Its producer IDs are no UUIDs (Eventuate's Int128 strings): each event's ID is
    /// derived from it and the ID kept as `producer_id`.
    pub text_ids: bool,
    /// Events in the event log afterwards (distinct producer IDs that are events).
    pub events: i64,
    /// Each ingest dead letter, in order: text its `reason: error` must contain (lower
    /// case).
    pub dead_letters: &'static [&'static str],
    /// The read model, as one text value.
    pub read_model: &'static str,
    /// The same value computed independently over the framework's rows.
    pub fold: &'static str,
}

impl Framework {
    /// Both runs, side by side: the documented config and `walfold init`'s.
    pub async fn run(&self) {
        futures::future::join(self.through_docs(), self.through_init()).await;
    }

    /// Through the block `docs/FRAMEWORKS.md` shows for the preset.
    pub async fn through_docs(&self) {
        let db = bare_db(&format!("fw_{}", self.preset));
        self.create(&db);
        let slot = format!("fw_{}", self.preset);
        let text = config(&db, &slot, &documented_block(self.preset));
        let d = Daemon::start(&text, &[]);
        self.stream_and_check(&db, &slot, d, "docs").await;
    }

    /// Through what `walfold init` writes for the database.
    pub async fn through_init(&self) {
        let db = bare_db(&format!("fw_{}_init", self.preset));
        self.create(&db);
        let dir = std::env::temp_dir().join(format!(
            "walfold-fw-init-{}-{}",
            std::process::id(),
            self.preset
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("walfold.toml");
        let _ = std::fs::remove_file(&path);
        let url = db.url();
        let mut args = vec!["init", "--url", url.as_str(), "-o", path.to_str().unwrap()];
        if let Some(rm) = self.init_read_model {
            args.extend(["--read-model", rm]);
        }
        let (code, out, err) = walfold(&args, &[]);
        assert_eq!(code, 0, "{}: init\n{out}\n{err}", self.preset);
        let mut text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains(&format!("preset = \"{}\"", self.preset)),
            "{}: init recognises the table\n{text}",
            self.preset
        );
        eprintln!("{}: walfold init wrote\n{text}", self.preset);
        for wanted in self.init_writes {
            assert!(
                text.contains(wanted),
                "{}: init wrote no `{wanted}`",
                self.preset
            );
        }
        // A stand-in or a proposal is said on standard output too, not only in the file.
        for mark in ["STAND-IN", "PROPOSED"] {
            assert_eq!(
                text.contains(mark),
                out.contains(mark),
                "{}: `{mark}` in the file but not on stdout, or the reverse\n{out}",
                self.preset
            );
        }
        if self.init_read_model.is_none() {
            text.push('\n');
            text.push_str(projections_of(&documented_block(self.preset)));
        }
        let slot = format!("fw_{}_init", self.preset);
        let listen = format!("127.0.0.1:{}", free_port());
        let envs = [
            ("WALFOLD_SOURCE__SLOT", slot.as_str()),
            ("WALFOLD_METRICS__LISTEN", listen.as_str()),
        ];
        let d = Daemon::start(&text, &envs);
        self.stream_and_check(&db, &slot, d, "init").await;
    }

    fn create(&self, db: &TestDb) {
        db.psql(self.ddl);
        if self.node_writer {
            node_writer(db, "schema");
        }
        for h in &self.history {
            db.psql(h);
        }
    }

    async fn stream_and_check(&self, db: &TestDb, slot: &str, mut d: Daemon, run: &str) {
        let what = format!("{} ({run})", self.preset);
        let active = format!(
            "select count(*) from pg_replication_slots where slot_name = '{slot}' and active"
        );
        eventually(
            Duration::from_secs(60),
            &format!("{what}: streaming"),
            || async { db.psql(&active) == "1" },
        )
        .await;
        if self.node_writer {
            node_writer(db, "events");
        }
        for w in &self.writes {
            db.psql(w);
        }
        let fold = db.psql(self.fold);
        assert!(!fold.is_empty(), "{what}: the independent fold is empty");
        for l in &self.later {
            db.psql(l);
        }
        let dead = "select count(*) from walfold.dead_letter where subscriber_id is null";
        let expected_dead = self.dead_letters.len().to_string();
        eventually(
            Duration::from_secs(60),
            &format!("{what}: the read model"),
            || async {
                db.psql(self.read_model) == fold
                    && db.psql("select count(*) from walfold.event_log") == self.events.to_string()
                    && db.psql(dead) == expected_dead
            },
        )
        .await;
        // Settled: nothing arrives later to count twice.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(db.psql(self.read_model), fold, "{what}: the read model");
        assert_eq!(
            db.psql("select count(*) from walfold.event_log"),
            self.events.to_string(),
            "{what}: events in the log"
        );
        let letters = db.psql(
            "select string_agg(reason || ': ' || error, E'\\n' order by id) \
             from walfold.dead_letter where subscriber_id is null",
        );
        let kept = db.psql("select count(producer_id) from walfold.event_log");
        let expected_kept = if self.text_ids { self.events } else { 0 };
        assert_eq!(kept, expected_kept.to_string(), "{what}: producer IDs kept");
        eprintln!("{what}: dead letters\n{letters}");
        let letters: Vec<&str> = letters.lines().collect();
        assert_eq!(
            letters.len(),
            self.dead_letters.len(),
            "{what}: {letters:?}"
        );
        for (letter, wanted) in letters.iter().zip(self.dead_letters) {
            assert!(
                letter.to_lowercase().contains(wanted),
                "{what}: dead letter `{letter}` does not say `{wanted}`"
            );
        }
        assert_eq!(
            db.psql("select count(*) from walfold.dead_letter where subscriber_id is not null"),
            "0",
            "{what}: no projection failed"
        );
        assert_eq!(
            d.terminate(Duration::from_secs(30)),
            Some(0),
            "{what}\n{}",
            d.log_text()
        );
    }
}

/// The framework's own client, `tests/emmett/write.mjs`, on `db`: `what` is `schema` or
/// `events`. Its npm packages are installed (`npm ci`) on first use.
pub fn node_writer(db: &TestDb, what: &str) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/emmett");
    let installed =
        std::path::Path::new(dir).join("node_modules/@event-driven-io/emmett-postgresql");
    if !installed.exists() {
        let status = std::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(dir)
            .status()
            .expect("run npm ci in tests/emmett");
        assert!(status.success(), "npm ci in tests/emmett failed");
    }
    let out = std::process::Command::new("node")
        .args(["write.mjs", &db.url(), what])
        .current_dir(dir)
        .output()
        .expect("run node tests/emmett/write.mjs");
    assert!(
        out.status.success(),
        "node write.mjs {what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether Node and npm are here to run a framework's own client; without them a test
/// that needs them is skipped with a message, except in CI (`CI=true`), where it fails.
pub fn node_available(test: &str) -> bool {
    let found = ["node", "npm"].iter().all(|tool| {
        std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !found {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "{test}: node/npm not found in CI"
        );
        eprintln!("{test}: skipped, node and npm are not installed");
    }
    found
}

/// Every framework's statements run as written and its independent fold is not empty,
/// without walfold: a mistake in a test's SQL fails here, not as a timeout.
#[test]
fn each_framework_writes_its_rows_and_its_fold_sees_them() {
    let all = [
        eventuate_local::framework(),
        eventuate_tram::framework(),
        marten::framework(),
        masstransit::framework(),
        message_db::framework(),
        nservicebus::framework(),
        spring_modulith::framework(),
        wolverine::framework(),
        watermill::framework(),
        axon::framework(),
        akka_jdbc::framework(),
        eventsourcing::framework(),
        spatie::framework(),
        rails_event_store::framework(),
        commanded::framework(),
        eventuous::framework(),
        debezium::framework(),
    ];
    for f in &all {
        let db = bare_db(&format!("fw_sql_{}", f.preset));
        f.create(&db);
        for w in &f.writes {
            db.psql(w);
        }
        let fold = db.psql(f.fold);
        assert!(!fold.is_empty(), "{}: the fold is empty", f.preset);
        for l in &f.later {
            db.psql(l);
        }
        eprintln!("{}: {fold}", f.preset);
    }
}

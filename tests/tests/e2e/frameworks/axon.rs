//! Axon Framework's JPA event store.
//!
//! Tables as Hibernate 6 generates them on PostgreSQL for AxonFramework/AxonFramework's
//! entities (`messaging/src/main/java/org/axonframework/eventhandling/
//! AbstractEventEntry.java`, `AbstractDomainEventEntry.java`,
//! `AbstractSequencedDomainEventEntry.java`; `eventsourcing/src/main/java/org/
//! axonframework/eventsourcing/eventstore/jpa/DomainEventEntry.java` and
//! `SnapshotEventEntry.java`): Spring's snake-case names, `String` as varchar(255),
//! `@Lob byte[]` as `oid` (a large object) by default, the `@GeneratedValue` global
//! index from `domain_event_entry_seq` (increment 50), the unique index on
//! `(aggregate_identifier, sequence_number)` and on `event_identifier`. Rows as
//! `JpaEventStorageEngine` appends them: one per domain event, never updated;
//! `event_identifier` a random UUID's text, `type` the aggregate's type,
//! `sequence_number` from 0 per aggregate, `time_stamp` ISO-8601 text,
//! `payload_type` the event's class; with the `JacksonSerializer`, payload and metadata
//! are JSON. The statements are ours.

use super::{bare_db, config, documented_block, Framework};
use walfold_tests::{walfold, write_config, Daemon};

/// The tables; `{lob}` is the type of the `@Lob` columns.
const DDL: &str = r#"
create sequence domain_event_entry_seq start with 1 increment by 50;
create table domain_event_entry (
  global_index bigint not null,
  aggregate_identifier varchar(255) not null,
  event_identifier varchar(255) not null,
  meta_data {lob},
  payload {lob} not null,
  payload_revision varchar(255),
  payload_type varchar(255) not null,
  sequence_number bigint not null,
  time_stamp varchar(255) not null,
  type varchar(255),
  primary key (global_index)
);
alter table if exists domain_event_entry
  add constraint UK8s1f994p4la2ipb13me2xqm1w unique (aggregate_identifier, sequence_number);
alter table if exists domain_event_entry
  add constraint UK_fwe6lsa8bfo6hyas6ud3m8c7x unique (event_identifier);
create table snapshot_event_entry (
  aggregate_identifier varchar(255) not null,
  sequence_number bigint not null,
  type varchar(255) not null,
  event_identifier varchar(255) not null,
  meta_data {lob},
  payload {lob} not null,
  payload_revision varchar(255),
  payload_type varchar(255) not null,
  time_stamp varchar(255) not null,
  primary key (aggregate_identifier, sequence_number, type)
);
create table token_entry (
  processor_name varchar(255) not null,
  segment integer not null,
  owner varchar(255),
  timestamp varchar(255) not null,
  token {lob},
  token_type varchar(255),
  primary key (processor_name, segment)
);
create table card_balance (card_id text primary key, balance numeric not null, events integer not null);
"#;

const API: &str = "io.axoniq.demo.giftcard.api";

/// One domain event of gift card `card`; `content` is how the serializer wrote the
/// payload, `stored` turns bytes into the column's value.
fn append(global: i64, card: &str, seq: i64, kind: &str, content: &str, lob: bool) -> String {
    let meta = r#"{"traceId":"5f4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d","correlationId":"5f4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d"}"#;
    let stored = |text: &str| {
        if lob {
            // What Hibernate does for a @Lob byte[] on PostgreSQL: a large object.
            format!("lo_from_bytea(0, convert_to('{text}', 'UTF8'))")
        } else {
            format!("convert_to('{text}', 'UTF8')")
        }
    };
    format!(
        "insert into domain_event_entry (global_index, event_identifier, meta_data, payload, payload_revision, \
         payload_type, time_stamp, aggregate_identifier, sequence_number, type) \
         values ({global}, gen_random_uuid()::text, {}, {}, null, '{API}.{kind}', \
         to_char(now() at time zone 'utc', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), '{card}', {seq}, 'GiftCard');",
        stored(meta),
        stored(content),
    )
}

fn json_event(global: i64, card: &str, seq: i64, kind: &str, amount: u32, lob: bool) -> String {
    append(
        global,
        card,
        seq,
        kind,
        &format!(r#"{{"id":"{card}","amount":{amount}}}"#),
        lob,
    )
}

/// The gift card demo's events, each command's in a transaction of its own.
fn writes(lob: bool) -> Vec<String> {
    vec![
        json_event(1, "gc-1", 0, "IssuedEvt", 100, lob),
        json_event(2, "gc-2", 0, "IssuedEvt", 50, lob),
        json_event(3, "gc-1", 1, "RedeemedEvt", 30, lob),
        // Two commands on different cards in one unit of work.
        format!(
            "begin; {} {} commit;",
            json_event(51, "gc-2", 1, "RedeemedEvt", 20, lob),
            json_event(52, "gc-1", 2, "RedeemedEvt", 5, lob)
        ),
        // An event stored before the application switched from XStream to Jackson.
        append(
            53,
            "gc-3",
            0,
            "IssuedEvt",
            "<io.axoniq.demo.giftcard.api.IssuedEvt><id>gc-3</id><amount>10</amount></io.axoniq.demo.giftcard.api.IssuedEvt>",
            lob,
        ),
    ]
}

pub fn framework() -> Framework {
    let ddl: &'static str = DDL.replace("{lob}", "bytea").leak();
    Framework {
        preset: "axon",
        ddl,
        init_read_model: None,
        node_writer: false,
        init_writes: &[],
        history: Vec::new(),
        writes: writes(false),
        // A tracking processor stores its token.
        text_ids: false,
        later: vec![
            "insert into token_entry (processor_name, segment, owner, timestamp, token, token_type) \
             values ('io.axoniq.demo.giftcard.query', 0, '1@host', now()::text, convert_to('{\"index\":53}', 'UTF8'), \
             'org.axonframework.eventhandling.GlobalSequenceTrackingToken');"
                .into(),
        ],
        events: 5,
        dead_letters: &["json"],
        read_model: "select string_agg(card_id || ' ' || balance || ' ' || events, ', ' order by card_id) \
                     from card_balance",
        fold: r#"select string_agg(card_id || ' ' || balance || ' ' || events, ', ' order by card_id)
                 from (select aggregate_identifier as card_id,
                         sum(case when payload_type like '%.IssuedEvt' then 1 else -1 end
                             * (convert_from(payload, 'UTF8')::jsonb->>'amount')::numeric) as balance,
                         count(*) as events
                       from domain_event_entry where get_byte(payload, 0) = 123
                       group by 1) f"#,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axon_with_a_bytea_payload_folds_through_the_readme_and_init() {
    framework().run().await;
}

/// The expected refusal of Hibernate's default mapping: the column, the reason, the fix.
const REFUSAL: [&str; 3] = [
    "outbox table public.domain_event_entry column `payload` (outbox[0].payload) is of type oid",
    "logical decoding cannot read large objects",
    "alter the column to jsonb, json, text or bytea",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axon_with_hibernates_large_objects_is_refused_at_start_naming_column_reason_and_fix() {
    let ddl = DDL.replace("{lob}", "oid");
    for run in ["docs", "init"] {
        let db = bare_db(&format!("fw_axon_oid_{run}"));
        db.psql(&ddl);
        for w in writes(true) {
            db.psql(&w);
        }
        let text = if run == "docs" {
            config(&db, "fw_axon_oid", &documented_block("axon"))
        } else {
            let dir =
                std::env::temp_dir().join(format!("walfold-fw-axon-oid-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("walfold.toml");
            let _ = std::fs::remove_file(&path);
            let url = db.url();
            let (code, out, err) =
                walfold(&["init", "--url", &url, "-o", path.to_str().unwrap()], &[]);
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                text.contains("preset = \"axon\""),
                "init: {code}\n{out}\n{err}\n{text}"
            );
            // init's own check says what doctor says.
            assert!(out.contains(REFUSAL[0]), "init: {code}\n{out}\n{err}");
            format!(
                "{text}\n{}",
                super::projections_of(&documented_block("axon"))
            )
        };

        // walfold run refuses before it creates anything on the source.
        // The generated config's default port may be taken on this machine.
        let listen = format!("127.0.0.1:{}", walfold_tests::free_port());
        let mut d = Daemon::start(&text, &[("WALFOLD_METRICS__LISTEN", listen.as_str())]);
        assert_eq!(d.wait_exit("the daemon to refuse").await, Some(1), "{run}");
        let log = d.log_text();
        for part in REFUSAL {
            assert!(log.contains(part), "{run}: no `{part}` in:\n{log}");
        }
        assert_eq!(
            db.psql(
                "select count(*) from pg_replication_slots where database = current_database()"
            ),
            "0",
            "{run}: no slot"
        );
        if db.psql("select to_regclass('walfold.event_log') is not null") == "t" {
            assert_eq!(
                db.psql("select count(*) from walfold.event_log"),
                "0",
                "{run}: nothing folded"
            );
        }

        // walfold doctor reports the same, as a failed check.
        let cfg = write_config(&text);
        let (code, out, _) = walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
        assert_eq!(code, 1, "{run}: {out}");
        assert!(
            out.contains(&format!("FAIL  {}", REFUSAL[0])),
            "{run}: {out}"
        );
        assert!(out.contains(REFUSAL[2]), "{run}: {out}");
    }
}

//! Eventide Message DB.
//!
//! Table, index and functions as message-db/message-db creates them
//! (`database/tables/messages.sql`, `database/indexes/messages-id.sql`,
//! `database/indexes/messages-stream.sql`, `database/functions/category.sql`,
//! `database/functions/id.sql`); rows as `database/functions/write-message.sql` writes
//! them: one insert per message, the stream's next position (gapless, from 0) taken
//! under an advisory lock on the category, never updated. `id` is unique (an index), so
//! no duplicate ID can be written; positions cannot commit out of order. Commands live in
//! command streams (`account:command-123`, category `account:command`). The statements
//! below are ours.

use super::Framework;

const DDL: &str = r#"
create schema message_store;
create table if not exists message_store.messages (
  global_position bigserial not null,
  position bigint not null,
  time timestamp without time zone default (now() at time zone 'utc') not null,
  stream_name text not null,
  type text not null,
  data jsonb,
  metadata jsonb,
  id uuid not null default gen_random_uuid()
);
alter table message_store.messages add primary key (global_position) not deferrable initially immediate;
create function message_store.category(stream_name varchar) returns varchar
  language sql immutable as $$ select split_part(stream_name, '-', 1) $$;
create function message_store.id(stream_name varchar) returns varchar
  language sql immutable as $$
    select case when strpos(stream_name, '-') = 0 then null
                else substring(stream_name, strpos(stream_name, '-') + 1) end $$;
create unique index messages_id on message_store.messages (id);
create unique index messages_stream on message_store.messages (stream_name, position);
create index messages_category on message_store.messages (message_store.category(stream_name), global_position);
-- write_message, reduced to what it does to the table.
create function message_store.write_message(id varchar, stream_name varchar, type varchar,
    data jsonb, metadata jsonb default null) returns bigint language plpgsql as $$
  declare next_position bigint;
  begin
    perform pg_advisory_xact_lock(hashtext(message_store.category(write_message.stream_name)));
    select coalesce(max(m.position), -1) + 1 into next_position from message_store.messages m
      where m.stream_name = write_message.stream_name;
    insert into message_store.messages (id, stream_name, position, type, data, metadata)
      values (write_message.id::uuid, write_message.stream_name, next_position, write_message.type,
              write_message.data, write_message.metadata);
    return next_position;
  end $$;
create table account_summary (account_id text primary key, balance numeric, version bigint not null);
"#;

/// `select message_store.write_message(…)` for one message.
fn write(n: u32, stream: &str, kind: &str, data: &str, causation: &str) -> String {
    format!(
        "select message_store.write_message('6f1c{n:04x}-0000-4000-8000-00000000000{}', '{stream}', '{kind}', \
         '{data}', '{{\"causationMessageStreamName\": \"{causation}\", \"correlationStreamName\": \"web-1\", \
         \"schemaVersion\": null}}');",
        n % 10
    )
}

/// The table, its rows and the fold.
pub fn framework() -> Framework {
    let mut writes = Vec::new();
    let mut n = 0;
    let mut w = |stream: &str, kind: &str, data: &str| {
        n += 1;
        writes.push(write(n, stream, kind, data, "account:command-123"));
    };
    // Two accounts interleaved, a command stream beside them, one account with three
    // transactions in one database transaction (as a handler writing a batch does).
    w(
        "account:command-123",
        "Open",
        r#"{"accountId": "123", "customerId": "c-1"}"#,
    );
    w(
        "account-123",
        "Opened",
        r#"{"accountId": "123", "customerId": "c-1", "balance": 0}"#,
    );
    w(
        "account-456",
        "Opened",
        r#"{"accountId": "456", "customerId": "c-2", "balance": 0}"#,
    );
    w(
        "account-123",
        "Deposited",
        r#"{"accountId": "123", "amount": 100, "balance": 100}"#,
    );
    w(
        "account-456",
        "Deposited",
        r#"{"accountId": "456", "amount": 20.5, "balance": 20.5}"#,
    );
    w(
        "account-123",
        "Withdrawn",
        r#"{"accountId": "123", "amount": 30, "balance": 70}"#,
    );
    // Written to the category's name alone: no ID after a `-`, so no aggregate ID.
    w(
        "account",
        "Deposited",
        r#"{"accountId": "789", "amount": 5, "balance": 5}"#,
    );
    let batch = [
        r#"{"accountId": "456", "amount": 0.5, "balance": 21}"#,
        r#"{"accountId": "456", "amount": 9, "balance": 30}"#,
    ];
    let mut tx = String::from("begin;");
    for data in batch {
        n += 1;
        tx.push_str(&write(
            n,
            "account-456",
            "Deposited",
            data,
            "account:command-456",
        ));
    }
    tx.push_str("commit;");
    writes.push(tx);
    Framework {
        preset: "message_db",
        ddl: DDL,
        init_read_model: None,
        node_writer: false,
        init_writes: &[],
        history: Vec::new(),
        writes,
        later: Vec::new(),
        text_ids: false,
        events: 8,
        dead_letters: &["aggregate_id"],
        read_model: "select string_agg(account_id || ' ' || balance || ' v' || version, ', ' \
                     order by account_id) from account_summary",
        fold: "select string_agg(account_id || ' ' || balance || ' v' || version, ', ' order by account_id) \
               from (select distinct on (stream_name) \
                       substring(stream_name from strpos(stream_name, '-') + 1) as account_id, \
                       (data->>'balance')::numeric as balance, position as version \
                     from message_store.messages \
                     where split_part(stream_name, '-', 1) = 'account' and strpos(stream_name, '-') > 0 \
                     order by stream_name, position desc) f",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_db_folds_its_streams_through_the_readme_and_init() {
    framework().run().await;
}

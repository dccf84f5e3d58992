//! Wolverine's durable outbox on PostgreSQL.
//!
//! Tables as JasperFx/wolverine's `src/Persistence/Wolverine.Postgresql/Schema/
//! OutgoingEnvelopeTable.cs` and `IncomingEnvelopeTable.cs` create them (Weasel: `Guid` as
//! uuid, `int` as integer, `string` as varchar, `DateTimeOffset` as timestamptz, the
//! partial owner index) in the default schema `wolverine`
//! (`PostgresqlBackedPersistence.cs`). Rows as `src/Persistence/Wolverine.RDBMS/
//! DatabasePersistence.cs` (`BuildOutgoingStorageCommand`) writes them: `body` is
//! `src/Wolverine/Runtime/Serialization/EnvelopeSerializer.cs`'s binary envelope (the
//! sent time as `DateTime.ToBinary`, a count of headers, each header key and value as a
//! .NET `BinaryWriter` string, then the data's length and the data: the message as
//! System.Text.Json wrote it), `id` a sequential GUID, one row per route: a message
//! published to two endpoints is two rows with two IDs (`MessageRoute.CreateForSending`
//! makes an envelope per route). The row is deleted once the transport took it; a node
//! that stops releases its rows (`owner_id = 0`, an update). The statements are ours.

use super::Framework;

const DDL: &str = r#"
create schema wolverine;
create table wolverine.wolverine_outgoing_envelopes (
  id uuid not null constraint pkey_wolverine_outgoing_envelopes_id primary key,
  owner_id integer not null,
  destination varchar not null,
  deliver_by timestamp with time zone,
  body bytea not null,
  attempts integer default 0,
  message_type varchar not null
);
create index idx_wolverine_outgoing_envelopes_owner
  on wolverine.wolverine_outgoing_envelopes (owner_id) where owner_id <> 0;
create table wolverine.wolverine_incoming_envelopes (
  id uuid not null constraint pkey_wolverine_incoming_envelopes_id primary key,
  status varchar not null,
  owner_id integer not null,
  execution_time timestamp with time zone,
  attempts integer default 0,
  body bytea not null,
  message_type varchar not null,
  received_at varchar,
  keep_until timestamp with time zone
);
create table order_totals (order_id text primary key, messages integer not null, total numeric not null);
"#;

/// The exchange every order event is published to, and the queue that also gets them.
const SALES: &str = "rabbitmq://exchange/sales-events";
const AUDIT: &str = "rabbitmq://queue/audit";

/// A .NET `BinaryWriter` string: a 7-bit encoded length, then UTF-8.
fn dotnet_string(out: &mut Vec<u8>, s: &str) {
    let mut n = s.len();
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out.extend_from_slice(s.as_bytes());
}

/// Wolverine's binary envelope around `data`.
fn envelope(id: &str, kind: &str, destination: &str, content_type: &str, data: &[u8]) -> Vec<u8> {
    // 2026-12-03T08:43:40Z in .NET ticks, kind UTC.
    let ticks: u64 = 621_355_968_000_000_000 + 1_796_287_420 * 10_000_000 + 1_234_567;
    let mut out = ((ticks | 0x4000_0000_0000_0000) as i64)
        .to_le_bytes()
        .to_vec();
    let headers = [
        ("source", "Shop.Api"),
        ("message-type", kind),
        ("content-type", content_type),
        ("correlation-id", "4bf92f3577b34da6a3ce929d0e0e4736"),
        ("conversation-id", "08dd1a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4b"),
        ("destination", destination),
        ("accepted-content-types", "application/json"),
        ("id", id),
    ];
    out.extend_from_slice(&(headers.len() as i32).to_le_bytes());
    for (k, v) in headers {
        dotnet_string(&mut out, k);
        dotnet_string(&mut out, v);
    }
    out.extend_from_slice(&(data.len() as i32).to_le_bytes());
    out.extend_from_slice(data);
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One outgoing envelope, as `BuildOutgoingStorageCommand` inserts it.
fn insert(id: &str, kind: &str, destination: &str, content_type: &str, data: &[u8]) -> String {
    let body = hex(&envelope(id, kind, destination, content_type, data));
    format!(
        "insert into wolverine.wolverine_outgoing_envelopes \
         (body, id, owner_id, destination, deliver_by, attempts, message_type) \
         values ('\\x{body}'::bytea, '{id}', 1, '{destination}', null, 0, '{kind}');"
    )
}

/// A message routed to both endpoints: one envelope (and ID) per route.
fn publish(ids: [&str; 2], kind: &str, order: &str, amount: &str) -> String {
    let data = format!(r#"{{"OrderId":"{order}","Amount":{amount},"PlacedBy":"web"}}"#);
    let json = "application/json";
    format!(
        "{}{}",
        insert(ids[0], kind, SALES, json, data.as_bytes()),
        insert(ids[1], kind, AUDIT, json, data.as_bytes())
    )
}

/// `{"OrderId": "o-3", "Amount": 5}` as MessagePack.
const PACKED: &[u8] = &[
    0x82, 0xa7, b'O', b'r', b'd', b'e', b'r', b'I', b'd', 0xa3, b'o', b'-', b'3', 0xa6, b'A', b'm',
    b'o', b'u', b'n', b't', 0x05,
];
const MSGPACK: &str = "application/x-msgpack";

const PLACED: &str = "Sales.Contracts.OrderPlaced";
const AMENDED: &str = "Sales.Contracts.OrderAmended";

pub fn framework() -> Framework {
    let id = |n: u32| format!("08dd1a2b-3c4d-5e6f-{n:04x}-0242ac120005");
    let writes = vec![
        // The handler's transaction: its business rows, then its cascading messages.
        format!(
            "begin; {} {} commit;",
            publish([&id(1), &id(2)], PLACED, "o-1", "30.5"),
            publish([&id(3), &id(4)], PLACED, "o-2", "12.25"),
        ),
        format!(
            "begin; {} commit;",
            publish([&id(5), &id(6)], AMENDED, "o-1", "4.5")
        ),
        // A node that stops lets its envelopes go: an update, no message.
        format!(
            "update wolverine.wolverine_outgoing_envelopes set owner_id = 0 where id = '{}';",
            id(5)
        ),
        format!(
            "begin; {} commit;",
            publish([&id(7), &id(8)], AMENDED, "o-2", "-2.25")
        ),
        // A message sent with a MessagePack serializer: its data is no JSON.
        format!(
            "begin; {}{} commit;",
            insert(&id(9), PLACED, SALES, MSGPACK, PACKED),
            insert(&id(10), PLACED, AUDIT, MSGPACK, PACKED)
        ),
    ];
    Framework {
        preset: "wolverine",
        ddl: DDL,
        init_read_model: None,
        node_writer: false,
        init_writes: &[
            "PROPOSED by walfold init\n# from the payload key `OrderId`",
            "aggregate_id = \"convert_from(substring(body from position(decode('7b22', 'hex') in body)), 'UTF8')::jsonb->>'OrderId'\"",
        ],
        // An envelope still waiting for the audit queue (its broker was down) when walfold
        // came: init finds the audit destination there; the same messages go to both.
        history: vec![insert(
            "08dd1a2b-3c4d-5e6f-0000-0242ac120005",
            PLACED,
            AUDIT,
            "application/json",
            br#"{"OrderId":"o-0","Amount":1,"PlacedBy":"web"}"#,
        )],
        writes,
        // The transport took them.
        text_ids: false,
        later: vec!["delete from wolverine.wolverine_outgoing_envelopes;".into()],
        events: 4,
        // The documented aggregate_id reads the JSON first and fails there; init's payload.
        dead_letters: &["utf"],
        read_model: "select string_agg(order_id || ' ' || messages || ' ' || total, ', ' order by order_id) \
                     from order_totals",
        fold: r#"select string_agg(order_id || ' ' || messages || ' ' || total, ', ' order by order_id)
                 from (select m->>'OrderId' as order_id, count(*) as messages, sum((m->>'Amount')::numeric) as total
                       from (select convert_from(substring(body from position(decode('7b22', 'hex') in body)), 'UTF8')::jsonb as m
                             from wolverine.wolverine_outgoing_envelopes
                             where destination = 'rabbitmq://exchange/sales-events'
                               and position(convert_to('application/x-msgpack', 'UTF8') in body) = 0) e
                       group by 1) f"#,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wolverine_folds_its_outgoing_envelopes_through_the_readme_and_init() {
    framework().run().await;
}

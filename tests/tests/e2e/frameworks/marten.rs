//! Marten's event store.
//!
//! Tables as JasperFx/marten creates them with its defaults (Guid stream identity, single
//! tenancy, no metadata columns): `src/Marten/Events/Schema/EventsTable.cs` (`mt_events`:
//! `seq_id` bigint primary key from `mt_events_sequence`, `id` uuid, `stream_id` uuid
//! referencing `mt_streams` on delete cascade, `version` bigint, `data` jsonb not null,
//! `type` varchar(500), `timestamp` timestamptz default now(), `tenant_id` varchar default
//! `'*DEFAULT*'`, `mt_dotnet_type`, `is_archived`; unique (stream_id, version) and (id))
//! and `StreamsTable.cs` (`mt_streams`). Rows as Marten appends them: in one transaction
//! the stream row (its type: the aggregate's .NET name, its new version) and one
//! `mt_events` row per event, `type` the event class in snake case. IDs are unique and
//! versions commit in order per stream (the stream row serializes appends), so neither
//! a duplicate nor an out-of-order version occurs. The JSON is what Marten's serializer
//! writes when configured with camel case. The statements below are ours.

use super::Framework;

const DDL: &str = r#"
create table public.mt_streams (
  id uuid not null primary key,
  type varchar null,
  version bigint null,
  timestamp timestamptz default (now()) not null,
  snapshot jsonb,
  snapshot_version integer,
  created timestamptz default (now()) not null,
  tenant_id varchar default '*DEFAULT*',
  is_archived bool default false
);
create sequence public.mt_events_sequence;
create table public.mt_events (
  seq_id bigint not null primary key,
  id uuid not null,
  stream_id uuid,
  version bigint not null,
  data jsonb not null,
  type varchar(500) not null,
  timestamp timestamptz default (now()) not null,
  tenant_id varchar default '*DEFAULT*',
  mt_dotnet_type varchar null,
  is_archived bool default false,
  constraint fkey_mt_events_stream_id foreign key (stream_id) references public.mt_streams (id) on delete cascade
);
create unique index pk_mt_events_stream_and_version on public.mt_events (stream_id, version);
create unique index pk_mt_events_id_unique on public.mt_events (id);
create table order_view (order_id text primary key, status text, total numeric, version bigint not null);
"#;

/// One `session.Events.Append(stream, events…)` + `SaveChanges`: the stream row and the
/// events, in one transaction. `events` are (event ID, type, .NET type, data).
fn append(stream: &str, from_version: i64, events: &[(&str, &str, &str, &str)]) -> String {
    let last = from_version + events.len() as i64 - 1;
    let mut tx = format!(
        "begin; insert into mt_streams (id, type, version) values ('{stream}', 'Shop.Orders.Order', {last}) \
         on conflict (id) do update set version = excluded.version;"
    );
    for (i, (id, kind, dotnet, data)) in events.iter().enumerate() {
        tx.push_str(&format!(
            "insert into mt_events (seq_id, id, stream_id, version, data, type, tenant_id, mt_dotnet_type) \
             values (nextval('mt_events_sequence'), '{id}', '{stream}', {}, '{data}', '{kind}', '*DEFAULT*', \
             'Shop.Orders.{dotnet}, Shop');",
            from_version + i as i64
        ));
    }
    tx.push_str("commit;");
    tx
}

const O1: &str = "a1000000-0000-4000-8000-000000000001";
const O2: &str = "a1000000-0000-4000-8000-000000000002";
const O3: &str = "a1000000-0000-4000-8000-000000000003";

/// The table, its rows and the fold.
pub fn framework() -> Framework {
    let writes = vec![
        append(
            O1,
            1,
            &[(
                "e1000000-0000-4000-8000-000000000001",
                "order_placed",
                "OrderPlaced",
                r#"{"status": "placed", "total": 30.5}"#,
            )],
        ),
        append(
            O2,
            1,
            &[
                (
                    "e1000000-0000-4000-8000-000000000002",
                    "order_placed",
                    "OrderPlaced",
                    r#"{"status": "placed", "total": 12.25}"#,
                ),
                (
                    "e1000000-0000-4000-8000-000000000003",
                    "order_cancelled",
                    "OrderCancelled",
                    r#"{"status": "cancelled", "total": 12.25}"#,
                ),
            ],
        ),
        append(
            O1,
            2,
            &[
                (
                    "e1000000-0000-4000-8000-000000000004",
                    "order_paid",
                    "OrderPaid",
                    r#"{"status": "paid", "total": 30.5}"#,
                ),
                (
                    "e1000000-0000-4000-8000-000000000005",
                    "order_shipped",
                    "OrderShipped",
                    r#"{"status": "shipped", "total": 30.5}"#,
                ),
            ],
        ),
        // A null event serialized: JSON null, which walfold cannot fold.
        append(
            O3,
            1,
            &[(
                "e1000000-0000-4000-8000-000000000006",
                "order_placed",
                "OrderPlaced",
                "null",
            )],
        ),
    ];
    Framework {
        preset: "marten",
        ddl: DDL,
        init_read_model: Some("public.order_view"),
        node_writer: false,
        init_writes: &[],
        history: Vec::new(),
        writes,
        later: Vec::new(),
        text_ids: false,
        events: 5,
        dead_letters: &["is null"],
        read_model: "select string_agg(order_id || ' ' || status || ' ' || total || ' v' || version, ', ' \
                     order by order_id) from order_view",
        fold: "select string_agg(order_id || ' ' || status || ' ' || total || ' v' || version, ', ' \
               order by order_id) \
               from (select distinct on (stream_id) stream_id::text as order_id, data->>'status' as status, \
                       (data->>'total')::numeric as total, version \
                     from mt_events where jsonb_typeof(data) = 'object' \
                     order by stream_id, version desc) f",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marten_folds_its_event_streams_through_the_readme_and_init() {
    framework().run().await;
}

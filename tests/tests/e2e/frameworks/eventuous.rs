//! Eventuous with its PostgreSQL event store, schema `eventuous` (the default).
//!
//! Tables and functions as Eventuous/eventuous's
//! `src/Postgres/src/Eventuous.Postgresql/Scripts/` creates them, `__schema__` being
//! `eventuous`: `1_Schema.sql` (`streams`, `messages` with its unique `(stream_id,
//! stream_position)` and `(stream_id, message_id)`, `checkpoints`, the `stream_message`
//! type), `3_CheckStream.sql` and `2_AppendEvents.sql`. Rows as the store writes them:
//! one `select * from eventuous.append_events(stream, expected version, created,
//! messages)` per append, `stream_position` from 0, `created` the append's time. A
//! retried append (same message ID) inserts nothing (`on conflict do nothing`). The
//! functions are Eventuous'; the calls are ours.

use super::Framework;

const DDL: &str = r#"
create schema if not exists eventuous;
create table if not exists eventuous.streams (
    stream_name varchar(1000) not null,
    stream_id   integer primary key generated always as identity,
    version     integer not null default(-1),
    constraint uq_streams_name unique (stream_name),
    constraint ck_version_gte_negative_one check (version >= -1)
);
create table if not exists eventuous.messages (
    message_id      uuid not null,
    message_type    varchar not null,
    stream_id       integer not null,
    stream_position integer not null,
    global_position bigint primary key generated always as identity,
    json_data       jsonb not null,
    json_metadata   jsonb null,
    created         timestamp not null,
    constraint fk_messages_stream foreign key (stream_id) references eventuous.streams (stream_id),
    constraint uq_messages_stream_id_and_stream_position unique (stream_id, stream_position),
    constraint uq_stream_id_and_message_id unique (stream_id, message_id),
    constraint ck_stream_position_gte_zero check (stream_position >= 0)
);
create index if not exists events_stream_idx on eventuous.messages (stream_id);
create table if not exists eventuous.checkpoints (id varchar primary key, position bigint null);
do $$
begin
    create type eventuous.stream_message as (
        message_id    uuid,
        message_type  varchar(128),
        json_data     jsonb,
        json_metadata jsonb);
    exception
        when duplicate_object then null;
end $$;
create or replace function eventuous.check_stream(_stream_name varchar(1000), _expected_version integer)
returns table (stream_id integer, new_version integer)
as $$
declare
    _current_version integer;
    _stream_id integer;
begin
    select s.version, s.stream_id into _current_version, _stream_id
                              from eventuous.streams s
                              where s.stream_name = _stream_name;
    if _stream_id is null then
        if _expected_version = -2 or _expected_version = -1 then
            insert into eventuous.streams (stream_name, version) values (_stream_name, -1);
            select s.stream_id, s.version into _stream_id, _current_version
                                      from eventuous.streams s
                                      where stream_name = _stream_name;
        else
            raise exception 'StreamNotFound';
        end if;
    else
        if _expected_version != -2 and _expected_version != _current_version then
            raise exception 'WrongExpectedVersion %, current version %', _expected_version, _current_version;
        end if;
    end if;
    return query select _stream_id, _current_version;
end;
$$ language 'plpgsql';
create or replace function eventuous.append_events(
    _stream_name varchar(1000),
    _expected_version integer,
    _created timestamp with time zone,
    _messages eventuous.stream_message[],
    _enable_delay boolean default false
)
returns table (new_version integer, global_position bigint)
as $$
declare
    _current_version integer;
    _stream_id integer;
    _position bigint;
begin
    if _created is null then
        _created = now() at time zone 'utc';
    end if;
    select s.stream_id, s.new_version
        into _stream_id, _current_version
        from eventuous.check_stream(_stream_name, _expected_version) s;
    insert into eventuous.messages (message_id, message_type, stream_id, stream_position,
                                     json_data, json_metadata, created)
    select m.message_id, m.message_type, _stream_id,
           _current_version + (row_number() over ()) :: int,
           m.json_data, m.json_metadata, _created
    from unnest(_messages) m
    on conflict do nothing;
    select m.stream_position, m.global_position into _current_version, _position
        from eventuous.messages m
        where m.stream_id = _stream_id
        order by m.global_position desc limit 1;
    update eventuous.streams set version = _current_version where stream_id = _stream_id;
    if _enable_delay then
        perform pg_sleep(random() * 0.1);
    end if;
    return query select _current_version, _position;
end;
$$ language 'plpgsql';
create table booking_payments (booking_id text primary key, price numeric not null, paid numeric not null, events integer not null);
"#;

/// One append to `Booking-<booking>` expecting `expected` (-1: a new stream, -2: any):
/// `messages` (message ID, type, JSON).
fn append(booking: &str, expected: i32, messages: &[(&str, &str, String)]) -> String {
    let rows: Vec<String> = messages
        .iter()
        .map(|(id, kind, json)| {
            format!(
                "row('{id}', 'V1.{kind}', '{json}'::jsonb, '{{\"$correlationId\":\"c-{booking}\"}}'::jsonb)::eventuous.stream_message"
            )
        })
        .collect();
    format!(
        "select * from eventuous.append_events('Booking-{booking}', {expected}, now(), array[{}]);",
        rows.join(", ")
    )
}

fn booked(booking: &str, price: &str) -> String {
    format!(
        r#"{{"bookingId":"{booking}","roomId":"r-{booking}","price":{price},"currency":"EUR"}}"#
    )
}

fn paid(booking: &str, amount: &str) -> String {
    format!(r#"{{"bookingId":"{booking}","paymentId":"p-{amount}","amount":{amount}}}"#)
}

const ID: [&str; 5] = [
    "2a7c6b1e-0f3d-4c5e-8a9b-000000000001",
    "2a7c6b1e-0f3d-4c5e-8a9b-000000000002",
    "2a7c6b1e-0f3d-4c5e-8a9b-000000000003",
    "2a7c6b1e-0f3d-4c5e-8a9b-000000000004",
    "2a7c6b1e-0f3d-4c5e-8a9b-000000000005",
];

pub fn framework() -> Framework {
    let writes = vec![
        append("b-1", -1, &[(ID[0], "RoomBooked", booked("b-1", "100"))]),
        append("b-2", -1, &[(ID[1], "RoomBooked", booked("b-2", "80"))]),
        append(
            "b-1",
            0,
            &[
                (ID[2], "PaymentRecorded", paid("b-1", "40")),
                (ID[3], "PaymentRecorded", paid("b-1", "60")),
            ],
        ),
        // The client retries the last append (its answer was lost): nothing is inserted.
        append("b-1", -2, &[(ID[3], "PaymentRecorded", paid("b-1", "60"))]),
        append("b-2", 0, &[(ID[4], "PaymentRecorded", paid("b-2", "80"))]),
    ];
    Framework {
        preset: "eventuous",
        ddl: DDL,
        init_read_model: None,
        node_writer: false,
        init_writes: &[
            "aggregate_id = \"stream_id\"",
            "version = \"stream_position\"",
        ],
        history: Vec::new(),
        writes,
        later: Vec::new(),
        text_ids: false,
        events: 5,
        dead_letters: &[],
        read_model:
            "select string_agg(booking_id || ' ' || price || ' ' || paid || ' ' || events, ', ' \
                     order by booking_id) from booking_payments",
        fold: r#"select string_agg(booking_id || ' ' || price || ' ' || paid || ' ' || events, ', '
                   order by booking_id)
                 from (select json_data->>'bookingId' as booking_id,
                         coalesce(sum((json_data->>'price')::numeric), 0) as price,
                         coalesce(sum((json_data->>'amount')::numeric), 0) as paid,
                         count(*) as events
                       from eventuous.messages group by 1) f"#,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventuous_folds_its_streams_strictly_from_position_0_through_the_readme_and_init() {
    framework().run().await;
}

//! Commanded's EventStore for Elixir (commanded/eventstore), schema `public`, the
//! default `bytea` columns and JSON serializer.
//!
//! Tables as `lib/event_store/sql/init.ex` creates them (`streams` with the `$all`
//! stream seeded as 0, `events`, `stream_events` with its unique `(stream_id,
//! stream_version)`, `subscriptions`, `snapshots`, `schema_migrations`; its triggers that
//! refuse updates and deletes left out, as nothing here updates or deletes). Rows as
//! `lib/event_store/sql/statements/insert_events.sql.eex` writes them: one statement
//! per append, whose CTEs insert the events, create (or advance) the stream, link each
//! event to it and to `$all`. Event types are Elixir module names; data is the event
//! struct as JSON bytes (Jason). An event ID is the primary key: no row repeats. The
//! statements are ours, the template's values bound inline.

use super::Framework;

const DDL: &str = r#"
CREATE TABLE streams (stream_id bigserial PRIMARY KEY NOT NULL, stream_uuid text NOT NULL,
  stream_version bigint default 0 NOT NULL, stream_origin bigint default 0 NOT NULL,
  created_at timestamp with time zone DEFAULT NOW() NOT NULL, deleted_at timestamp with time zone);
CREATE UNIQUE INDEX ix_streams_stream_uuid ON streams (stream_uuid);
CREATE TABLE events (event_id uuid PRIMARY KEY NOT NULL, event_type text NOT NULL, causation_id uuid NULL,
  correlation_id uuid NULL, data bytea NOT NULL, metadata bytea NULL,
  created_at timestamp with time zone DEFAULT NOW() NOT NULL);
CREATE TABLE stream_events (event_id uuid NOT NULL REFERENCES events (event_id),
  stream_id bigint NOT NULL REFERENCES streams (stream_id), stream_version bigint NOT NULL,
  original_stream_id bigint REFERENCES streams (stream_id), original_stream_version bigint,
  PRIMARY KEY(event_id, stream_id));
CREATE UNIQUE INDEX ix_stream_events ON stream_events (stream_id, stream_version);
INSERT INTO streams (stream_id, stream_uuid, stream_version, stream_origin) VALUES (0, '$all', 0, 0);
CREATE TABLE subscriptions (subscription_id bigserial PRIMARY KEY NOT NULL, stream_uuid text NOT NULL,
  subscription_name text NOT NULL, last_seen bigint NULL, created_at timestamp with time zone DEFAULT NOW() NOT NULL);
CREATE UNIQUE INDEX ix_subscriptions_stream_uuid_subscription_name ON subscriptions (stream_uuid, subscription_name);
CREATE TABLE snapshots (source_uuid text PRIMARY KEY NOT NULL, source_version bigint NOT NULL,
  source_type text NOT NULL, data bytea NOT NULL, metadata bytea NULL,
  created_at timestamp with time zone DEFAULT NOW() NOT NULL);
CREATE TABLE schema_migrations (major_version int NOT NULL, minor_version int NOT NULL, patch_version int NOT NULL,
  migrated_at timestamp with time zone DEFAULT NOW() NOT NULL, PRIMARY KEY(major_version, minor_version, patch_version));
INSERT INTO schema_migrations (major_version, minor_version, patch_version) VALUES (1, 3, 2);
create table article_favorites (article_uuid uuid primary key, title text, favorites integer not null, events integer not null);
"#;

const BLOG: &str = "Elixir.Conduit.Blog.Events";

/// One append to the stream `stream` (`article-<uuid>`) of `events` (type, JSON); its
/// version was `version` before (0: the stream is new).
fn append(stream: &str, version: i64, events: &[(&str, String)]) -> String {
    let values: Vec<String> = events
        .iter()
        .enumerate()
        .map(|(i, (kind, json))| {
            format!(
                "(md5('{stream}{version}{i}')::uuid, '{BLOG}.{kind}', null::uuid, \
                 md5('corr{stream}{version}')::uuid, convert_to('{json}', 'UTF8')::bytea, \
                 convert_to('{{\"user_id\":\"u-1\"}}', 'UTF8')::bytea, now()::timestamptz, {i}::int, {}::bigint)",
                version + 1 + i as i64
            )
        })
        .collect();
    let n = events.len();
    let stream_cte = if version == 0 {
        format!("INSERT INTO streams (stream_uuid, stream_version) VALUES ('{stream}', {n}::bigint) returning stream_id")
    } else {
        format!(
            "UPDATE streams SET stream_version = stream_version + {n}::bigint \
             WHERE stream_id = (select stream_id from streams where stream_uuid = '{stream}') returning stream_id"
        )
    };
    format!(
        "WITH new_events (event_id, event_type, causation_id, correlation_id, data, metadata, created_at, index, stream_version) AS (\
           VALUES {values}), \
         events AS (INSERT INTO public.events (event_id, event_type, causation_id, correlation_id, data, metadata, created_at) \
           SELECT event_id, event_type, causation_id, correlation_id, data, metadata, created_at FROM new_events), \
         stream AS ({stream_cte}), \
         source_stream_events AS (INSERT INTO public.stream_events (event_id, stream_id, stream_version, original_stream_id, original_stream_version) \
           SELECT new_events.event_id, stream.stream_id, new_events.stream_version, stream.stream_id, new_events.stream_version FROM new_events, stream), \
         linked_stream AS (UPDATE public.streams SET stream_version = stream_version + {n}::bigint WHERE stream_id = 0 \
           RETURNING stream_version - {n}::bigint as initial_stream_version) \
         INSERT INTO public.stream_events (event_id, stream_id, stream_version, original_stream_id, original_stream_version) \
         SELECT new_events.event_id, 0, linked_stream.initial_stream_version + new_events.index, stream.stream_id, new_events.stream_version \
         FROM new_events, linked_stream, stream;",
        values = values.join(", ")
    )
}

const A: &str = "0b6c1a3e-7d2f-4e8a-9c5b-1d2e3f4a5b6c";
const B: &str = "0b6c1a3e-7d2f-4e8a-9c5b-1d2e3f4a5b6d";
const OLD: &str = "0b6c1a3e-7d2f-4e8a-9c5b-1d2e3f4a5b60";

fn published(article: &str, title: &str) -> (&'static str, String) {
    (
        "ArticlePublished",
        format!(
            r#"{{"article_uuid":"{article}","author_uuid":"7e9a0b1c-2d3e-4f5a-8b6c-7d8e9f0a1b2c","title":"{title}","tag_list":["rust"]}}"#
        ),
    )
}

fn favorited(article: &str, count: i32) -> (&'static str, String) {
    (
        "ArticleFavorited",
        format!(
            r#"{{"article_uuid":"{article}","favorited_by_author_uuid":"5c4b3a29-1807-4f6e-9d5c-4b3a29180700","favorite_count":{count}}}"#
        ),
    )
}

pub fn framework() -> Framework {
    let writes = vec![
        append(&format!("article-{A}"), 0, &[published(A, "Folding")]),
        append(&format!("article-{B}"), 0, &[published(B, "Replication")]),
        append(
            &format!("article-{A}"),
            1,
            &[favorited(A, 1), favorited(A, 2)],
        ),
        append(&format!("article-{B}"), 1, &[favorited(B, 1)]),
    ];
    Framework {
        preset: "commanded",
        ddl: DDL,
        init_read_model: None,
        node_writer: false,
        init_writes: &[
            "PROPOSED",
            "aggregate_id = \"convert_from(data, 'UTF8')::jsonb->>'article_uuid'\"",
        ],
        // An article of last year: what `walfold init` samples (not streamed, not folded).
        history: vec![append(&format!("article-{OLD}"), 0, &[published(OLD, "Old")])],
        writes,
        later: Vec::new(),
        text_ids: false,
        events: 5,
        dead_letters: &[],
        read_model: "select string_agg(article_uuid || ' ' || coalesce(title, '-') || ' ' || favorites || ' ' || events, ', ' \
                     order by article_uuid) from article_favorites",
        fold: r#"select string_agg(article_uuid || ' ' || coalesce(title, '-') || ' ' || favorites || ' ' || events, ', '
                   order by article_uuid)
                 from (select (convert_from(data, 'UTF8')::jsonb->>'article_uuid')::uuid as article_uuid,
                         max(convert_from(data, 'UTF8')::jsonb->>'title') as title,
                         count(*) filter (where event_type like '%.ArticleFavorited') as favorites,
                         count(*) as events
                       from events where convert_from(data, 'UTF8')::jsonb->>'title' is distinct from 'Old'
                         and convert_from(data, 'UTF8')::jsonb->>'article_uuid' <> '0b6c1a3e-7d2f-4e8a-9c5b-1d2e3f4a5b60'
                       group by 1) f"#,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commanded_folds_its_events_by_the_payloads_article_through_the_readme_and_init() {
    framework().run().await;
}

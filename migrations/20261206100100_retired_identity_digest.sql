-- A retired identity keeps a digest of its event's content, so an ID delivered again
-- after pruning with other content is an id_conflict, as it is while the log holds the
-- event (the content compared is the duplicate comparison's: type, aggregate, version,
-- payload). Identities retired before keep a null digest: a redelivery of one is taken
-- as the same event, as before.
create function identity_digest(event_type text, aggregate_type text, aggregate_id text,
                                version bigint, payload jsonb)
returns bytea language sql immutable parallel safe
as $$ select decode(md5(jsonb_build_array(event_type, aggregate_type, aggregate_id,
                                           version, payload)::text), 'hex') $$;
alter table retired_identity add column digest bytea;

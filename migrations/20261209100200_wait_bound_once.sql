-- Read your own writes, cheaper looks (issue 41): a wait finds the last event at or
-- before its position once, when ingest has read through it, instead of at every look.
-- Measured with `walfold-bench --only wait` (docs/BENCHMARKS.md): the backward scan from
-- the log's head over every event appended since the position was most of a look's cost
-- under load. What a look decides is unchanged (20261208200100_read_your_writes.sql).

drop function wait_check(text, pg_lsn, text, text, text, timestamptz);

create function wait_check(
    p_projection text, p_lsn pg_lsn, p_source text, p_aggregate_type text,
    p_aggregate_id text, p_since timestamptz, p_bound bigint,
    out status text, out reason text, out subscriber_id text, out event_id uuid,
    out bound bigint)
language plpgsql volatile set search_path from current as $$
declare
    v_source text;
    v_sources integer;
    v_ingest pg_lsn;
    v_wal record;
    v_bound bigint;
    v_scope record;
    v_letter record;
    v_cp record;
    v_rows integer := 0;
    v_partitions integer := 0;
    v_lagging integer[] := '{}';
    v_pause record;
begin
    select p.subscriber_id into subscriber_id from projection p where p.name = p_projection;
    if not found then
        raise exception 'walfold has no projection named %', p_projection
            using errcode = '42704', hint = 'use a [[projection]] name of the config';
    end if;
    if p_source is null then
        select min(i.source), count(distinct i.source) into v_source, v_sources
        from ingest_position i;
        if v_sources = 0 then
            raise exception 'walfold has not read any source yet' using errcode = '55000';
        elsif v_sources > 1 then
            raise exception 'walfold reads several sources: name the one whose position this is'
                using errcode = '22023';
        end if;
    else
        v_source := p_source;
    end if;
    select max(i.lsn) into v_ingest from ingest_position i where i.source = v_source;
    if v_ingest is null then
        raise exception 'walfold does not read a source named %', v_source
            using errcode = '42704';
    end if;

    if v_ingest < p_lsn then
        -- Tells the appender someone waits for this source (walfold_store::wait::
        -- WAITER_LOCK): it then records how far it has read at once, not every 10 s.
        perform pg_try_advisory_xact_lock_shared(2002873431, hashtext(v_source));
        select w.lsn, w.read_at into v_wal from source_wal w where w.source = v_source;
        if found and v_wal.read_at >= p_since and v_wal.lsn < p_lsn then
            raise exception 'position % is past the WAL of source % (at % when read)',
                p_lsn, v_source, v_wal.lsn
                using errcode = '22023',
                hint = 'pass pg_current_wal_lsn() read on that source after the commit';
        end if;
        status := 'pending';
        reason := format('ingest has read source %s through %s', v_source, v_ingest);
        return;
    end if;

    -- The last event of the source committed at or before the position: seqs follow
    -- commit order, so this reads back from the head over the newer events only.
    -- Once ingest has read through the position, the bound is fixed: a later look of the
    -- same wait takes it (`p_bound`) instead of scanning back again over every event
    -- appended meanwhile.
    if p_bound is not null then
        v_bound := p_bound;
    else
        select l.seq into v_bound from event_log l
        where l.source = v_source and l.source_lsn <= p_lsn order by l.seq desc limit 1;
    end if;
    bound := v_bound;
    if v_bound is null then
        status := 'folded';
        return;
    end if;

    select d.id, d.event_id, d.reason, d.status, d.error into v_letter
    from dead_letter d
    where d.subscriber_id = wait_check.subscriber_id and d.status in ('open', 'waiting')
      and d.seq <= v_bound
      and (p_aggregate_type is null or d.aggregate_type = p_aggregate_type)
      and (p_aggregate_id is null or d.aggregate_id = p_aggregate_id)
      and coalesce((select l.source from event_log l where l.seq = d.seq), v_source) = v_source
    order by d.seq limit 1;
    if found then
        event_id := v_letter.event_id;
        if v_letter.reason in ('aggregate_parked', 'version_gap') or v_letter.status = 'waiting' then
            status := 'parked';
            reason := format('event %s waits behind its parked aggregate (%s): %s',
                             v_letter.event_id, v_letter.reason, v_letter.error);
        else
            status := 'dead_letter';
            reason := format('event %s is dead letter %s (%s): %s',
                             v_letter.event_id, v_letter.id, v_letter.reason, v_letter.error);
        end if;
        return;
    end if;

    select s.event_types, s.aggregate_types, s.sources into v_scope
    from wait_scope s where s.subscriber_id = wait_check.subscriber_id;
    for v_cp in
        select c.partition, c.partitions, c.position from checkpoint c
        where c.subscriber_id = wait_check.subscriber_id
    loop
        v_rows := v_rows + 1;
        v_partitions := v_cp.partitions;
        if v_cp.position < v_bound and exists (
            select from event_log l
            where l.seq > v_cp.position and l.seq <= v_bound and l.source = v_source
              and (v_cp.partitions = 1 or l.partition_hash % v_cp.partitions = v_cp.partition)
              and (v_scope.event_types is null or l.event_type = any(v_scope.event_types))
              and (v_scope.aggregate_types is null or l.aggregate_type = any(v_scope.aggregate_types))
              and (v_scope.sources is null or l.source = any(v_scope.sources))
        ) then
            v_lagging := v_lagging || v_cp.partition;
        end if;
    end loop;
    if v_rows = 0 or v_rows < v_partitions then
        status := 'pending';
        reason := format('subscriber %s has not started every partition', subscriber_id);
        return;
    end if;
    if cardinality(v_lagging) = 0 then
        status := 'folded';
        return;
    end if;
    select q.partition, q.error into v_pause from projection_pause q
    where q.subscriber_id = wait_check.subscriber_id and q.partition = any(v_lagging)
    order by q.partition limit 1;
    if found then
        status := 'paused';
        reason := format('partition %s of subscriber %s is paused: %s',
                         v_pause.partition, subscriber_id, v_pause.error);
        return;
    end if;
    status := 'pending';
    reason := format('partitions %s of subscriber %s have not applied every event up to seq %s',
                     v_lagging, subscriber_id, v_bound);
end $$;

-- Waits (at most `timeout`) until projection `projection` has applied every event that
-- source `source` (the only one when null) committed at or before `lsn`, or says why it
-- cannot: status 'folded', 'timeout', 'paused', 'parked' or 'dead_letter', with the
-- reason, the subscriber that serves the projection now and the event concerned.
-- `aggregate_type`/`aggregate_id` narrow the dead-letter and park check to the aggregate
-- the caller reads. Call it in a read committed transaction (each look needs a new
-- snapshot).
create or replace function wait_for(
    projection text, lsn pg_lsn, timeout interval default interval '5 seconds',
    source text default null, aggregate_type text default null, aggregate_id text default null)
returns table (status text, reason text, subscriber_id text, event_id uuid, waited_ms double precision)
language plpgsql volatile set search_path from current as $$
declare
    v_started timestamptz := clock_timestamp();
    v_deadline timestamptz := clock_timestamp() + greatest(timeout, interval '0');
    v_nap double precision := 0.001;
    v_left double precision;
    v_bound bigint;
    c record;
begin
    if current_setting('transaction_isolation') <> 'read committed' then
        raise exception 'wait_for needs a read committed transaction (this one is %)',
            current_setting('transaction_isolation')
            using errcode = '25000',
            hint = 'call it outside the repeatable read or serializable transaction';
    end if;
    loop
        select * into c from wait_check(wait_for.projection, wait_for.lsn, wait_for.source,
                                        wait_for.aggregate_type, wait_for.aggregate_id,
                                        v_started, v_bound);
        v_bound := c.bound;
        v_left := extract(epoch from v_deadline - clock_timestamp());
        if c.status <> 'pending' or v_left <= 0 then
            return query select case when c.status = 'pending' then 'timeout' else c.status end,
                c.reason, c.subscriber_id, c.event_id,
                extract(epoch from clock_timestamp() - v_started)::float8 * 1000;
            return;
        end if;
        perform pg_sleep(least(v_nap, v_left));
        v_nap := least(v_nap * 2, 0.05);
    end loop;
end $$;

do $$
begin
    execute format('alter function wait_for(text, pg_lsn, interval, text, text, text) '
                   'security definer set search_path = %I, pg_temp', current_schema());
    execute format('alter function wait_check(text, pg_lsn, text, text, text, timestamptz, bigint) '
                   'set search_path = %I, pg_temp', current_schema());
end $$;
revoke execute on function wait_for(text, pg_lsn, interval, text, text, text) from public;
revoke execute on function wait_check(text, pg_lsn, text, text, text, timestamptz, bigint) from public;

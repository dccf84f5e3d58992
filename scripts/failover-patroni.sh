#!/usr/bin/env bash
# The failover of tests/tests/e2e/failover.rs driven as users run it: Patroni (with etcd)
# manages a primary and an async streaming replica, with walfold's slot as a Patroni
# permanent logical slot (kept on the replica, advanced as far as it replayed). A
# producer writes one-event transactions through a multi-host key=value conninfo; the
# replica's replication link is frozen so it falls behind; the primary's Patroni and
# PostgreSQL are killed (-9); Patroni promotes the replica when the leader key expires.
# walfold (on_slot_lost = "recreate", a separate target cluster) follows by itself.
# Prints what the new primary holds against what walfold folded, and the phantoms.
#
# Needs: root (the clusters run as `postgres`), Debian's patroni and etcd-server
# (apt-get install patroni etcd-server), PostgreSQL server binaries, socat, and a walfold
# binary (WALFOLD=path, default: target/debug/walfold; build it with `cargo build -p
# walfold`). Not part of the test suite: it takes about a minute, on ports
# around a random base. Usage: scripts/failover-patroni.sh [seconds-behind (default 3)]
set -euo pipefail

behind=${1:-3}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
walfold=${WALFOLD:-${CARGO_TARGET_DIR:-target}/debug/walfold}
walfold=$(realpath "$walfold")
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
for tool in patroni etcd socat "$walfold" "$pgbin/initdb"; do
    command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 2; }
done

work=$(mktemp -d /tmp/walfold-patroni.XXXXXX)
chown postgres: "$work"
base=$((20000 + RANDOM % 20000))
etcd_client=$base etcd_peer=$((base + 1))
pg1=$((base + 2)) rest1=$((base + 3)) pg2=$((base + 4)) rest2=$((base + 5))
target=$((base + 6)) link=$((base + 7))
pids=()
as_pg() { runuser -u postgres -- "$@"; }
log() { printf '%s %s\n' "$(date +%T)" "$*"; }
cleanup() {
    set +e
    for pid in "${pids[@]}"; do kill -CONT -- "-$pid" 2>/dev/null; kill -9 -- "-$pid" 2>/dev/null; done
    for d in node1 node2 target; do
        [ -f "$work/$d/postmaster.pid" ] && as_pg "$pgbin/pg_ctl" -D "$work/$d" -m immediate stop >/dev/null 2>&1
    done
    if [ -n "${KEEP:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
# Each in its own process group (setsid), so it can be frozen or killed whole by its id.
spawn() {
    local name=$1; shift
    setsid "$@" >"$work/$name.log" 2>&1 &
    pids+=("$!")
    eval "${name//-/_}_pid=$!"
}

log "etcd on $etcd_client"
spawn etcd runuser -u postgres -- etcd --name e1 --data-dir "$work/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_client" \
    --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "e1=http://127.0.0.1:$etcd_peer"

# node1's replication goes through a link (socat) that can be frozen: the replica then
# falls behind while clients still reach node1 directly.
spawn link socat "TCP-LISTEN:$link,bind=127.0.0.1,reuseaddr,fork" "TCP:127.0.0.1:$pg1"

node_config() { # name pg rest connect_address
    cat <<EOF
scope: walfold-failover
name: $1
restapi: {listen: "127.0.0.1:$3", connect_address: "127.0.0.1:$3"}
etcd3: {hosts: "127.0.0.1:$etcd_client"}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 1073741824
    postgresql:
      use_pg_rewind: false
      use_slots: true
      parameters:
        wal_level: logical
        hot_standby: "on"
        hot_standby_feedback: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
    slots:
      walfold_patroni: {type: logical, database: app, plugin: pgoutput}
  initdb: [{encoding: UTF8}]
postgresql:
  listen: "127.0.0.1:$2"
  connect_address: "127.0.0.1:$4"
  data_dir: $work/$1
  bin_dir: $pgbin
  pgpass: $work/$1.pgpass
  basebackup: [{checkpoint: fast}]
  authentication:
    superuser: {username: postgres, password: postgres}
    replication: {username: postgres, password: postgres}
  parameters: {unix_socket_directories: "$work"}
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
EOF
}
node_config node1 "$pg1" "$rest1" "$link" >"$work/node1.yml"
node_config node2 "$pg2" "$rest2" "$pg2" >"$work/node2.yml"
chown postgres: "$work"/*.yml

wait_for() { # seconds what command...
    local until=$((SECONDS + $1)) what=$2; shift 2
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $until ] || { echo "timed out waiting for $what" >&2; tail -n 20 "$work"/*.log >&2; exit 1; }
        sleep 0.5
    done
}
sql() { # port db sql
    as_pg "$pgbin/psql" -X -q -t -A -h 127.0.0.1 -p "$1" -d "$2" -c "$3"
}
is_primary() { [ "$(sql "$1" postgres 'select pg_is_in_recovery()')" = f ]; }
is_streaming() { [ "$(sql "$pg1" postgres "select count(*) from pg_stat_replication where state = 'streaming'")" = 1 ]; }

log "patroni node1 (leader to be) on $pg1"
spawn node1 runuser -u postgres -- patroni "$work/node1.yml"
wait_for 60 "node1 to lead" is_primary "$pg1"
sql "$pg1" postgres "create database app" >/dev/null
sql "$pg1" app "create table outbox (id uuid primary key, aggregate_type text not null, \
    aggregate_id text not null, event_type text not null, version bigint, payload jsonb not null, \
    occurred_at timestamptz not null default now())"
log "patroni node2 (replica) on $pg2"
spawn node2 runuser -u postgres -- patroni "$work/node2.yml"
wait_for 90 "node2 to stream" is_streaming
# Patroni creates the permanent slot on the leader and, once it can, a copy on the replica.
slot_on() { # port [active]
    [ "$(sql "$1" app "select count(*) from pg_replication_slots where slot_name = 'walfold_patroni' ${2:+and active}")" = 1 ]
}
wait_for 60 "the permanent slot on node1" slot_on "$pg1"

log "target cluster on $target"
as_pg "$pgbin/initdb" -D "$work/target" -A trust -U postgres >/dev/null
as_pg "$pgbin/pg_ctl" -D "$work/target" -o "-p $target -k $work -c listen_addresses=127.0.0.1" \
    -l "$work/target.log" -w start >/dev/null
sql "$target" postgres "create database reads" >/dev/null
sql "$target" reads "create table ledger (event_id uuid primary key, order_id text, amount numeric); \
    create table order_total (order_id text primary key, total numeric not null)"

source_url="host=127.0.0.1,127.0.0.1 port=$pg2,$pg1 dbname=app user=postgres target_session_attrs=read-write"
cat >"$work/walfold.toml" <<EOF
[source]
url = "$source_url"
slot = "walfold_patroni"
on_slot_lost = "recreate"
heartbeat_interval_s = 1

[target]
url = "host=127.0.0.1 port=$target dbname=reads user=postgres"

[[outbox]]
table = "public.outbox"

[pipeline]
max_backoff_ms = 1000

[log]
level = "info"

[[projection]]
name = "order_total"
subscriber = "orders.total.v1"
sql = """
insert into order_total (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))
on conflict (order_id) do update set total = order_total.total + excluded.total
"""

[[projection]]
name = "ledger"
subscriber = "orders.ledger.v1"
sql = "insert into ledger (event_id, order_id, amount) values (:event_id, :aggregate_id, coalesce(:payload.amount::numeric, 0))"
EOF
log "walfold on the multi-host conninfo (the replica listed first)"
spawn walfold "$walfold" run -c "$work/walfold.toml"
wait_for 60 "walfold to stream" slot_on "$pg1" active
# Patroni keeps a copy of the permanent slot on the replica.
wait_for 60 "the permanent slot's copy on node2" slot_on "$pg2"

# One-event transactions through libpq's multi-host conninfo, until told to stop.
producer() {
    local i=0
    while [ ! -e "$work/stop" ]; do
        i=$((i + 1))
        as_pg "$pgbin/psql" -X -q "$source_url connect_timeout=2" -c \
            "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
             values (gen_random_uuid(), 'order', 'o-' || ($i % 7), 'OrderChanged', $i, \
             jsonb_build_object('amount', ($i % 100)::text))" >/dev/null 2>&1 \
            && echo ok >>"$work/written"
        sleep 0.01
    done
}
# What doctor sees of the two hosts: the primary, and the replica keeping the slot.
"$walfold" doctor -c "$work/walfold.toml" 2>&1 | grep -E "source host|slot walfold_patroni" || true
spawn producer bash -c "$(declare -f producer); work=$work pgbin=$pgbin source_url='$source_url'; $(declare -f as_pg); producer"
sleep 3
# A checkpoint logs the running transactions, so the slot's catalog_xmin (the horizon a
# gap's backfill starts from) moves on.
sql "$pg1" app checkpoint >/dev/null
sleep 2
log "replication link frozen: node2 falls behind for ${behind}s"
kill -STOP -- "-$link_pid"
sleep "$behind"
log "node1 killed (-9: patroni and postgres)"
kill -9 -- "-$node1_pid"
kill -9 "$(head -1 "$work/node1/postmaster.pid")" 2>/dev/null || true
t0=$SECONDS
wait_for 60 "node2 to be promoted" is_primary "$pg2"
log "node2 promoted after $((SECONDS - t0))s"
sleep 3
touch "$work/stop"
wait "$producer_pid" 2>/dev/null || true
sleep 1

# Tally: what the new primary holds against what walfold folded.
wait_caught_up() {
    local n
    n=$(sql "$pg2" app "select count(*) from outbox")
    [ "$(sql "$target" reads "select count(*) from ledger l where exists (select 1 from np where np.id = l.event_id)")" = "$n" ]
}
sql "$target" reads "create table np (id uuid primary key)"
as_pg "$pgbin/psql" -X -q -h 127.0.0.1 -p "$pg2" -d app -c "copy (select id from outbox) to stdout" \
    | as_pg "$pgbin/psql" -X -q -h 127.0.0.1 -p "$target" -d reads -c "copy np from stdin"
wait_for 90 "walfold to fold the new primary" wait_caught_up
sleep 2
committed=$(sql "$target" reads "select count(*) from np")
folded=$(sql "$target" reads "select count(*) from ledger l join np on np.id = l.event_id")
missing=$(sql "$target" reads "select count(*) from np where not exists (select 1 from ledger l where l.event_id = np.id)")
doubled=$(sql "$target" reads "select coalesce((select sum(total) from order_total), 0) - coalesce((select sum(amount) from ledger), 0)")
phantom=$(sql "$target" reads "select count(*) from ledger l where not exists (select 1 from np where np.id = l.event_id)")
flagged=$(sql "$target" reads "select count(*) from walfold.phantom_event where accepted_at is null")
unflagged=$(sql "$target" reads "select count(*) from ledger l where not exists (select 1 from np where np.id = l.event_id) \
    and not exists (select 1 from walfold.phantom_event p where p.event_id = l.event_id)")
failover=$(sql "$target" reads "select 'timeline ' || from_timeline || ' -> ' || to_timeline || ', fork ' || fork_lsn || ', walfold had ingested ' || ingested_lsn from walfold.source_failover")
gaps=$(sql "$target" reads "select count(*) from walfold.slot_gap")
written=$(wc -l <"$work/written")
echo
echo "producer: $written inserts acknowledged"
echo "failover: $failover"
echo "slot: $(grep -o 'the slot survived the failover[^"]*' "$work/walfold.log" | head -1 | cut -c1-90 || true)"
echo "slot gaps recorded: $gaps"
echo "new primary: $committed committed; walfold: folded $folded, missing $missing, doubled $doubled, phantoms $phantom (flagged $flagged, unflagged $unflagged)"
[ "$missing" = 0 ] && [ "$doubled" = 0 ] && [ "$unflagged" = 0 ] && [ "$folded" = "$committed" ] \
    || { echo "FAILED" >&2; KEEP=1; exit 1; }
echo "ok"

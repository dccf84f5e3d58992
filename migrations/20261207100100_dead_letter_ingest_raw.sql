-- An ingest dead letter is recorded once across the stream and `walfold backfill` by
-- looking for the same raw row under the other kind of identity. Without an index that
-- look scanned every ingest dead letter: a transaction of 100k malformed rows took
-- quadratic time (34 minutes), holding all ingest. A hash index finds the raw row in
-- constant time whatever its size.
create index dead_letter_ingest_raw on dead_letter using hash (raw)
    where subscriber_id is null;

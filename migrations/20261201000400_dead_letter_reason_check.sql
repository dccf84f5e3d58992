-- A dead letter's reason is one of `walfold_store::Reason`, as its status is one of
-- `DeadLetterStatus` and a rebuild's state one of `RebuildState`: the database refuses
-- any other spelling (a unit test checks these lists against the Rust enums). Every
-- reason walfold has ever written is in the list, so existing rows pass.
alter table dead_letter add constraint dead_letter_reason_check
    check (reason in ('malformed', 'id_conflict', 'projection_failed', 'aggregate_parked',
                      'version_gap', 'version_conflict'));

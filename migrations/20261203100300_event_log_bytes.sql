-- An event's payload size as text, in bytes, so a projector's page is cut by bytes as
-- well as rows in SQL (pipeline.page_bytes). Null for events appended before: they
-- count as their stored size.
alter table event_log add column bytes integer;

-- An event over pipeline.max_event_bytes is dead-lettered as too large.
alter table dead_letter drop constraint dead_letter_reason_check;
alter table dead_letter add constraint dead_letter_reason_check
    check (reason in ('malformed', 'id_conflict', 'projection_failed', 'aggregate_parked',
                      'version_gap', 'version_conflict', 'too_large'));

-- Why and when an operator resolved a dead letter (e.g. `walfold dead-letters discard`).
alter table dead_letter add column resolution text;
alter table dead_letter add column resolved_at timestamptz;

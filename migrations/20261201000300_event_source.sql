-- Which [[source]] an event came from. Events appended before several sources existed
-- came from the only one, whose name defaults to 'default'. A constant default is a
-- catalog change only: no rewrite of the log.
alter table event_log add column source text not null default 'default';

-- A slot gap's reason is one of walfold_event::GapReason's values, never any other
-- spelling (a unit test checks this list against the Rust enum). Every reason walfold
-- has ever written is in the list, so existing rows pass.
alter table slot_gap add constraint slot_gap_reason_check
    check (reason in ('missing', 'failover', 'invalidated', 'advanced', 'publication'));

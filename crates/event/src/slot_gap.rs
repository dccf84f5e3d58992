//! Why a WAL range of a slot may be missing from the event log. The table that keeps
//! the ranges (`slot_gap`) is in `walfold-store`.

crate::stored_enum! {
    /// Why a slot gap was recorded: the `slot_gap.reason` column, whose check constraint
    /// allows exactly these.
    pub enum GapReason {
        /// The slot walfold ingested through was gone and was recreated
        /// (`on_slot_lost = "recreate"`).
        Missing = "missing",
        /// A failover: the slot on the new primary is missing or starts past walfold's
        /// position at the fork.
        Failover = "failover",
        /// The server invalidated the slot (`max_slot_wal_keep_size`), and it was recreated.
        Invalidated = "invalidated",
        /// Something other than walfold moved the slot past the recorded position.
        Advanced = "advanced",
        /// The publication was rewritten since walfold last looked.
        Publication = "publication",
    }
}

#[cfg(test)]
mod tests {
    use super::GapReason;
    use crate::stored_enum::assert_round_trips;

    #[test]
    fn every_reason_round_trips() {
        assert_round_trips(GapReason::ALL, GapReason::as_str);
    }
}

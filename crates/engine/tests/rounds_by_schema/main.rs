//! A `table` projection applying a batch in rounds, on invented schemas: a table that
//! may take rounds (`fast`) and an identical twin kept on the per-event loop by a no-op
//! trigger (`slow`) must give the same per-event outcomes (or the same error) and the
//! same rows, or install keeps the loop for the table.
//!
//! The cases marked "was a bug on 0e9042d" failed on the commit they were written
//! against ("A table projection applies a batch in rounds"); install now keeps the loop
//! for each (an allow-list: text keys with a deterministic collation, plain or
//! partitioned tables, no row security or identity, only immutable functions in
//! columns, defaults and checks), and they stay as regression tests with the rest. By
//! what the schema has: the key column's type (`key_types.rs`), the column expressions
//! (`column_expressions.rs`), the table's own features (`table_features.rs`).

mod column_expressions;
mod key_types;
mod table_features;
mod twin;

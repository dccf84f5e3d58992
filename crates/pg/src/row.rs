//! Reading rows: every column of a row of walfold's own tables (or of the catalog, or
//! of what a query computes from them) is read through `try_get`, so a table that has
//! drifted (a column an operator altered to another type, made nullable or dropped) is
//! an environment error naming the table and the column, never a panic. Each row type
//! decodes through one [`FromRow`] conversion; a one-off value through
//! [`RowExt::of`]`(table).col(column)`.

use std::fmt::Display;

use tokio_postgres::row::RowIndex;
use tokio_postgres::types::FromSql;
use tokio_postgres::Row;

use crate::error::PgError;

/// A row type, decoded by column through one fallible conversion.
pub trait FromRow: Sized {
    /// The row as `Self`, or an environment error naming the column that cannot be read.
    fn from_row(row: &Row) -> Result<Self, PgError>;

    /// Every row as `Self`, in order; the first column that cannot be read fails all.
    fn from_rows(rows: &[Row]) -> Result<Vec<Self>, PgError> {
        rows.iter().map(Self::from_row).collect()
    }
}

/// Reading a [`Row`] through `try_get`, naming what it is a row of in every error.
pub trait RowExt {
    /// The row as one of `table`'s: the table of walfold's schema or the catalog view it
    /// comes from (or what the query computes, for a row of aggregates).
    fn of(&self, table: &'static str) -> Columns<'_>;
}

impl RowExt for Row {
    fn of(&self, table: &'static str) -> Columns<'_> {
        Columns { row: self, table }
    }
}

/// A row, known as one of `table`'s, read column by column.
#[derive(Clone, Copy)]
pub struct Columns<'r> {
    row: &'r Row,
    table: &'static str,
}

impl<'r> Columns<'r> {
    /// Column `column` (a name, or a position) as a `T`: an environment error naming the
    /// table and the column when the row has no such column, holds it as another type, or
    /// holds a null that `T` cannot take.
    pub fn col<T: FromSql<'r>>(&self, column: impl Column) -> Result<T, PgError> {
        self.row.try_get(column).map_err(|source| PgError::Column {
            table: self.table,
            column: column.name(self.row),
            source,
        })
    }
}

/// How a column is picked: by name (`"lsn"`) or by position (`0`).
pub trait Column: RowIndex + Display + Copy {
    /// The column's name, for errors.
    fn name(self, row: &Row) -> String;
}

impl Column for &str {
    fn name(self, _: &Row) -> String {
        self.to_owned()
    }
}

/// A position is named by the column the query returned there.
impl Column for usize {
    fn name(self, row: &Row) -> String {
        row.columns()
            .get(self)
            .map_or_else(|| format!("#{self}"), |c| c.name().to_owned())
    }
}

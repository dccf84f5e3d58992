//! SQL compilation: a `sql` or `table` projection's statement, for its own table or a
//! rebuild's shadow table.

use crate::error::Problem;
use crate::ident::QualifiedName;
use crate::model::{ProjectionConfig, ProjectionKind, Statement, TableProjection};
use crate::raw::problem;
use crate::template::{Template, Upsert};
impl ProjectionKind {
    /// The statement, writing to `storage` instead of the projection's own table when
    /// given (a rebuild's shadow table); problems' keys are within the entry.
    pub(crate) fn compile(
        &self,
        storage: Option<&QualifiedName>,
    ) -> Result<Statement, Vec<Problem>> {
        match self {
            ProjectionKind::Sql { statement, target } => {
                let sql = match storage.or(target.as_ref()) {
                    Some(table) if target.is_some() => {
                        Template::replace_in_code(statement, "{table}", &table.quoted())
                            .map_err(|e| vec![problem("sql", e.to_string())])?
                    }
                    _ => statement.clone(),
                };
                Template::compile(&sql)
                    .map(Statement::Sql)
                    .map_err(|e| vec![problem("sql", e.to_string())])
            }
            ProjectionKind::Table {
                table,
                key,
                version_column,
                columns,
            } => {
                let table = storage.unwrap_or(table);
                let upsert = Upsert::new(table, key, version_column, columns);
                match Template::compile(&upsert.one()) {
                    Ok(template) => Ok(Statement::Table(Box::new(TableProjection {
                        table: table.clone(),
                        key: key.clone(),
                        version_column: version_column.clone(),
                        upsert,
                        template,
                    }))),
                    Err(e) => Err(vec![problem("columns", e.to_string())]),
                }
            }
            ProjectionKind::Code { .. } => Err(vec![problem(
                "sql",
                "a projection written in Rust has no statement to compile".into(),
            )]),
        }
    }
}

impl ProjectionConfig {
    /// Compiles the projection's statement; `index` is its position, for error keys.
    pub fn statement(&self, index: usize) -> Result<Statement, Vec<Problem>> {
        self.statement_for(index, None)
    }

    /// Compiles the projection's statement writing to `storage` instead of its own table
    /// (a rebuild's shadow table) when given.
    pub fn statement_for(
        &self,
        index: usize,
        storage: Option<&QualifiedName>,
    ) -> Result<Statement, Vec<Problem>> {
        self.kind.compile(storage).map_err(|ps| {
            ps.into_iter()
                .map(|p| Problem {
                    key: format!("projection[{index}].{}", p.key),
                    message: p.message,
                })
                .collect()
        })
    }

    /// The table this projection writes: `table`, or `target` of a `sql` (or Rust)
    /// projection.
    pub fn storage(&self) -> Option<QualifiedName> {
        match &self.kind {
            ProjectionKind::Table { table, .. } => Some(table.clone()),
            ProjectionKind::Sql { target, .. } | ProjectionKind::Code { target } => target.clone(),
        }
    }
}

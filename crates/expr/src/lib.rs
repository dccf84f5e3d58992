//! Field expressions of an `[[outbox]]`: where each field of an event sits in a row,
//! written as a user would write it in a PostgreSQL view over the outbox table
//! (`"Body"::jsonb->'message'->>'orderId'`, `split_part(stream_name, '-', 1)`).
//!
//! Parsed once at load ([`parse`]: what cannot be supported is refused there, naming
//! it); evaluated per row in walfold ([`Expr::eval`]), with PostgreSQL's semantics for
//! the subset it accepts, so ingest needs no round trip and a row an expression fails
//! on fails alone (its caller dead-letters it). No I/O.
//!
//! Column names follow PostgreSQL: unquoted names fold to lower case, `"Body"` keeps
//! its case. (A config field that is a bare column name is matched as written by the
//! caller before it ever reaches here.)

mod value;

pub use value::{Input, Value};

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    node: Node,
    /// The text it was parsed from, for messages.
    source: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    /// A column of the row (already case-folded as PostgreSQL would).
    Column(String),
    /// A string literal (`'order'`).
    Text(String),
}

/// The row an expression is evaluated over: its columns by name.
pub trait Row {
    /// The column named `name` (exactly), `None` when the row has no such column.
    fn column(&self, name: &str) -> Option<Input<'_>>;
}

/// Parses `source`; the error says what is not supported (the caller adds the key).
pub fn parse(source: &str) -> Result<Expr, String> {
    let s = source.trim();
    let node = if let Some(inner) = s.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        Node::Text(inner.replace("''", "'"))
    } else if let Some(inner) = s.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Node::Column(inner.replace("\"\"", "\""))
    } else if !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !s.as_bytes()[0].is_ascii_digit()
    {
        Node::Column(s.to_ascii_lowercase())
    } else {
        return Err(format!("`{s}` is not an expression walfold can evaluate"));
    };
    Ok(Expr {
        node,
        source: source.to_owned(),
    })
}

impl Expr {
    /// The text it was parsed from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The columns it reads, each once, in order of appearance.
    pub fn columns(&self) -> Vec<&str> {
        match &self.node {
            Node::Column(c) => vec![c.as_str()],
            Node::Text(_) => vec![],
        }
    }

    /// Its value over `row`; an error (a column the row lacks, a cast that fails)
    /// names what failed, as PostgreSQL would.
    pub fn eval(&self, row: &dyn Row) -> Result<Value, String> {
        match &self.node {
            Node::Column(c) => {
                let input = row
                    .column(c)
                    .ok_or_else(|| format!("column \"{c}\" does not exist"))?;
                Value::from_input(input)
            }
            Node::Text(t) => Ok(Value::Text(t.clone())),
        }
    }
}

//! Field expressions of an `[[outbox]]`: where each field of an event sits in a row,
//! written as a user would write it in a PostgreSQL view over the outbox table
//! (`"Body"::jsonb->'message'->>'orderId'`, `split_part(stream_name, '-', 1)`).
//!
//! Parsed once at load ([`parse`]: what cannot be supported is refused there, naming
//! it); evaluated per row in walfold ([`Expr::eval`]), with PostgreSQL's semantics for
//! the subset it accepts, so ingest needs no round trip and a row an expression fails
//! on fails alone (its caller dead-letters it). No I/O. A differential test
//! (`tests/postgres.rs`) checks each construct against a real PostgreSQL 15.
//!
//! # The subset
//!
//! | | |
//! |---|---|
//! | names | columns, PostgreSQL's rules: unquoted names fold to lower case, `"Body"` keeps its case; functions by name, any case |
//! | constants | `'text'` (`''` for a quote), `E'\n'`, numbers (`42` integer, `3000000000` bigint, `1.5` numeric), `true`, `false`, `NULL` |
//! | JSON | `->` (key or index, negative from the end), `->>`, `#>` and `#>>` with a path `'{a,0,b}'`; `jsonb \|\| jsonb` |
//! | casts | `::t` and `CAST(x AS t)` to `text`, `varchar[(n)]`, `char(n)`, `json`, `jsonb`, `uuid`, `bytea`, `boolean`, `smallint`, `integer`/`int`, `bigint` |
//! | operators | `\|\|`, `= <> != < > <= >=`, `AND OR NOT`, `IS [NOT] NULL/TRUE/FALSE/UNKNOWN`, `[NOT] IN (…)`, `[NOT] LIKE`/`ILIKE` (`ESCAPE`), unary `-`, parentheses |
//! | conditionals | `CASE [x] WHEN … THEN … [ELSE …] END`, `coalesce`, `nullif` |
//! | functions | `split_part`, `substring(x from n for m)`/`substring(x, n, m)`/`substr`, `position(a in b)`/`strpos`, `lower`, `upper`, `trim([both\|leading\|trailing] [c] from x)`/`btrim`/`ltrim`/`rtrim`, `replace`, `length`, `concat`, `concat_ws`, `convert_from(x, 'UTF8'\|'LATIN1')`, `decode(x, 'base64'\|'hex'\|'escape')`, `encode` |
//! | Message DB | `message_store.category(x)` (= `split_part(x, '-', 1)`), `message_store.id(x)` (after the first `-`, NULL without one) |
//!
//! Types are PostgreSQL's: a column is read by its type (text types, `json`/`jsonb`,
//! `bytea`, `uuid`, integers, `boolean`, `numeric`; any other type keeps its text and
//! converts only to text), constants take the type their context gives them, and an
//! operator the server would not resolve for the operands' types is an error naming
//! it (`operator does not exist: text -> unknown`, `cannot cast type bytea to jsonb`).
//! Column types are known only when a row arrives, so such an error surfaces then;
//! parts without columns are evaluated at [`parse`], so `'x'::uuid` is refused there.
//! NULLs behave as in SQL (strict functions, three-valued AND/OR/NOT, IN, comparisons).
//!
//! Differences from a server, on purpose: text compares bytewise (collation `"C"`);
//! `lower`/`upper` map case as a UTF-8 locale does (a database with the C locale
//! folds only ASCII); `json` values follow jsonb's rules (their text comes out in
//! jsonb's form, the last of duplicate keys wins); integer input follows PostgreSQL 15
//! (no `0x`, no `_`).
//!
//! Refused at parse, by name: other functions (`lo_get`, `now`, …), arithmetic,
//! other operators (`@>`, `?`, `~`), subqueries, aggregates and window functions,
//! parameters, casts to other types (`::date`), `BETWEEN`, `SIMILAR TO`,
//! `IS DISTINCT FROM`, subscripts, `COLLATE`, dollar quoting, qualified column names.

mod ast;
mod bytes;
mod cast;
mod datum;
mod eval;
mod func;
mod json;
mod lex;
mod numeric;
mod parse;
mod text;
mod types;
mod value;

pub use value::{Input, Value};

use ast::Node;
use datum::Datum;

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    node: Node,
    /// The columns it reads, in order of appearance.
    columns: Vec<String>,
    /// The text it was parsed from, for messages.
    source: String,
}

/// The row an expression is evaluated over: its columns by name.
pub trait Row {
    /// The column named `name` (exactly), `None` when the row has no such column.
    fn column(&self, name: &str) -> Option<Input<'_>>;
}

/// A row without columns, for the parts of an expression that read none.
struct NoRow;

impl Row for NoRow {
    fn column(&self, _: &str) -> Option<Input<'_>> {
        None
    }
}

/// Parses `source`; the error says what is not supported (the caller adds the key).
pub fn parse(source: &str) -> Result<Expr, String> {
    let tokens = lex::tokenize(source)?;
    let node = parse::parse(tokens, source)?;
    let mut columns = Vec::new();
    node.columns(&mut columns);
    let columns = columns.into_iter().map(str::to_owned).collect();
    check_constant_casts(&node)?;
    let node = fold(node)?;
    Ok(Expr {
        node,
        columns,
        source: source.to_owned(),
    })
}

/// A cast of a constant fails as the server's parser fails it, even in a branch
/// that is never taken.
fn check_constant_casts(n: &Node) -> Result<(), String> {
    if let Node::Cast(inner, t) = n {
        if let Node::Lit(Some(s)) = inner.as_ref() {
            cast::cast(
                Datum {
                    ty: types::Ty::Unknown,
                    v: Some(datum::V::Str(s.clone())),
                },
                *t,
            )?;
        }
    }
    n.kids().into_iter().try_for_each(check_constant_casts)
}

fn reads_columns(n: &Node) -> bool {
    matches!(n, Node::Column(_)) || n.kids().into_iter().any(reads_columns)
}

/// Evaluates the parts that read no column once, as the server's planner folds
/// constants: CASE arms after a constant false condition and COALESCE arguments
/// after a constant non-NULL one are left alone, as the planner leaves them.
fn fold(n: Node) -> Result<Node, String> {
    let n = match n {
        Node::Column(_) | Node::Lit(_) | Node::Const(_) => return Ok(n),
        Node::Case {
            operand,
            whens,
            otherwise,
        } => {
            let operand = operand.map(|o| fold(*o).map(Box::new)).transpose()?;
            let mut out = Vec::with_capacity(whens.len());
            let mut settled = false;
            for (w, t) in whens {
                if settled {
                    out.push((w, t));
                    continue;
                }
                let w = fold(w)?;
                let constant = if operand.is_none() {
                    match &w {
                        Node::Const(Datum {
                            v: Some(datum::V::Bool(b)),
                            ..
                        }) => Some(*b),
                        Node::Const(Datum { v: None, .. }) | Node::Lit(None) => Some(false),
                        _ => None,
                    }
                } else {
                    None
                };
                match constant {
                    Some(false) => out.push((w, t)),
                    Some(true) => {
                        out.push((w, fold(t)?));
                        settled = true;
                    }
                    None => out.push((w, fold(t)?)),
                }
            }
            let otherwise = match otherwise {
                Some(o) if !settled => Some(Box::new(fold(*o)?)),
                o => o,
            };
            Node::Case {
                operand,
                whens: out,
                otherwise,
            }
        }
        Node::Coalesce(args) => {
            let mut out = Vec::with_capacity(args.len());
            let mut settled = false;
            for a in args {
                if settled {
                    out.push(a);
                    continue;
                }
                let a = fold(a)?;
                settled = matches!(&a, Node::Const(d) if !d.is_null())
                    || matches!(&a, Node::Lit(Some(_)));
                out.push(a);
            }
            Node::Coalesce(out)
        }
        n => map_kids(n, &mut fold)?,
    };
    if reads_columns(&n) {
        return Ok(n);
    }
    Ok(Node::Const(eval::eval(&n, &NoRow)?))
}

/// Rebuilds `n` with `f` applied to each direct child.
fn map_kids(n: Node, f: &mut dyn FnMut(Node) -> Result<Node, String>) -> Result<Node, String> {
    let mut b = |x: Box<Node>| f(*x).map(Box::new);
    Ok(match n {
        Node::Cast(e, t) => Node::Cast(b(e)?, t),
        Node::Neg(e) => Node::Neg(b(e)?),
        Node::Plus(e) => Node::Plus(b(e)?),
        Node::Not(e) => Node::Not(b(e)?),
        Node::IsNull(e, neg) => Node::IsNull(b(e)?, neg),
        Node::IsBool {
            expr,
            what,
            negated,
        } => Node::IsBool {
            expr: b(expr)?,
            what,
            negated,
        },
        Node::Concat(l, r) => Node::Concat(b(l)?, b(r)?),
        Node::Compare(op, l, r) => Node::Compare(op, b(l)?, b(r)?),
        Node::And(l, r) => Node::And(b(l)?, b(r)?),
        Node::Or(l, r) => Node::Or(b(l)?, b(r)?),
        Node::NullIf(l, r) => Node::NullIf(b(l)?, b(r)?),
        Node::Arrow { text, left, right } => Node::Arrow {
            text,
            left: b(left)?,
            right: b(right)?,
        },
        Node::Path { text, left, right } => Node::Path {
            text,
            left: b(left)?,
            right: b(right)?,
        },
        Node::Like {
            expr,
            pattern,
            escape,
            negated,
            ilike,
        } => Node::Like {
            expr: b(expr)?,
            pattern: b(pattern)?,
            escape: escape.map(&mut b).transpose()?,
            negated,
            ilike,
        },
        Node::In {
            expr,
            list,
            negated,
        } => Node::In {
            expr: b(expr)?,
            list: list.into_iter().map(&mut *f).collect::<Result<_, _>>()?,
            negated,
        },
        Node::Call(func, args) => {
            Node::Call(func, args.into_iter().map(f).collect::<Result<_, _>>()?)
        }
        other => other,
    })
}

impl Expr {
    /// The text it was parsed from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The columns it reads, each once, in order of appearance (as PostgreSQL names
    /// them: unquoted names lower-cased).
    pub fn columns(&self) -> Vec<&str> {
        self.columns.iter().map(String::as_str).collect()
    }

    /// Whether it reads no column (its value is the same for every row).
    pub fn is_constant(&self) -> bool {
        self.columns.is_empty()
    }

    /// Its value over `row`; an error (a column the row lacks, a cast that fails, an
    /// operator the operands' types do not have) says what failed, as PostgreSQL would.
    pub fn eval(&self, row: &dyn Row) -> Result<Value, String> {
        eval::eval(&self.node, row).map(Datum::into_value)
    }
}

#[cfg(test)]
mod tests;

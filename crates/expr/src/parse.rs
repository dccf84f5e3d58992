//! The parser: recursive descent over PostgreSQL's precedence levels, lowest first:
//! OR, AND, NOT, IS, comparison, IN/LIKE, other operators (`->` `->>` `#>` `#>>`
//! `||`, left-associative), unary minus, `::`. What the subset lacks is refused
//! here, by name.

use crate::ast::{CmpOp, Node};
use crate::cast::Target;
use crate::datum::{Datum, V};
use crate::func::Func;
use crate::lex::{Tok, Token};
use crate::types::Ty;

/// PostgreSQL's reserved words that can never be a column name unquoted.
const RESERVED: &[&str] = &[
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "both",
    "case",
    "cast",
    "check",
    "collate",
    "column",
    "constraint",
    "create",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "false",
    "fetch",
    "for",
    "foreign",
    "from",
    "grant",
    "group",
    "having",
    "in",
    "initially",
    "intersect",
    "into",
    "lateral",
    "leading",
    "limit",
    "not",
    "null",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "placing",
    "primary",
    "references",
    "returning",
    "select",
    "some",
    "symmetric",
    "table",
    "then",
    "to",
    "trailing",
    "true",
    "union",
    "unique",
    "user",
    "using",
    "variadic",
    "when",
    "where",
    "window",
    "with",
];

/// Keywords that read a value of the session (`current_timestamp`…), which walfold
/// does not have.
const SESSION_VALUES: &[&str] = &[
    "current_date",
    "current_time",
    "current_timestamp",
    "localtime",
    "localtimestamp",
    "current_user",
    "current_role",
    "session_user",
    "current_catalog",
    "current_schema",
];

pub(crate) fn parse(tokens: Vec<Token>, src: &str) -> Result<Node, String> {
    let mut p = Parser {
        toks: tokens,
        pos: 0,
        src,
    };
    if p.toks.is_empty() {
        return Err("the expression is empty".into());
    }
    let node = p.expr()?;
    if p.pos < p.toks.len() {
        return Err(p.syntax_error());
    }
    Ok(node)
}

struct Parser<'s> {
    toks: Vec<Token>,
    pos: usize,
    src: &'s str,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.kind)
    }

    fn peek_at(&self, n: usize) -> Option<&Tok> {
        self.toks.get(self.pos + n).map(|t| &t.kind)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).map(|t| t.kind.clone());
        if t.is_some() {
            self.pos += 1;
        }
        t
    }

    fn is_kw(&self, kw: &str) -> bool {
        matches!(self.peek(), Some(Tok::Ident(w)) if w == kw)
    }

    fn is_kw_at(&self, n: usize, kw: &str) -> bool {
        matches!(self.peek_at(n), Some(Tok::Ident(w)) if w == kw)
    }

    fn eat_kw(&mut self, kw: &str) -> bool {
        if self.is_kw(kw) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn is_op(&self, op: &str) -> bool {
        matches!(self.peek(), Some(Tok::Op(o)) if o == op)
    }

    fn expect(&mut self, want: &Tok, what: &str) -> Result<(), String> {
        if self.peek() == Some(want) {
            self.pos += 1;
            Ok(())
        } else {
            Err(format!("{} (expected {what})", self.syntax_error()))
        }
    }

    fn expect_kw(&mut self, kw: &str) -> Result<(), String> {
        if self.eat_kw(kw) {
            Ok(())
        } else {
            Err(format!(
                "{} (expected {})",
                self.syntax_error(),
                kw.to_uppercase()
            ))
        }
    }

    fn syntax_error(&self) -> String {
        match self.toks.get(self.pos) {
            None => "syntax error at end of input".into(),
            Some(t) => {
                let rest = &self.src[t.at..];
                let word: String = match &t.kind {
                    Tok::Ident(w) | Tok::Op(w) => w.clone(),
                    _ => rest.chars().take(12).collect(),
                };
                format!("syntax error at or near \"{word}\" (offset {})", t.at)
            }
        }
    }

    fn expr(&mut self) -> Result<Node, String> {
        self.or()
    }

    fn or(&mut self) -> Result<Node, String> {
        let mut left = self.and()?;
        while self.eat_kw("or") {
            let right = self.and()?;
            left = Node::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Node, String> {
        let mut left = self.not()?;
        while self.eat_kw("and") {
            let right = self.not()?;
            left = Node::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Node, String> {
        if self.eat_kw("not") {
            return Ok(Node::Not(Box::new(self.not()?)));
        }
        self.is()
    }

    fn is(&mut self) -> Result<Node, String> {
        let mut e = self.comparison()?;
        loop {
            if self.eat_kw("isnull") {
                e = Node::IsNull(Box::new(e), false);
            } else if self.eat_kw("notnull") {
                e = Node::IsNull(Box::new(e), true);
            } else if self.eat_kw("is") {
                let negated = self.eat_kw("not");
                let what = match self.next() {
                    Some(Tok::Ident(w)) if w == "null" => {
                        e = Node::IsNull(Box::new(e), negated);
                        continue;
                    }
                    Some(Tok::Ident(w)) if w == "true" => Some(true),
                    Some(Tok::Ident(w)) if w == "false" => Some(false),
                    Some(Tok::Ident(w)) if w == "unknown" => None,
                    Some(Tok::Ident(w)) if w == "distinct" => {
                        return Err("IS [NOT] DISTINCT FROM is not supported".into())
                    }
                    _ => {
                        self.pos -= 1;
                        return Err(format!(
                            "{} (only IS [NOT] NULL, TRUE, FALSE, UNKNOWN are supported)",
                            self.syntax_error()
                        ));
                    }
                };
                e = Node::IsBool {
                    expr: Box::new(e),
                    what,
                    negated,
                };
            } else if let Some(cmp) = match self.peek() {
                Some(Tok::Op(o)) => CmpOp::from_symbol(o),
                _ => None,
            } {
                // `x IS NULL = false`: the test's result compared.
                self.pos += 1;
                let right = self.in_like()?;
                e = Node::Compare(cmp, Box::new(e), Box::new(right));
            } else {
                return Ok(e);
            }
        }
    }

    fn comparison(&mut self) -> Result<Node, String> {
        let left = self.in_like()?;
        let Some(Tok::Op(op)) = self.peek() else {
            return Ok(left);
        };
        let Some(cmp) = CmpOp::from_symbol(op) else {
            return Ok(left);
        };
        self.pos += 1;
        let right = self.in_like()?;
        if matches!(self.peek(), Some(Tok::Op(o)) if CmpOp::from_symbol(o).is_some()) {
            return Err(format!(
                "{} (comparisons do not chain)",
                self.syntax_error()
            ));
        }
        Ok(Node::Compare(cmp, Box::new(left), Box::new(right)))
    }

    fn in_like(&mut self) -> Result<Node, String> {
        let left = self.other()?;
        let negated = self.is_kw("not")
            && ["in", "like", "ilike", "between", "similar"]
                .iter()
                .any(|k| self.is_kw_at(1, k));
        if negated {
            self.pos += 1;
        }
        if self.eat_kw("in") {
            self.expect(&Tok::LParen, "( after IN")?;
            if self.is_kw("select") || self.is_kw("with") || self.is_kw("values") {
                return Err("subqueries are not supported".into());
            }
            let mut list = vec![self.expr()?];
            while self.peek() == Some(&Tok::Comma) {
                self.pos += 1;
                list.push(self.expr()?);
            }
            self.expect(&Tok::RParen, ")")?;
            return Ok(Node::In {
                expr: Box::new(left),
                list,
                negated,
            });
        }
        let ilike = self.is_kw("ilike");
        if self.eat_kw("like") || self.eat_kw("ilike") {
            let pattern = self.other()?;
            let escape = if self.eat_kw("escape") {
                Some(Box::new(self.other()?))
            } else {
                None
            };
            return Ok(Node::Like {
                expr: Box::new(left),
                pattern: Box::new(pattern),
                escape,
                negated,
                ilike,
            });
        }
        if self.is_kw("between") || self.is_kw("similar") {
            let w = if self.is_kw("between") {
                "BETWEEN"
            } else {
                "SIMILAR TO"
            };
            return Err(format!("{w} is not supported"));
        }
        Ok(left)
    }

    fn other(&mut self) -> Result<Node, String> {
        let mut left = self.unary()?;
        loop {
            let Some(Tok::Op(op)) = self.peek() else {
                return Ok(left);
            };
            let op = op.clone();
            let make: fn(Node, Node) -> Node = match op.as_str() {
                "||" => |l, r| Node::Concat(Box::new(l), Box::new(r)),
                "->" => |l, r| Node::Arrow {
                    text: false,
                    left: Box::new(l),
                    right: Box::new(r),
                },
                "->>" => |l, r| Node::Arrow {
                    text: true,
                    left: Box::new(l),
                    right: Box::new(r),
                },
                "#>" => |l, r| Node::Path {
                    text: false,
                    left: Box::new(l),
                    right: Box::new(r),
                },
                "#>>" => |l, r| Node::Path {
                    text: true,
                    left: Box::new(l),
                    right: Box::new(r),
                },
                o if CmpOp::from_symbol(o).is_some() => return Ok(left),
                "+" | "-" | "*" | "/" | "%" | "^" => {
                    return Err(format!("arithmetic (operator {op}) is not supported"))
                }
                _ => return Err(format!("operator {op} is not supported")),
            };
            self.pos += 1;
            let right = self.unary()?;
            left = make(left, right);
        }
    }

    fn unary(&mut self) -> Result<Node, String> {
        if self.is_op("-") {
            self.pos += 1;
            let e = self.unary()?;
            return Ok(match e {
                Node::Number(n) => Node::Number(match n.strip_prefix('-') {
                    Some(pos) => pos.to_owned(),
                    None => format!("-{n}"),
                }),
                e => Node::Neg(Box::new(e)),
            });
        }
        if self.is_op("+") {
            self.pos += 1;
            return Ok(Node::Plus(Box::new(self.unary()?)));
        }
        if let Some(Tok::Op(op)) = self.peek() {
            return Err(format!("prefix operator {op} is not supported"));
        }
        self.postfix()
    }

    fn postfix(&mut self) -> Result<Node, String> {
        let mut e = self.primary()?;
        loop {
            match self.peek() {
                Some(Tok::Cast) => {
                    self.pos += 1;
                    let t = self.type_name()?;
                    e = Node::Cast(Box::new(e), t);
                }
                Some(Tok::LBracket) => {
                    return Err("subscripts ([…]) are not supported: use -> or #>".into())
                }
                Some(Tok::Ident(w)) if w == "collate" => {
                    return Err(
                        "COLLATE is not supported (text compares bytewise, as collation \"C\")"
                            .into(),
                    )
                }
                Some(Tok::Ident(w)) if w == "at" => {
                    return Err("AT TIME ZONE is not supported".into())
                }
                _ => return Ok(e),
            }
        }
    }

    fn primary(&mut self) -> Result<Node, String> {
        let Some(tok) = self.next() else {
            return Err("syntax error at end of input".into());
        };
        match tok {
            Tok::Str(s) => Ok(Node::Lit(Some(s))),
            Tok::Number(n) => Ok(Node::Number(n)),
            Tok::LParen => {
                if self.is_kw("select") || self.is_kw("with") || self.is_kw("values") {
                    return Err("subqueries are not supported".into());
                }
                let e = self.expr()?;
                if self.peek() == Some(&Tok::Comma) {
                    return Err("row constructors ((a, b)) are not supported".into());
                }
                self.expect(&Tok::RParen, ")")?;
                Ok(e)
            }
            Tok::Param(p) => Err(format!(
                "parameters ({p}) are not supported: an expression reads the row's columns"
            )),
            Tok::Quoted(name) => self.name_use(name, true),
            Tok::Ident(w) => match w.as_str() {
                "null" => Ok(Node::Lit(None)),
                "true" => Ok(Node::Const(Datum::new(Ty::Bool, V::Bool(true)))),
                "false" => Ok(Node::Const(Datum::new(Ty::Bool, V::Bool(false)))),
                "case" => self.case(),
                "cast" => {
                    self.expect(&Tok::LParen, "( after CAST")?;
                    let e = self.expr()?;
                    self.expect_kw("as")?;
                    let t = self.type_name()?;
                    self.expect(&Tok::RParen, ")")?;
                    Ok(Node::Cast(Box::new(e), t))
                }
                "select" | "exists" | "with" | "values" => {
                    Err("subqueries are not supported".into())
                }
                "array" => Err("ARRAY constructors are not supported".into()),
                "row" if self.peek() == Some(&Tok::LParen) => {
                    Err("row constructors are not supported".into())
                }
                w if SESSION_VALUES.contains(&w) => Err(format!(
                    "{w} is not supported (walfold evaluates expressions itself, without a session)"
                )),
                w if matches!(self.peek(), Some(Tok::Str(_))) && !RESERVED.contains(&w) => Err(
                    format!("typed constants ({w} '…') are not supported: write '…'::{w}"),
                ),
                w if RESERVED.contains(&w) => {
                    self.pos -= 1;
                    Err(self.syntax_error())
                }
                _ => self.name_use(w, false),
            },
            _ => {
                self.pos -= 1;
                Err(self.syntax_error())
            }
        }
    }

    /// A name: a column, or a function when `(` follows.
    fn name_use(&mut self, name: String, quoted: bool) -> Result<Node, String> {
        let mut schema = None;
        let mut name = name;
        if self.peek() == Some(&Tok::Dot) {
            self.pos += 1;
            let second = match self.next() {
                Some(Tok::Ident(w)) | Some(Tok::Quoted(w)) => w,
                _ => {
                    self.pos -= 1;
                    return Err(self.syntax_error());
                }
            };
            if self.peek() != Some(&Tok::LParen) {
                return Err(format!(
                    "qualified column names ({name}.{second}) are not supported: write the column name alone"
                ));
            }
            schema = Some(name);
            name = second;
        }
        if self.peek() != Some(&Tok::LParen) {
            return Ok(Node::Column(name));
        }
        self.pos += 1;
        self.call(schema.as_deref(), &name, quoted)
    }

    /// After `name(`.
    fn call(&mut self, schema: Option<&str>, name: &str, quoted: bool) -> Result<Node, String> {
        let builtin = matches!(schema, None | Some("pg_catalog"));
        let full = match schema {
            Some(s) => format!("{s}.{name}"),
            None => name.to_owned(),
        };
        let node = match (builtin, quoted, name) {
            (true, false, "substring") => self.substring()?,
            (true, false, "position") => {
                let needle = self.other()?;
                self.expect_kw("in")?;
                let hay = self.other()?;
                self.expect(&Tok::RParen, ")")?;
                Node::Call(Func::Strpos, vec![hay, needle])
            }
            (true, false, "trim") => self.trim()?,
            (true, false, "coalesce") => Node::Coalesce(self.args("coalesce", 1, usize::MAX)?),
            (true, false, "nullif") => {
                let mut a = self.args("nullif", 2, 2)?;
                let b = a.pop().expect("two");
                Node::NullIf(Box::new(a.pop().expect("two")), Box::new(b))
            }
            _ => {
                let func = Func::lookup(schema, name).ok_or_else(|| unsupported_function(&full))?;
                let (min, max) = func.arity();
                Node::Call(func, self.args(&full, min, max)?)
            }
        };
        if self.is_kw("over") || self.is_kw("filter") || self.is_kw("within") {
            return Err(format!(
                "{full}(…) {} is not supported",
                match self.peek() {
                    Some(Tok::Ident(w)) => w.to_uppercase(),
                    _ => String::new(),
                }
            ));
        }
        Ok(node)
    }

    /// Comma-separated arguments up to `)`.
    fn args(&mut self, name: &str, min: usize, max: usize) -> Result<Vec<Node>, String> {
        let mut args = Vec::new();
        if self.peek() == Some(&Tok::RParen) {
            self.pos += 1;
        } else {
            if self.is_kw("distinct") || self.is_kw("all") || self.is_op("*") {
                return Err(format!("{name}(…): aggregate calls are not supported"));
            }
            loop {
                args.push(self.expr()?);
                match self.next() {
                    Some(Tok::Comma) => continue,
                    Some(Tok::RParen) => break,
                    _ => {
                        self.pos -= 1;
                        return Err(self.syntax_error());
                    }
                }
            }
        }
        if args.len() < min || args.len() > max {
            let want = if min == max {
                format!("{min}")
            } else if max == usize::MAX {
                format!("at least {min}")
            } else {
                format!("{min} to {max}")
            };
            return Err(format!(
                "function {name} takes {want} arguments, not {}",
                args.len()
            ));
        }
        Ok(args)
    }

    /// `substring(x from n for m)`, `substring(x from n)`, `substring(x for m)`,
    /// `substring(x, n[, m])`.
    fn substring(&mut self) -> Result<Node, String> {
        let s = self.expr()?;
        let (from, count) = if self.eat_kw("from") {
            let from = self.expr()?;
            let count = if self.eat_kw("for") {
                Some(self.expr()?)
            } else {
                None
            };
            (from, count)
        } else if self.eat_kw("for") {
            let count = self.expr()?;
            let from = if self.eat_kw("from") {
                self.expr()?
            } else {
                Node::Number("1".into())
            };
            (from, Some(count))
        } else if self.peek() == Some(&Tok::Comma) {
            self.pos += 1;
            let from = self.expr()?;
            let count = if self.peek() == Some(&Tok::Comma) {
                self.pos += 1;
                Some(self.expr()?)
            } else {
                None
            };
            (from, count)
        } else {
            return Err("function substring needs a start position (substring(x from n [for m]) or substring(x, n[, m]))".into());
        };
        self.expect(&Tok::RParen, ")")?;
        if matches!(from, Node::Lit(Some(_))) {
            return Err(
                "substring with a regular expression (substring(x from 'pattern')) is not supported"
                    .into(),
            );
        }
        let mut args = vec![s, from];
        args.extend(count);
        Ok(Node::Call(Func::Substring, args))
    }

    /// `trim([both|leading|trailing] [chars] from x)`, `trim(x[, chars])`.
    fn trim(&mut self) -> Result<Node, String> {
        let func = if self.eat_kw("leading") {
            Func::Ltrim
        } else if self.eat_kw("trailing") {
            Func::Rtrim
        } else {
            self.eat_kw("both");
            Func::Btrim
        };
        let args = if self.eat_kw("from") {
            self.args("trim", 1, 1)?
        } else {
            let first = self.expr()?;
            if self.eat_kw("from") {
                let mut a = self.args("trim", 1, 1)?;
                a.push(first);
                a
            } else {
                let mut a = vec![first];
                if self.peek() == Some(&Tok::Comma) {
                    self.pos += 1;
                    a.push(self.expr()?);
                }
                self.expect(&Tok::RParen, ")")?;
                a
            }
        };
        Ok(Node::Call(func, args))
    }

    fn case(&mut self) -> Result<Node, String> {
        let operand = if self.is_kw("when") {
            None
        } else {
            Some(Box::new(self.expr()?))
        };
        let mut whens = Vec::new();
        while self.eat_kw("when") {
            let w = self.expr()?;
            self.expect_kw("then")?;
            let t = self.expr()?;
            whens.push((w, t));
        }
        if whens.is_empty() {
            return Err(format!("{} (CASE needs a WHEN)", self.syntax_error()));
        }
        let otherwise = if self.eat_kw("else") {
            Some(Box::new(self.expr()?))
        } else {
            None
        };
        self.expect_kw("end")?;
        Ok(Node::Case {
            operand,
            whens,
            otherwise,
        })
    }

    /// A type name after `::` or `AS`.
    fn type_name(&mut self) -> Result<Target, String> {
        let mut word = match self.next() {
            Some(Tok::Ident(w)) | Some(Tok::Quoted(w)) => w,
            _ => {
                self.pos -= 1;
                return Err(format!("{} (expected a type name)", self.syntax_error()));
            }
        };
        if self.peek() == Some(&Tok::Dot) {
            self.pos += 1;
            let second = match self.next() {
                Some(Tok::Ident(w)) | Some(Tok::Quoted(w)) => w,
                _ => {
                    self.pos -= 1;
                    return Err(self.syntax_error());
                }
            };
            if word != "pg_catalog" {
                return Err(format!("type {word}.{second} is not supported in casts"));
            }
            word = second;
        }
        let ty = match word.as_str() {
            "text" => Ty::Text,
            "varchar" => Ty::Varchar,
            "character" | "char" if self.eat_kw("varying") => Ty::Varchar,
            "character" | "char" | "bpchar" => Ty::Bpchar,
            "json" => Ty::Json,
            "jsonb" => Ty::Jsonb,
            "uuid" => Ty::Uuid,
            "bytea" => Ty::Bytea,
            "bool" | "boolean" => Ty::Bool,
            "int2" | "smallint" => Ty::Int2,
            "int" | "int4" | "integer" => Ty::Int4,
            "int8" | "bigint" => Ty::Int8,
            "double" if self.is_kw("precision") => {
                return Err(unsupported_type("double precision"))
            }
            other => return Err(unsupported_type(other)),
        };
        let mut len = None;
        if self.peek() == Some(&Tok::LParen) {
            self.pos += 1;
            let n = match self.next() {
                Some(Tok::Number(n)) if matches!(ty, Ty::Varchar | Ty::Bpchar) => n
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=10_485_760).contains(n))
                    .ok_or_else(|| format!("length for type {} must be at least 1", ty.name()))?,
                _ => return Err(format!("type modifiers are not supported for type {word}")),
            };
            self.expect(&Tok::RParen, ")")?;
            len = Some(n);
        } else if ty == Ty::Bpchar && word != "bpchar" {
            len = Some(1);
        }
        if self.peek() == Some(&Tok::LBracket) || self.is_kw("array") {
            return Err("array types are not supported in casts".into());
        }
        Ok(Target { ty, len })
    }
}

fn unsupported_type(name: &str) -> String {
    format!(
        "type {name} is not supported in casts: supported are bigint (int8), boolean, bytea, \
         char(n), integer (int, int4), json, jsonb, smallint (int2), text, uuid, varchar(n)"
    )
}

fn unsupported_function(name: &str) -> String {
    format!(
        "function {name} is not supported (walfold evaluates expressions itself, without a \
         database round trip): supported are {}",
        Func::supported_list()
    )
}

//! Evaluation over a row. Types are resolved as the values arrive (a column's type
//! is only known then); a branch not taken (CASE, COALESCE) is still type-checked
//! through [`infer`], so a type error never depends on the data, as in PostgreSQL.

use std::cmp::Ordering;

use crate::ast::{CmpOp, Node};
use crate::cast::{self, coerce};
use crate::datum::{Datum, V};
use crate::json;
use crate::numeric;
use crate::text;
use crate::types::{self, Compare, Concat, Key, Ty};
use crate::Row;

pub(crate) fn eval(n: &Node, row: &dyn Row) -> Result<Datum, String> {
    match n {
        Node::Column(c) => Datum::from_input(column(row, c)?),
        Node::Lit(s) => Ok(Datum {
            ty: Ty::Unknown,
            v: s.clone().map(V::Str),
        }),
        Node::Number(s) => number(s),
        Node::Const(d) => Ok(d.clone()),
        Node::Cast(e, t) => cast::cast(eval(e, row)?, *t),
        Node::Neg(e) => negate(eval(e, row)?),
        Node::Plus(e) => {
            let d = eval(e, row)?;
            plus_type(d.ty)?;
            Ok(d)
        }
        Node::Concat(l, r) => concat(eval(l, row)?, eval(r, row)?),
        Node::Arrow { text, left, right } => arrow(*text, eval(left, row)?, eval(right, row)?),
        Node::Path { text, left, right } => path(*text, eval(left, row)?, eval(right, row)?),
        Node::Compare(op, l, r) => Ok(bool_datum(compare(*op, eval(l, row)?, eval(r, row)?)?)),
        Node::Like {
            expr,
            pattern,
            escape,
            negated,
            ilike,
        } => {
            let s = eval(expr, row)?;
            let p = eval(pattern, row)?;
            let e = escape.as_ref().map(|e| eval(e, row)).transpose()?;
            let m = like(s, p, e, *ilike)?;
            Ok(bool_datum(m.map(|m| m != *negated)))
        }
        Node::In {
            expr,
            list,
            negated,
        } => {
            let x = eval(expr, row)?;
            let mut any_null = false;
            let mut found = false;
            for item in list {
                match compare(CmpOp::Eq, x.clone(), eval(item, row)?)? {
                    Some(true) => found = true,
                    Some(false) => {}
                    None => any_null = true,
                }
            }
            let r = if found {
                Some(true)
            } else if any_null {
                None
            } else {
                Some(false)
            };
            Ok(bool_datum(r.map(|r| r != *negated)))
        }
        Node::IsNull(e, negated) => Ok(bool_datum(Some(eval(e, row)?.is_null() != *negated))),
        Node::IsBool {
            expr,
            what,
            negated,
        } => {
            let b = boolean(eval(expr, row)?, "IS TRUE")?;
            let r = b == *what;
            Ok(bool_datum(Some(r != *negated)))
        }
        Node::Not(e) => Ok(bool_datum(boolean(eval(e, row)?, "NOT")?.map(|b| !b))),
        Node::And(l, r) => {
            let a = boolean(eval(l, row)?, "AND")?;
            if a == Some(false) {
                types::boolean(infer(r, row)?, "AND")?;
                return Ok(bool_datum(Some(false)));
            }
            let b = boolean(eval(r, row)?, "AND")?;
            Ok(bool_datum(match (a, b) {
                (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            }))
        }
        Node::Or(l, r) => {
            let a = boolean(eval(l, row)?, "OR")?;
            if a == Some(true) {
                types::boolean(infer(r, row)?, "OR")?;
                return Ok(bool_datum(Some(true)));
            }
            let b = boolean(eval(r, row)?, "OR")?;
            Ok(bool_datum(match (a, b) {
                (_, Some(true)) => Some(true),
                (Some(false), Some(false)) => Some(false),
                _ => None,
            }))
        }
        Node::Case {
            operand,
            whens,
            otherwise,
        } => {
            let ty = case_type(operand.as_deref(), whens, otherwise.as_deref(), row)?;
            check_constants(whens.iter().map(|w| &w.1).chain(otherwise.as_deref()), ty)?;
            let subject = operand.as_ref().map(|o| eval(o, row)).transpose()?;
            for (w, then) in whens {
                let hit = match &subject {
                    Some(s) => compare(CmpOp::Eq, s.clone(), eval(w, row)?)?,
                    None => boolean(eval(w, row)?, "CASE/WHEN")?,
                };
                if hit == Some(true) {
                    return coerce(eval(then, row)?, ty);
                }
            }
            match otherwise {
                Some(o) => coerce(eval(o, row)?, ty),
                None => Ok(Datum::null(ty)),
            }
        }
        Node::Coalesce(args) => {
            let tys = args
                .iter()
                .map(|a| infer(a, row))
                .collect::<Result<Vec<_>, _>>()?;
            let ty = types::common("COALESCE", &tys)?;
            check_constants(args.iter(), ty)?;
            for a in args {
                let d = eval(a, row)?;
                if !d.is_null() {
                    return coerce(d, ty);
                }
            }
            Ok(Datum::null(ty))
        }
        Node::NullIf(a, b) => {
            let x = eval(a, row)?;
            let y = eval(b, row)?;
            let ty = if x.ty == Ty::Unknown { Ty::Text } else { x.ty };
            if compare(CmpOp::Eq, x.clone(), y)? == Some(true) {
                Ok(Datum::null(ty))
            } else {
                coerce(x, ty)
            }
        }
        Node::Call(f, args) => {
            let vals = args
                .iter()
                .map(|a| eval(a, row))
                .collect::<Result<Vec<_>, _>>()?;
            f.call(vals)
        }
    }
}

/// The type `n` has over a row with these column types, and every type error in it.
pub(crate) fn infer(n: &Node, row: &dyn Row) -> Result<Ty, String> {
    Ok(match n {
        Node::Column(c) => Ty::from_oid(column(row, c)?.type_oid),
        Node::Lit(_) => Ty::Unknown,
        Node::Number(s) => number(s)?.ty,
        Node::Const(d) => d.ty,
        Node::Cast(e, t) => {
            cast::check(infer(e, row)?, t)?;
            t.ty
        }
        Node::Neg(e) => {
            let t = infer(e, row)?;
            negate(Datum::null(t))?;
            t
        }
        Node::Plus(e) => {
            let t = infer(e, row)?;
            plus_type(t)?;
            t
        }
        Node::Concat(l, r) => match types::concat(infer(l, row)?, infer(r, row)?)? {
            Concat::Text => Ty::Text,
            Concat::Bytea => Ty::Bytea,
            Concat::Jsonb => Ty::Jsonb,
        },
        Node::Arrow { text, left, right } => {
            let l = infer(left, row)?;
            types::arrow(l, arrow_op(*text), infer(right, row)?)?;
            if *text {
                Ty::Text
            } else {
                l
            }
        }
        Node::Path { text, left, right } => {
            let l = infer(left, row)?;
            types::path(l, path_op(*text), infer(right, row)?)?;
            if *text {
                Ty::Text
            } else {
                l
            }
        }
        Node::Compare(op, l, r) => {
            types::compare(infer(l, row)?, op.symbol(), infer(r, row)?)?;
            Ty::Bool
        }
        Node::Like {
            expr,
            pattern,
            escape,
            ilike,
            negated,
        } => {
            types::like(
                infer(expr, row)?,
                like_op(*ilike, *negated),
                infer(pattern, row)?,
            )?;
            if let Some(e) = escape {
                escape_type(infer(e, row)?)?;
            }
            Ty::Bool
        }
        Node::In { expr, list, .. } => {
            let x = infer(expr, row)?;
            for item in list {
                types::compare(x, "=", infer(item, row)?)?;
            }
            Ty::Bool
        }
        Node::IsNull(e, _) => {
            infer(e, row)?;
            Ty::Bool
        }
        Node::IsBool { expr, .. } => {
            types::boolean(infer(expr, row)?, "IS TRUE")?;
            Ty::Bool
        }
        Node::Not(e) => {
            types::boolean(infer(e, row)?, "NOT")?;
            Ty::Bool
        }
        Node::And(l, r) | Node::Or(l, r) => {
            let what = if matches!(n, Node::And(..)) {
                "AND"
            } else {
                "OR"
            };
            types::boolean(infer(l, row)?, what)?;
            types::boolean(infer(r, row)?, what)?;
            Ty::Bool
        }
        Node::Case {
            operand,
            whens,
            otherwise,
        } => case_type(operand.as_deref(), whens, otherwise.as_deref(), row)?,
        Node::Coalesce(args) => {
            let tys = args
                .iter()
                .map(|a| infer(a, row))
                .collect::<Result<Vec<_>, _>>()?;
            types::common("COALESCE", &tys)?
        }
        Node::NullIf(a, b) => {
            let x = infer(a, row)?;
            types::compare(x, "=", infer(b, row)?)?;
            if x == Ty::Unknown {
                Ty::Text
            } else {
                x
            }
        }
        Node::Call(f, args) => {
            let tys = args
                .iter()
                .map(|a| infer(a, row))
                .collect::<Result<Vec<_>, _>>()?;
            f.resolve(&tys)?.1
        }
    })
}

fn column<'r>(row: &'r dyn Row, c: &str) -> Result<crate::Input<'r>, String> {
    row.column(c)
        .ok_or_else(|| format!("column \"{c}\" does not exist"))
}

fn case_type(
    operand: Option<&Node>,
    whens: &[(Node, Node)],
    otherwise: Option<&Node>,
    row: &dyn Row,
) -> Result<Ty, String> {
    let subject = operand.map(|o| infer(o, row)).transpose()?;
    let mut results = Vec::with_capacity(whens.len() + 1);
    for (w, then) in whens {
        let wt = infer(w, row)?;
        match subject {
            Some(s) => {
                types::compare(s, "=", wt)?;
            }
            None => types::boolean(wt, "CASE/WHEN")?,
        }
        results.push(infer(then, row)?);
    }
    if let Some(o) = otherwise {
        results.push(infer(o, row)?);
    }
    types::common("CASE", &results)
}

/// The string constants among `nodes` read as `ty`, as the server's parser reads
/// them whether or not their branch is taken.
fn check_constants<'a>(nodes: impl Iterator<Item = &'a Node>, ty: Ty) -> Result<(), String> {
    for n in nodes {
        if let Node::Lit(Some(s)) = n {
            cast::input(ty, s)?;
        }
    }
    Ok(())
}

fn bool_datum(b: Option<bool>) -> Datum {
    Datum {
        ty: Ty::Bool,
        v: b.map(V::Bool),
    }
}

/// A boolean operand: `boolean` or a constant read as one.
fn boolean(d: Datum, what: &str) -> Result<Option<bool>, String> {
    types::boolean(d.ty, what)?;
    match coerce(d, Ty::Bool)?.v {
        Some(V::Bool(b)) => Ok(Some(b)),
        _ => Ok(None),
    }
}

/// A numeric constant: integer if it fits 32 bits, else bigint if it fits 64,
/// else numeric (`-2147483648` is an integer, as in PostgreSQL 15).
pub(crate) fn number(s: &str) -> Result<Datum, String> {
    let magnitude = s.strip_prefix('-').unwrap_or(s);
    if magnitude.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(v) = s.parse::<i32>() {
            return Ok(Datum::new(Ty::Int4, V::Int(v.into())));
        }
        if let Ok(v) = s.parse::<i64>() {
            return Ok(Datum::new(Ty::Int8, V::Int(v)));
        }
    }
    Ok(Datum::new(Ty::Numeric, V::Str(numeric::normalize(s)?)))
}

fn plus_type(t: Ty) -> Result<(), String> {
    if t.is_int() || t == Ty::Numeric {
        Ok(())
    } else if t == Ty::Unknown {
        Err("operator is not unique: + unknown".into())
    } else {
        Err(format!("operator does not exist: + {}", t.name()))
    }
}

fn negate(d: Datum) -> Result<Datum, String> {
    let ty = d.ty;
    match ty {
        Ty::Unknown => return Err("operator is not unique: - unknown".into()),
        t if t.is_int() || t == Ty::Numeric => {}
        t => return Err(format!("operator does not exist: - {}", t.name())),
    }
    let v = match d.v {
        None => None,
        Some(V::Int(i)) => {
            let min = match ty {
                Ty::Int2 => i64::from(i16::MIN),
                Ty::Int4 => i64::from(i32::MIN),
                _ => i64::MIN,
            };
            if i == min {
                return Err(format!("{} out of range", ty.name()));
            }
            Some(V::Int(-i))
        }
        Some(V::Str(n)) => Some(V::Str(match n.strip_prefix('-') {
            Some(p) => p.to_owned(),
            None if numeric::compare(&n, "0").is_eq() || n == "NaN" => n,
            None => format!("-{n}"),
        })),
        Some(other) => Some(other),
    };
    Ok(Datum { ty, v })
}

fn concat(l: Datum, r: Datum) -> Result<Datum, String> {
    let kind = types::concat(l.ty, r.ty)?;
    let ty = match kind {
        Concat::Text => Ty::Text,
        Concat::Bytea => Ty::Bytea,
        Concat::Jsonb => Ty::Jsonb,
    };
    // A constant operand takes the operator's type whatever the other holds, so a
    // malformed one fails even next to a NULL, as at the server's parse.
    let (l, r) = if kind == Concat::Text {
        (l, r)
    } else {
        (coerce(l, ty)?, coerce(r, ty)?)
    };
    if l.is_null() || r.is_null() {
        return Ok(Datum::null(ty));
    }
    Ok(match kind {
        Concat::Text => {
            let part = |d: Datum| -> String {
                if d.ty.is_string() || d.ty == Ty::Unknown {
                    d.into_string().unwrap_or_default()
                } else {
                    // `anytextcat` is `$1::text || $2`: the cast, not the output
                    // function (`'x' || true` is `xtrue`).
                    let text = cast::Target {
                        ty: Ty::Text,
                        len: None,
                    };
                    match cast::cast(d, text).map(|d| d.v) {
                        Ok(Some(V::Str(s))) => s,
                        _ => String::new(),
                    }
                }
            };
            let mut s = part(l);
            s.push_str(&part(r));
            Datum::text(s)
        }
        Concat::Bytea => match (coerce(l, ty)?.v, coerce(r, ty)?.v) {
            (Some(V::Bytes(mut a)), Some(V::Bytes(b))) => {
                a.extend_from_slice(&b);
                Datum::new(ty, V::Bytes(a))
            }
            _ => unreachable!("bytea operands"),
        },
        Concat::Jsonb => match (coerce(l, ty)?.v, coerce(r, ty)?.v) {
            (Some(V::Json(a)), Some(V::Json(b))) => Datum::new(ty, V::Json(json::concat(a, b))),
            _ => unreachable!("jsonb operands"),
        },
    })
}

fn arrow_op(text: bool) -> &'static str {
    if text {
        "->>"
    } else {
        "->"
    }
}

fn path_op(text: bool) -> &'static str {
    if text {
        "#>>"
    } else {
        "#>"
    }
}

fn like_op(ilike: bool, negated: bool) -> &'static str {
    match (ilike, negated) {
        (false, false) => "~~",
        (false, true) => "!~~",
        (true, false) => "~~*",
        (true, true) => "!~~*",
    }
}

/// The result of `->`/`#>` (`text: false`) or `->>`/`#>>`.
fn json_result(ty: Ty, text: bool, found: Option<serde_json::Value>) -> Datum {
    if text {
        Datum {
            ty: Ty::Text,
            v: found.as_ref().and_then(json::to_text_value).map(V::Str),
        }
    } else {
        Datum {
            ty,
            v: found.map(V::Json),
        }
    }
}

fn arrow(text: bool, l: Datum, r: Datum) -> Result<Datum, String> {
    let key = types::arrow(l.ty, arrow_op(text), r.ty)?;
    let ty = l.ty;
    let (Some(V::Json(j)), false) = (l.v, r.is_null()) else {
        return Ok(json_result(ty, text, None));
    };
    let found = match key {
        Key::Field => json::field(j, &coerce(r, Ty::Text)?.into_string().unwrap_or_default()),
        Key::Index => match r.v {
            Some(V::Int(i)) => json::index(j, i),
            _ => None,
        },
    };
    Ok(json_result(ty, text, found))
}

fn path(text: bool, l: Datum, r: Datum) -> Result<Datum, String> {
    types::path(l.ty, path_op(text), r.ty)?;
    let ty = l.ty;
    let steps = match &r.v {
        Some(V::Str(p)) => Some(json::text_array(p)?),
        _ => None,
    };
    let (Some(V::Json(j)), Some(steps)) = (l.v, steps) else {
        return Ok(json_result(ty, text, None));
    };
    Ok(json_result(ty, text, json::path(j, &steps)))
}

/// `l op r`, NULL when either is.
fn compare(op: CmpOp, l: Datum, r: Datum) -> Result<Option<bool>, String> {
    let (target, how) = types::compare(l.ty, op.symbol(), r.ty)?;
    let (Some(a), Some(b)) = (coerce(l, target)?.v, coerce(r, target)?.v) else {
        return Ok(None);
    };
    let ord = match (how, a, b) {
        (Compare::Text, V::Str(a), V::Str(b)) => {
            let trim = |s: &str| -> String {
                if target == Ty::Bpchar {
                    s.trim_end_matches(' ').to_owned()
                } else {
                    s.to_owned()
                }
            };
            trim(&a).as_bytes().cmp(trim(&b).as_bytes())
        }
        (Compare::Int, V::Int(a), V::Int(b)) => a.cmp(&b),
        (Compare::Numeric, V::Str(a), V::Str(b)) => numeric::compare(&a, &b),
        (Compare::Bool, V::Bool(a), V::Bool(b)) => a.cmp(&b),
        (Compare::Uuid, V::Uuid(a), V::Uuid(b)) => a.as_bytes().cmp(b.as_bytes()),
        (Compare::Bytea, V::Bytes(a), V::Bytes(b)) => a.cmp(&b),
        (Compare::Jsonb, V::Json(a), V::Json(b)) => {
            if json::equal(&a, &b) {
                Ordering::Equal
            } else {
                Ordering::Less
            }
        }
        (how, a, b) => unreachable!("{how:?} of {a:?} and {b:?}"),
    };
    Ok(Some(match op {
        CmpOp::Eq => ord == Ordering::Equal,
        CmpOp::Ne => ord != Ordering::Equal,
        CmpOp::Lt => ord == Ordering::Less,
        CmpOp::Le => ord != Ordering::Greater,
        CmpOp::Gt => ord == Ordering::Greater,
        CmpOp::Ge => ord != Ordering::Less,
    }))
}

fn escape_type(t: Ty) -> Result<(), String> {
    if t == Ty::Unknown || t.is_string() {
        Ok(())
    } else {
        Err(format!(
            "function like_escape(unknown, {}) does not exist",
            t.name()
        ))
    }
}

fn like(s: Datum, p: Datum, escape: Option<Datum>, ilike: bool) -> Result<Option<bool>, String> {
    let bytea = types::like(s.ty, like_op(ilike, false), p.ty)?;
    let esc = match escape {
        None => Some("\\".to_owned()),
        Some(e) => {
            escape_type(e.ty)?;
            match e.into_string() {
                None => return Ok(None),
                Some(e) => Some(e),
            }
        }
    };
    let (s, p) = if bytea {
        (coerce(s, Ty::Bytea)?, coerce(p, Ty::Bytea)?)
    } else {
        (s, p)
    };
    if s.is_null() || p.is_null() {
        return Ok(None);
    }
    let esc = esc.expect("set");
    if esc.chars().count() > 1 {
        return Err("invalid escape string (it must be empty or one character)".into());
    }
    if bytea {
        let (Some(V::Bytes(a)), Some(V::Bytes(b))) =
            (coerce(s, Ty::Bytea)?.v, coerce(p, Ty::Bytea)?.v)
        else {
            unreachable!("bytea operands")
        };
        let e = esc.bytes().next();
        return text::like(&a, &b, b'%', b'_', e).map(Some);
    }
    let fold = |d: Datum| -> Vec<char> {
        let s = d.into_string().unwrap_or_default();
        let s = if ilike {
            text::change_case(&s, false)
        } else {
            s
        };
        s.chars().collect()
    };
    let (a, b) = (fold(s), fold(p));
    text::like(&a, &b, '%', '_', esc.chars().next()).map(Some)
}

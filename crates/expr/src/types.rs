//! Types and PostgreSQL's resolution of the subset's operators over them: which
//! implicit coercions apply, which operator a pair of types selects, and the error
//! (worded as the server words it) when none does.

use walfold_pgoutput::oid;

/// The type of a value while evaluating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    /// A string constant not yet given a type (PostgreSQL's `unknown`): it takes the
    /// type its context asks for, through that type's input function.
    Unknown,
    Text,
    Varchar,
    Bpchar,
    Name,
    Json,
    Jsonb,
    Bytea,
    Uuid,
    Int2,
    Int4,
    Int8,
    Bool,
    /// Kept as its text.
    Numeric,
    TextArray,
    /// Any other type, as its text.
    Other(u32),
}

impl Ty {
    pub(crate) fn from_oid(type_oid: u32) -> Ty {
        match type_oid {
            oid::TEXT => Ty::Text,
            oid::VARCHAR => Ty::Varchar,
            oid::BPCHAR => Ty::Bpchar,
            oid::NAME => Ty::Name,
            oid::JSON => Ty::Json,
            oid::JSONB => Ty::Jsonb,
            oid::BYTEA => Ty::Bytea,
            oid::UUID => Ty::Uuid,
            oid::INT2 => Ty::Int2,
            oid::INT4 => Ty::Int4,
            oid::INT8 => Ty::Int8,
            oid::BOOL => Ty::Bool,
            oid::NUMERIC => Ty::Numeric,
            oid::TEXT_ARRAY => Ty::TextArray,
            other => Ty::Other(other),
        }
    }

    pub(crate) fn oid(self) -> u32 {
        match self {
            Ty::Unknown | Ty::Text => oid::TEXT,
            Ty::Varchar => oid::VARCHAR,
            Ty::Bpchar => oid::BPCHAR,
            Ty::Name => oid::NAME,
            Ty::Json => oid::JSON,
            Ty::Jsonb => oid::JSONB,
            Ty::Bytea => oid::BYTEA,
            Ty::Uuid => oid::UUID,
            Ty::Int2 => oid::INT2,
            Ty::Int4 => oid::INT4,
            Ty::Int8 => oid::INT8,
            Ty::Bool => oid::BOOL,
            Ty::Numeric => oid::NUMERIC,
            Ty::TextArray => oid::TEXT_ARRAY,
            Ty::Other(o) => o,
        }
    }

    /// The name PostgreSQL's messages use.
    pub(crate) fn name(self) -> String {
        match self {
            Ty::Unknown => "unknown",
            Ty::Text => "text",
            Ty::Varchar => "character varying",
            Ty::Bpchar => "character",
            Ty::Name => "name",
            Ty::Json => "json",
            Ty::Jsonb => "jsonb",
            Ty::Bytea => "bytea",
            Ty::Uuid => "uuid",
            Ty::Int2 => "smallint",
            Ty::Int4 => "integer",
            Ty::Int8 => "bigint",
            Ty::Bool => "boolean",
            Ty::Numeric => "numeric",
            Ty::TextArray => "text[]",
            Ty::Other(o) => return other_name(o),
        }
        .to_owned()
    }

    /// text, varchar, bpchar, name: PostgreSQL's string category.
    pub(crate) fn is_string(self) -> bool {
        matches!(self, Ty::Text | Ty::Varchar | Ty::Bpchar | Ty::Name)
    }

    pub(crate) fn is_int(self) -> bool {
        matches!(self, Ty::Int2 | Ty::Int4 | Ty::Int8)
    }

    fn is_json(self) -> bool {
        matches!(self, Ty::Json | Ty::Jsonb)
    }

    /// An array type (`anynonarray` does not take it).
    fn is_array(self) -> bool {
        match self {
            Ty::TextArray => true,
            // The array types of the common element types.
            Ty::Other(o) => oid::OTHER_ARRAYS.contains(&o),
            _ => false,
        }
    }
}

fn other_name(o: u32) -> String {
    match o {
        oid::OID => "oid",
        oid::FLOAT4 => "real",
        oid::FLOAT8 => "double precision",
        oid::DATE => "date",
        oid::TIME => "time without time zone",
        oid::TIMESTAMP => "timestamp without time zone",
        oid::TIMESTAMPTZ => "timestamp with time zone",
        oid::INTERVAL => "interval",
        _ => return format!("type with OID {o}"),
    }
    .to_owned()
}

fn no_operator(l: Ty, op: &str, r: Ty) -> String {
    format!("operator does not exist: {} {op} {}", l.name(), r.name())
}

/// Whether a value of `from` goes where `to` is expected without an explicit cast.
pub(crate) fn implicit(from: Ty, to: Ty) -> bool {
    from == to
        || from == Ty::Unknown
        || (from.is_string() && to.is_string())
        || matches!(
            (from, to),
            (Ty::Int2, Ty::Int4 | Ty::Int8 | Ty::Numeric)
                | (Ty::Int4, Ty::Int8 | Ty::Numeric)
                | (Ty::Int8, Ty::Numeric)
        )
}

/// What `a || b` resolves to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Concat {
    /// `text || text`, `text || anynonarray`, `anynonarray || text`.
    Text,
    Bytea,
    Jsonb,
}

pub(crate) fn concat(l: Ty, r: Ty) -> Result<Concat, String> {
    let stringish = |t: Ty| t == Ty::Unknown || t.is_string();
    if l.is_array() || r.is_array() {
        return Err(format!(
            "operator || on arrays ({} || {}) is not supported",
            l.name(),
            r.name()
        ));
    }
    Ok(match (l, r) {
        (l, r) if stringish(l) && stringish(r) => Concat::Text,
        (Ty::Bytea, Ty::Bytea | Ty::Unknown) | (Ty::Unknown, Ty::Bytea) => Concat::Bytea,
        (Ty::Jsonb, Ty::Jsonb | Ty::Unknown) | (Ty::Unknown, Ty::Jsonb) => Concat::Jsonb,
        (l, r) if stringish(l) || stringish(r) => Concat::Text,
        _ => return Err(no_operator(l, "||", r)),
    })
}

/// What the right operand of `->`/`->>` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Key {
    Field,
    Index,
}

pub(crate) fn arrow(l: Ty, op: &str, r: Ty) -> Result<Key, String> {
    let key = match r {
        Ty::Unknown => Some(Key::Field),
        t if t.is_string() => Some(Key::Field),
        Ty::Int2 | Ty::Int4 => Some(Key::Index),
        _ => None,
    };
    match (l, key) {
        (l, Some(k)) if l.is_json() => Ok(k),
        (Ty::Unknown, Some(_)) => Err(format!("operator is not unique: unknown {op} {}", r.name())),
        _ => Err(no_operator(l, op, r)),
    }
}

pub(crate) fn path(l: Ty, op: &str, r: Ty) -> Result<(), String> {
    let path_ok = matches!(r, Ty::Unknown | Ty::TextArray);
    match l {
        l if l.is_json() && path_ok => Ok(()),
        Ty::Unknown if path_ok => Err(format!("operator is not unique: unknown {op} {}", r.name())),
        _ => Err(no_operator(l, op, r)),
    }
}

/// How two values compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compare {
    /// As text, byte by byte (the "C" collation); `character` values without their
    /// trailing blanks.
    Text,
    Int,
    Numeric,
    Bool,
    Uuid,
    Bytea,
    /// `=` and `<>` only.
    Jsonb,
}

/// The type both sides are read as, and how they compare.
pub(crate) fn compare(l: Ty, op: &str, r: Ty) -> Result<(Ty, Compare), String> {
    let target = match (l, r) {
        (Ty::Unknown, Ty::Unknown) => Ty::Text,
        (Ty::Unknown, t) | (t, Ty::Unknown) => t,
        (l, r) if l.is_string() && r.is_string() => {
            if l == r {
                l
            } else {
                Ty::Text
            }
        }
        (l, r) if l.is_int() && r.is_int() => Ty::Int8,
        (l, r) if (l.is_int() || l == Ty::Numeric) && (r.is_int() || r == Ty::Numeric) => {
            Ty::Numeric
        }
        (l, r) if l == r => l,
        _ => return Err(no_operator(l, op, r)),
    };
    let how = match target {
        t if t.is_string() => Compare::Text,
        t if t.is_int() => Compare::Int,
        Ty::Numeric => Compare::Numeric,
        Ty::Bool => Compare::Bool,
        Ty::Uuid => Compare::Uuid,
        Ty::Bytea => Compare::Bytea,
        Ty::Jsonb if op == "=" || op == "<>" => Compare::Jsonb,
        Ty::Jsonb => {
            return Err(format!(
                "operator {op} on jsonb values is not supported (only = and <>)"
            ))
        }
        Ty::Json => return Err(no_operator(l, op, r)),
        t => {
            return Err(format!(
                "comparing values of type {} is not supported",
                t.name()
            ))
        }
    };
    Ok((target, how))
}

/// `a LIKE b`: `true` for `bytea LIKE bytea`, `false` for text.
pub(crate) fn like(l: Ty, op: &str, r: Ty) -> Result<bool, String> {
    let stringish = |t: Ty| t == Ty::Unknown || t.is_string();
    match (l, r) {
        (l, r) if stringish(l) && stringish(r) => Ok(false),
        (Ty::Bytea, Ty::Bytea | Ty::Unknown) => Ok(true),
        _ => Err(no_operator(l, op, r)),
    }
}

/// The argument of AND, OR, NOT, WHEN: boolean or a constant read as one.
pub(crate) fn boolean(t: Ty, what: &str) -> Result<(), String> {
    match t {
        Ty::Bool | Ty::Unknown => Ok(()),
        t => Err(format!(
            "argument of {what} must be type boolean, not type {}",
            t.name()
        )),
    }
}

/// The type CASE, COALESCE, NULLIF results take (PostgreSQL's `select_common_type`).
pub(crate) fn common(ctx: &str, tys: &[Ty]) -> Result<Ty, String> {
    let mut known = tys.iter().copied().filter(|t| *t != Ty::Unknown);
    let Some(mut out) = known.next() else {
        return Ok(Ty::Text);
    };
    for t in known {
        if t == out {
            continue;
        }
        if t.is_string() && out.is_string() {
            out = Ty::Text;
        } else if (t.is_int() || t == Ty::Numeric) && (out.is_int() || out == Ty::Numeric) {
            if implicit(out, t) {
                out = t;
            }
        } else {
            return Err(format!(
                "{ctx} types {} and {} cannot be matched",
                out.name(),
                t.name()
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concatenation_picks_postgres_operator() {
        assert_eq!(concat(Ty::Unknown, Ty::Int4), Ok(Concat::Text));
        assert_eq!(concat(Ty::Bytea, Ty::Unknown), Ok(Concat::Bytea));
        assert_eq!(concat(Ty::Jsonb, Ty::Unknown), Ok(Concat::Jsonb));
        assert_eq!(concat(Ty::Jsonb, Ty::Text), Ok(Concat::Text));
        assert_eq!(
            concat(Ty::Int4, Ty::Int4),
            Err("operator does not exist: integer || integer".into())
        );
    }

    #[test]
    fn arrow_needs_json_on_the_left() {
        assert_eq!(
            arrow(Ty::Text, "->", Ty::Unknown),
            Err("operator does not exist: text -> unknown".into())
        );
        assert_eq!(arrow(Ty::Jsonb, "->", Ty::Int4), Ok(Key::Index));
        assert!(arrow(Ty::Jsonb, "->", Ty::Int8).is_err());
        assert!(arrow(Ty::Unknown, "->", Ty::Unknown)
            .unwrap_err()
            .contains("not unique"));
    }

    #[test]
    fn common_type_widens_within_a_category() {
        assert_eq!(common("CASE", &[Ty::Unknown, Ty::Unknown]), Ok(Ty::Text));
        assert_eq!(common("CASE", &[Ty::Int4, Ty::Int8]), Ok(Ty::Int8));
        assert_eq!(common("CASE", &[Ty::Unknown, Ty::Uuid]), Ok(Ty::Uuid));
        assert!(common("COALESCE", &[Ty::Text, Ty::Int4]).is_err());
    }
}

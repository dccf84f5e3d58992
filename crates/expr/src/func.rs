//! The functions the subset supports: their signatures (resolved against the
//! arguments' types as PostgreSQL resolves them) and their bodies.

use crate::bytes;
use crate::cast::coerce;
use crate::datum::{Datum, V};
use crate::text;
use crate::types::{implicit, Ty};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Func {
    SplitPart,
    Substring,
    /// `strpos(string, substring)`; `position(substring in string)` too.
    Strpos,
    Lower,
    Upper,
    Btrim,
    Ltrim,
    Rtrim,
    Replace,
    ConvertFrom,
    Decode,
    Encode,
    Length,
    Concat,
    ConcatWs,
    /// Message DB's `message_store.category(stream_name varchar)`.
    Category,
    /// Message DB's `message_store.id(stream_name varchar)`.
    Id,
}

/// The names [`Func::lookup`] knows, for the refusal message (plus the special forms).
const NAMES: &[&str] = &[
    "btrim",
    "coalesce",
    "concat",
    "concat_ws",
    "convert_from",
    "decode",
    "encode",
    "length",
    "lower",
    "ltrim",
    "message_store.category",
    "message_store.id",
    "nullif",
    "position",
    "replace",
    "rtrim",
    "split_part",
    "strpos",
    "substr",
    "substring",
    "trim",
    "upper",
];

impl Func {
    pub(crate) fn lookup(schema: Option<&str>, name: &str) -> Option<Func> {
        Some(match (schema, name) {
            (Some("message_store"), "category") => Func::Category,
            (Some("message_store"), "id") => Func::Id,
            (None | Some("pg_catalog"), name) => match name {
                "split_part" => Func::SplitPart,
                "substr" => Func::Substring,
                "strpos" => Func::Strpos,
                "lower" => Func::Lower,
                "upper" => Func::Upper,
                "btrim" => Func::Btrim,
                "ltrim" => Func::Ltrim,
                "rtrim" => Func::Rtrim,
                "replace" => Func::Replace,
                "convert_from" => Func::ConvertFrom,
                "decode" => Func::Decode,
                "encode" => Func::Encode,
                "length" | "char_length" | "character_length" => Func::Length,
                "concat" => Func::Concat,
                "concat_ws" => Func::ConcatWs,
                _ => return None,
            },
            _ => return None,
        })
    }

    pub(crate) fn supported_list() -> String {
        NAMES.join(", ")
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Func::SplitPart => "split_part",
            Func::Substring => "substring",
            Func::Strpos => "strpos",
            Func::Lower => "lower",
            Func::Upper => "upper",
            Func::Btrim => "btrim",
            Func::Ltrim => "ltrim",
            Func::Rtrim => "rtrim",
            Func::Replace => "replace",
            Func::ConvertFrom => "convert_from",
            Func::Decode => "decode",
            Func::Encode => "encode",
            Func::Length => "length",
            Func::Concat => "concat",
            Func::ConcatWs => "concat_ws",
            Func::Category => "message_store.category",
            Func::Id => "message_store.id",
        }
    }

    /// Fewest and most arguments.
    pub(crate) fn arity(self) -> (usize, usize) {
        match self {
            Func::SplitPart | Func::Replace => (3, 3),
            Func::Substring => (2, 3),
            Func::Strpos | Func::ConvertFrom | Func::Decode | Func::Encode => (2, 2),
            Func::Lower | Func::Upper | Func::Length | Func::Category | Func::Id => (1, 1),
            Func::Btrim | Func::Ltrim | Func::Rtrim => (1, 2),
            Func::Concat => (1, usize::MAX),
            Func::ConcatWs => (2, usize::MAX),
        }
    }

    /// The candidate signatures, in PostgreSQL's order of preference for `unknown`
    /// arguments (text before bytea).
    fn signatures(self) -> &'static [(&'static [Ty], Ty)] {
        use Ty::*;
        match self {
            Func::SplitPart => &[(&[Text, Text, Int4], Text)],
            Func::Substring => &[
                (&[Text, Int4], Text),
                (&[Text, Int4, Int4], Text),
                (&[Bytea, Int4], Bytea),
                (&[Bytea, Int4, Int4], Bytea),
            ],
            Func::Strpos => &[(&[Text, Text], Int4), (&[Bytea, Bytea], Int4)],
            Func::Lower | Func::Upper => &[(&[Text], Text)],
            Func::Btrim | Func::Ltrim | Func::Rtrim => &[(&[Text], Text), (&[Text, Text], Text)],
            Func::Replace => &[(&[Text, Text, Text], Text)],
            Func::ConvertFrom => &[(&[Bytea, Name], Text)],
            Func::Decode => &[(&[Text, Text], Bytea)],
            Func::Encode => &[(&[Bytea, Text], Text)],
            Func::Length => &[(&[Text], Int4), (&[Bytea], Int4)],
            Func::Category | Func::Id => &[(&[Varchar], Varchar)],
            // Variadic "any": resolved apart.
            Func::Concat | Func::ConcatWs => &[],
        }
    }

    /// The parameter types the arguments are coerced to, and the result type.
    pub(crate) fn resolve(self, args: &[Ty]) -> Result<(Vec<Ty>, Ty), String> {
        match self {
            Func::Concat => return Ok((args.to_vec(), Ty::Text)),
            Func::ConcatWs => {
                let mut params = args.to_vec();
                if !implicit(args[0], Ty::Text) {
                    return Err(self.not_found(args));
                }
                params[0] = Ty::Text;
                return Ok((params, Ty::Text));
            }
            _ => {}
        }
        for (params, result) in self.signatures() {
            if params.len() == args.len() && args.iter().zip(*params).all(|(a, p)| implicit(*a, *p))
            {
                return Ok((params.to_vec(), *result));
            }
        }
        if self == Func::Substring && args.get(1).is_some_and(|t| t.is_string()) {
            return Err(
                "substring with a regular expression (substring(x from 'pattern')) is not supported"
                    .into(),
            );
        }
        Err(self.not_found(args))
    }

    fn not_found(self, args: &[Ty]) -> String {
        let names: Vec<String> = args.iter().map(|t| t.name()).collect();
        format!(
            "function {}({}) does not exist",
            self.name(),
            names.join(", ")
        )
    }

    /// Calls it on arguments already evaluated (in order).
    pub(crate) fn call(self, args: Vec<Datum>) -> Result<Datum, String> {
        let tys: Vec<Ty> = args.iter().map(|d| d.ty).collect();
        let (params, result) = self.resolve(&tys)?;
        match self {
            Func::Concat => return Ok(Datum::text(concat(&args, ""))),
            Func::ConcatWs => {
                let mut it = args.into_iter();
                let sep = it.next().expect("arity");
                let Some(sep) = coerce(sep, Ty::Text)?.into_string() else {
                    return Ok(Datum::null(Ty::Text));
                };
                let rest: Vec<Datum> = it.collect();
                return Ok(Datum::text(concat(&rest, &sep)));
            }
            _ => {}
        }
        // The rest are strict: a NULL argument gives NULL without calling.
        // Every argument is coerced first: a malformed constant fails even next to a
        // NULL, as at the server's parse.
        let mut vals = Vec::with_capacity(args.len());
        for (d, p) in args.into_iter().zip(&params) {
            vals.push(coerce(d, *p)?.v);
        }
        let Some(vals) = vals.into_iter().collect::<Option<Vec<V>>>() else {
            return Ok(Datum::null(result));
        };
        let v = body(self, vals)?;
        Ok(match v {
            Some(v) => Datum::new(result, v),
            None => Datum::null(result),
        })
    }
}

fn concat(args: &[Datum], sep: &str) -> String {
    let parts: Vec<String> = args
        .iter()
        .filter_map(|d| d.out().map(|c| c.into_owned()))
        .collect();
    parts.join(sep)
}

fn str_of(v: V) -> String {
    match v {
        V::Str(s) => s,
        other => unreachable!("a text parameter holds {other:?}"),
    }
}

fn int_of(v: V) -> i64 {
    match v {
        V::Int(i) => i,
        other => unreachable!("an integer parameter holds {other:?}"),
    }
}

fn body(f: Func, vals: Vec<V>) -> Result<Option<V>, String> {
    let mut it = vals.into_iter();
    let mut next = || it.next().expect("arity checked");
    Ok(Some(match f {
        Func::SplitPart => {
            let (s, sep, n) = (str_of(next()), str_of(next()), int_of(next()));
            V::Str(text::split_part(&s, &sep, n)?)
        }
        Func::Substring => {
            let s = next();
            let start = int_of(next());
            let count = it.next().map(int_of);
            match s {
                V::Bytes(b) => V::Bytes(match text::substring_range(b.len(), start, count)? {
                    None => Vec::new(),
                    Some((a, e)) => b[a..e].to_vec(),
                }),
                s => V::Str(text::substring(&str_of(s), start, count)?),
            }
        }
        Func::Strpos => match (next(), next()) {
            (V::Bytes(h), V::Bytes(n)) => V::Int(text::bytes_pos(&h, &n)),
            (h, n) => V::Int(text::strpos(&str_of(h), &str_of(n))),
        },
        Func::Lower => V::Str(text::change_case(&str_of(next()), false)),
        Func::Upper => V::Str(text::change_case(&str_of(next()), true)),
        Func::Btrim | Func::Ltrim | Func::Rtrim => {
            let s = str_of(next());
            let chars = it.next().map_or_else(|| " ".to_owned(), str_of);
            V::Str(text::trim(&s, &chars, f != Func::Rtrim, f != Func::Ltrim))
        }
        Func::Replace => {
            let (s, from, to) = (str_of(next()), str_of(next()), str_of(next()));
            V::Str(text::replace(&s, &from, &to))
        }
        Func::ConvertFrom => match (next(), next()) {
            (V::Bytes(b), enc) => V::Str(bytes::convert_from(b, &str_of(enc))?),
            (other, _) => unreachable!("convert_from of {other:?}"),
        },
        Func::Decode => {
            let (s, format) = (str_of(next()), str_of(next()));
            V::Bytes(bytes::decode(&s, &format)?)
        }
        Func::Encode => match (next(), next()) {
            (V::Bytes(b), format) => V::Str(bytes::encode(&b, &str_of(format))?),
            (other, _) => unreachable!("encode of {other:?}"),
        },
        Func::Length => match next() {
            V::Bytes(b) => V::Int(b.len() as i64),
            s => V::Int(str_of(s).chars().count() as i64),
        },
        // message-db/message-db database/functions/category.sql:
        // `RETURN SPLIT_PART(category.stream_name, '-', 1);`
        Func::Category => V::Str(text::split_part(&str_of(next()), "-", 1)?),
        // message-db/message-db database/functions/id.sql: NULL when STRPOS(stream_name,
        // '-') is 0, else SUBSTRING(stream_name, that position + 1).
        Func::Id => {
            let s = str_of(next());
            match s.find('-') {
                None => return Ok(None),
                Some(at) => V::Str(s[at + 1..].to_owned()),
            }
        }
        Func::Concat | Func::ConcatWs => unreachable!("handled by call"),
    }))
}

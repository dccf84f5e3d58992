//! States stored as `text` columns: one macro gives each state enum its one spelling in
//! SQL, its parsing back, and its binding as a statement parameter, so Rust and SQL never
//! compare strings of their own.

/// Defines a `Copy` enum stored as text: `as_str`, `FromStr`, `Display` (honours width),
/// `Serialize` (as the string), `ToSql`/`FromSql` for `text` columns and parameters,
/// and `ALL` (every value, for tests against the table's check constraint).
macro_rules! stored_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The value as stored.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = crate::stored_enum::UnknownValue;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(crate::stored_enum::UnknownValue {
                        what: stringify!($name),
                        value: s.to_owned(),
                    }),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl tokio_postgres::types::ToSql for $name {
            fn to_sql(
                &self,
                ty: &tokio_postgres::types::Type,
                out: &mut tokio_postgres::types::private::BytesMut,
            ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
                <&str as tokio_postgres::types::ToSql>::to_sql(&self.as_str(), ty, out)
            }
            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <&str as tokio_postgres::types::ToSql>::accepts(ty)
            }
            tokio_postgres::types::to_sql_checked!();
        }

        impl<'a> tokio_postgres::types::FromSql<'a> for $name {
            fn from_sql(
                ty: &tokio_postgres::types::Type,
                raw: &'a [u8],
            ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
                let s = <&str as tokio_postgres::types::FromSql>::from_sql(ty, raw)?;
                Ok(s.parse()?)
            }
            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <&str as tokio_postgres::types::FromSql>::accepts(ty)
            }
        }
    };
}

pub(crate) use stored_enum;

/// A stored state this version does not know (a newer walfold wrote it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}")]
pub struct UnknownValue {
    pub what: &'static str,
    pub value: String,
}

/// Asserts every value of `all` round-trips through its string, `Display`, serde and a
/// `text` parameter, and that a string it does not know is refused.
#[cfg(test)]
pub(crate) fn assert_round_trips<T>(all: &[T], as_str: fn(T) -> &'static str)
where
    T: Copy
        + std::fmt::Debug
        + PartialEq
        + std::fmt::Display
        + std::str::FromStr<Err = UnknownValue>
        + serde::Serialize
        + tokio_postgres::types::ToSql
        + for<'a> tokio_postgres::types::FromSql<'a>,
{
    use tokio_postgres::types::{ToSql, Type};
    let mut seen = std::collections::HashSet::new();
    for &v in all {
        let text = as_str(v);
        assert!(seen.insert(text), "{text} spelled twice");
        assert_eq!(text.parse::<T>(), Ok(v));
        assert_eq!(v.to_string(), text);
        assert_eq!(format!("{v:<12}|"), format!("{text:<12}|"));
        assert_eq!(serde_json::to_value(v).unwrap(), serde_json::json!(text));
        let mut buf = tokio_postgres::types::private::BytesMut::new();
        v.to_sql_checked(&Type::TEXT, &mut buf).unwrap();
        assert_eq!(&buf[..], text.as_bytes());
        assert_eq!(T::from_sql(&Type::TEXT, &buf).unwrap(), v);
    }
    assert!("no such value".parse::<T>().is_err());
    assert!(T::from_sql(&Type::TEXT, b"no such value").is_err());
    assert!(!<T as ToSql>::accepts(&Type::INT4));
}

/// The values the migrations' last `check (column in (…))` allows, sorted: what a test
/// compares with an enum's `ALL`.
#[cfg(test)]
pub(crate) fn checked_values(column: &str) -> Vec<String> {
    let needle = format!("check ({column} in (");
    let last = crate::migrate::MIGRATIONS
        .iter()
        .filter_map(|(_, _, sql)| sql.rfind(&needle).map(|at| &sql[at + needle.len()..]))
        .next_back()
        .unwrap_or_else(|| panic!("no check constraint on {column}"));
    let list = &last[..last.find(')').expect("the list closes")];
    let mut values: Vec<String> = list
        .split(',')
        .map(|v| v.trim().trim_matches('\'').to_owned())
        .collect();
    values.sort();
    values
}

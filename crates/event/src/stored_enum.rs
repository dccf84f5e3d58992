//! States stored as `text` columns: one macro gives each state enum its one spelling in
//! SQL, its parsing back, and its binding as a statement parameter, so Rust and SQL never
//! compare strings of their own.

/// Defines a `Copy` enum stored as text: `as_str`, `FromStr`, `Display` (honours width),
/// `Serialize` (as the string), `ToSql`/`FromSql` for `text` columns and parameters,
/// and `ALL` (every value, for tests against the table's check constraint).
#[macro_export]
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
            type Err = $crate::UnknownValue;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err($crate::UnknownValue {
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

        impl $crate::__private::serde::Serialize for $name {
            fn serialize<S: $crate::__private::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl $crate::__private::postgres_types::ToSql for $name {
            fn to_sql(
                &self,
                ty: &$crate::__private::postgres_types::Type,
                out: &mut $crate::__private::postgres_types::private::BytesMut,
            ) -> Result<$crate::__private::postgres_types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
                <&str as $crate::__private::postgres_types::ToSql>::to_sql(&self.as_str(), ty, out)
            }
            fn accepts(ty: &$crate::__private::postgres_types::Type) -> bool {
                <&str as $crate::__private::postgres_types::ToSql>::accepts(ty)
            }
            $crate::__private::postgres_types::to_sql_checked!();
        }

        impl<'a> $crate::__private::postgres_types::FromSql<'a> for $name {
            fn from_sql(
                ty: &$crate::__private::postgres_types::Type,
                raw: &'a [u8],
            ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
                let s = <&str as $crate::__private::postgres_types::FromSql>::from_sql(ty, raw)?;
                Ok(s.parse()?)
            }
            fn accepts(ty: &$crate::__private::postgres_types::Type) -> bool {
                <&str as $crate::__private::postgres_types::FromSql>::accepts(ty)
            }
        }
    };
}

/// A stored state this version does not know (a newer walfold wrote it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}")]
pub struct UnknownValue {
    pub what: &'static str,
    pub value: String,
}

/// Asserts every value of `all` round-trips through its string, `Display`, serde and a
/// `text` parameter, and that a string it does not know is refused. For tests, here and
/// in the crates that define stored enums of their own.
#[cfg(any(test, feature = "test-util"))]
pub fn assert_round_trips<T>(all: &[T], as_str: fn(T) -> &'static str)
where
    T: Copy
        + std::fmt::Debug
        + PartialEq
        + std::fmt::Display
        + std::str::FromStr<Err = UnknownValue>
        + serde::Serialize
        + postgres_types::ToSql
        + for<'a> postgres_types::FromSql<'a>,
{
    use postgres_types::{ToSql, Type};
    let mut seen = std::collections::HashSet::new();
    for &v in all {
        let text = as_str(v);
        assert!(seen.insert(text), "{text} spelled twice");
        assert_eq!(text.parse::<T>(), Ok(v));
        assert_eq!(v.to_string(), text);
        assert_eq!(format!("{v:<12}|"), format!("{text:<12}|"));
        assert_eq!(serde_json::to_value(v).unwrap(), serde_json::json!(text));
        let mut buf = postgres_types::private::BytesMut::new();
        v.to_sql_checked(&Type::TEXT, &mut buf).unwrap();
        assert_eq!(&buf[..], text.as_bytes());
        assert_eq!(T::from_sql(&Type::TEXT, &buf).unwrap(), v);
    }
    assert!("no such value".parse::<T>().is_err());
    assert!(T::from_sql(&Type::TEXT, b"no such value").is_err());
    assert!(!<T as ToSql>::accepts(&Type::INT4));
}

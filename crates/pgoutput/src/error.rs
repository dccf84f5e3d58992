//! Error types for decoding pgoutput messages and parsing text column values.

use std::fmt;

/// Why a pgoutput message could not be decoded.
///
/// Offsets are byte positions inside the message buffer passed to
/// [`decode`](crate::decode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The buffer was empty: there is no message tag.
    Empty,
    /// The first byte is not a known pgoutput message tag.
    UnknownTag(u8),
    /// The message ended before a field was complete.
    Truncated {
        /// Where the incomplete field starts.
        offset: usize,
        /// How many bytes the field needs.
        needed: usize,
        /// How many bytes were left.
        remaining: usize,
    },
    /// A NUL-terminated string had no terminating NUL.
    UnterminatedString {
        /// Where the string starts.
        offset: usize,
    },
    /// A string was not valid UTF-8.
    InvalidUtf8 {
        /// Where the string starts.
        offset: usize,
    },
    /// A length or count field was negative.
    NegativeLength {
        /// Where the field starts.
        offset: usize,
        /// The value read.
        value: i32,
    },
    /// A tuple marker byte (`N`, `K`, `O`) was not valid at this point.
    UnexpectedTupleMarker {
        /// Where the marker is.
        offset: usize,
        /// The byte found.
        marker: u8,
    },
    /// A tuple column kind byte was not `n`, `u`, `t` or `b`.
    UnknownColumnKind {
        /// Where the kind byte is.
        offset: usize,
        /// The byte found.
        kind: u8,
    },
    /// A flag byte had a value this decoder does not know.
    InvalidFlag {
        /// Which field.
        field: &'static str,
        /// Where the byte is.
        offset: usize,
        /// The byte found.
        value: u8,
    },
    /// Bytes were left over after a complete message.
    TrailingBytes {
        /// Where the unconsumed bytes start.
        offset: usize,
        /// How many bytes were left.
        count: usize,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "empty message"),
            Self::UnknownTag(tag) => write!(f, "unknown message tag 0x{tag:02x}"),
            Self::Truncated {
                offset,
                needed,
                remaining,
            } => write!(
                f,
                "message truncated at byte {offset}: needed {needed} bytes, {remaining} left"
            ),
            Self::UnterminatedString { offset } => {
                write!(f, "unterminated string at byte {offset}")
            }
            Self::InvalidUtf8 { offset } => write!(f, "invalid utf-8 in string at byte {offset}"),
            Self::NegativeLength { offset, value } => {
                write!(f, "negative length {value} at byte {offset}")
            }
            Self::UnexpectedTupleMarker { offset, marker } => {
                write!(f, "unexpected tuple marker 0x{marker:02x} at byte {offset}")
            }
            Self::UnknownColumnKind { offset, kind } => {
                write!(f, "unknown column kind 0x{kind:02x} at byte {offset}")
            }
            Self::InvalidFlag {
                field,
                offset,
                value,
            } => write!(f, "invalid {field} value 0x{value:02x} at byte {offset}"),
            Self::TrailingBytes { offset, count } => {
                write!(f, "{count} trailing bytes after message at byte {offset}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Why a text-format column value could not be parsed by
/// [`parse_text`](crate::parse_text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueError {
    /// The value is not valid UTF-8.
    InvalidUtf8 {
        /// The column's type OID.
        type_oid: u32,
    },
    /// A `bool` value other than `t` or `f`.
    InvalidBool,
    /// An integer value that is not an optional `-` followed by digits.
    InvalidInt,
    /// An integer value outside the range of its type.
    IntOutOfRange {
        /// The column's type OID.
        type_oid: u32,
    },
    /// A `numeric` value that is not a plain decimal, `NaN` or an infinity.
    InvalidNumeric,
    /// A `uuid` value not in the hyphenated 8-4-4-4-12 hex form.
    InvalidUuid,
    /// A `timestamptz` value not in PostgreSQL's ISO output format.
    InvalidTimestamptz,
    /// A `timestamptz` value with a BC date.
    BcTimestamptz,
    /// A `timestamptz` value whose microseconds since the Unix epoch overflow i64.
    TimestamptzOutOfRange,
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidUtf8 { type_oid } => {
                write!(f, "invalid utf-8 in value of type oid {type_oid}")
            }
            Self::InvalidBool => write!(f, "invalid bool value"),
            Self::InvalidInt => write!(f, "invalid integer value"),
            Self::IntOutOfRange { type_oid } => {
                write!(f, "integer out of range for type oid {type_oid}")
            }
            Self::InvalidNumeric => write!(f, "invalid numeric value"),
            Self::InvalidUuid => write!(f, "invalid uuid value"),
            Self::InvalidTimestamptz => write!(f, "invalid timestamptz value"),
            Self::BcTimestamptz => write!(f, "bc timestamptz values are not supported"),
            Self::TimestamptzOutOfRange => write!(f, "timestamptz value out of range"),
        }
    }
}

impl std::error::Error for ValueError {}

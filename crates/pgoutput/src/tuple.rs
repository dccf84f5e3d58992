//! Decoding of TupleData (the column values of one row) inside change messages.

use crate::cursor::Cursor;
use crate::error::DecodeError;
use crate::message::{Column, Tuple};

/// Reads an Int16 column count followed by that many columns.
pub(crate) fn read_tuple<'a>(c: &mut Cursor<'a>) -> Result<Tuple<'a>, DecodeError> {
    let count = c.count16()?;
    // Every column takes at least one byte, so this bounds the allocation by the input.
    let mut columns = Vec::with_capacity(count.min(c.remaining()));
    for _ in 0..count {
        columns.push(read_column(c)?);
    }
    Ok(Tuple { columns })
}

/// Checks TupleData as [`read_tuple`] reads it (the same errors), collecting nothing.
pub(crate) fn skip_tuple(c: &mut Cursor<'_>) -> Result<(), DecodeError> {
    let count = c.count16()?;
    for _ in 0..count {
        read_column(c)?;
    }
    Ok(())
}

fn read_column<'a>(c: &mut Cursor<'a>) -> Result<Column<'a>, DecodeError> {
    let offset = c.position();
    match c.u8()? {
        b'n' => Ok(Column::Null),
        b'u' => Ok(Column::Unchanged),
        b't' => {
            let len = c.len32()?;
            Ok(Column::Text(c.bytes(len)?))
        }
        b'b' => {
            let len = c.len32()?;
            Ok(Column::Binary(c.bytes(len)?))
        }
        kind => Err(DecodeError::UnknownColumnKind { offset, kind }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(buf: &[u8]) -> Result<Tuple<'_>, DecodeError> {
        let mut c = Cursor::new(buf);
        let t = read_tuple(&mut c)?;
        c.finish()?;
        Ok(t)
    }

    #[test]
    fn all_column_kinds() {
        let buf = b"\x00\x04nut\x00\x00\x00\x02hib\x00\x00\x00\x01\x07";
        assert_eq!(
            tuple(buf),
            Ok(Tuple {
                columns: vec![
                    Column::Null,
                    Column::Unchanged,
                    Column::Text(b"hi"),
                    Column::Binary(&[7]),
                ]
            })
        );
    }

    #[test]
    fn empty_tuple_and_empty_text() {
        assert_eq!(tuple(b"\x00\x00"), Ok(Tuple { columns: vec![] }));
        assert_eq!(
            tuple(b"\x00\x01t\x00\x00\x00\x00"),
            Ok(Tuple {
                columns: vec![Column::Text(b"")]
            })
        );
    }

    #[test]
    fn errors() {
        assert_eq!(
            tuple(b"\x00\x01x"),
            Err(DecodeError::UnknownColumnKind {
                offset: 2,
                kind: b'x'
            })
        );
        assert_eq!(
            tuple(b"\xff\xff"),
            Err(DecodeError::NegativeLength {
                offset: 0,
                value: -1
            })
        );
        assert_eq!(
            tuple(b"\x00\x01t\xff\xff\xff\xff"),
            Err(DecodeError::NegativeLength {
                offset: 3,
                value: -1
            })
        );
        assert!(matches!(
            tuple(b"\x00\x01t\x7f\xff\xff\xffabc"),
            Err(DecodeError::Truncated { .. })
        ));
        assert!(matches!(
            tuple(b"\x7f\xffn"),
            Err(DecodeError::Truncated { .. })
        ));
    }
}

//! Checked big-endian reads over a byte slice; every read returns an error instead of panicking.

use crate::error::DecodeError;

/// A read position over a borrowed buffer.
#[derive(Debug, Clone)]
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Current offset from the start of the buffer.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// Bytes not yet read.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// Reads exactly `n` bytes.
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let truncated = DecodeError::Truncated {
            offset: self.pos,
            needed: n,
            remaining: self.remaining(),
        };
        let end = self.pos.checked_add(n).ok_or(truncated.clone())?;
        let out = self.buf.get(self.pos..end).ok_or(truncated)?;
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(u8::from_be_bytes(self.array()?))
    }

    pub(crate) fn i16(&mut self) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    pub(crate) fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    /// Reads an Int16 count that must not be negative.
    pub(crate) fn count16(&mut self) -> Result<usize, DecodeError> {
        let offset = self.pos;
        let value = self.i16()?;
        usize::try_from(value).map_err(|_| DecodeError::NegativeLength {
            offset,
            value: i32::from(value),
        })
    }

    /// Reads an Int32 length or count that must not be negative.
    pub(crate) fn len32(&mut self) -> Result<usize, DecodeError> {
        let offset = self.pos;
        let value = self.i32()?;
        usize::try_from(value).map_err(|_| DecodeError::NegativeLength { offset, value })
    }

    /// Reads a NUL-terminated UTF-8 string; the NUL is consumed but not returned.
    pub(crate) fn cstr(&mut self) -> Result<&'a str, DecodeError> {
        let offset = self.pos;
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        let len = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::UnterminatedString { offset })?;
        let raw = self.bytes(len)?;
        self.bytes(1)?;
        std::str::from_utf8(raw).map_err(|_| DecodeError::InvalidUtf8 { offset })
    }

    /// Succeeds only if every byte has been read.
    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(DecodeError::TrailingBytes {
                offset: self.pos,
                count,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_big_endian_integers() {
        let buf = [
            0x01, 0xff, 0xfe, 0x00, 0x00, 0x01, 0x00, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 1,
            2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe,
        ];
        let mut c = Cursor::new(&buf);
        assert_eq!(c.u8(), Ok(1));
        assert_eq!(c.i16(), Ok(-2));
        assert_eq!(c.u32(), Ok(0x0000_0100));
        assert_eq!(c.i32(), Ok(-1));
        assert_eq!(c.u64(), Ok(0x0102));
        assert_eq!(c.i64(), Ok(-2));
        assert_eq!(c.remaining(), 0);
        assert_eq!(c.finish(), Ok(()));
    }

    #[test]
    fn short_reads_fail_without_consuming() {
        let mut c = Cursor::new(&[1, 2, 3]);
        assert_eq!(
            c.u32(),
            Err(DecodeError::Truncated {
                offset: 0,
                needed: 4,
                remaining: 3
            })
        );
        assert_eq!(c.position(), 0);
        assert_eq!(c.i16(), Ok(0x0102));
        assert!(c.i16().is_err());
        assert!(c.u64().is_err());
        assert_eq!(c.u8(), Ok(3));
        assert!(c.u8().is_err());
    }

    #[test]
    fn huge_lengths_do_not_overflow() {
        let mut c = Cursor::new(&[1, 2, 3]);
        c.u8().ok();
        assert!(matches!(
            c.bytes(usize::MAX),
            Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn negative_lengths_are_errors() {
        let mut c = Cursor::new(&[0xff, 0xff, 0xff, 0xfe, 0x80, 0x00]);
        assert_eq!(
            c.len32(),
            Err(DecodeError::NegativeLength {
                offset: 0,
                value: -2
            })
        );
        let mut c = Cursor::new(&[0x80, 0x00]);
        assert_eq!(
            c.count16(),
            Err(DecodeError::NegativeLength {
                offset: 0,
                value: -32768
            })
        );
    }

    #[test]
    fn strings() {
        let mut c = Cursor::new(b"public\0\0x");
        assert_eq!(c.cstr(), Ok("public"));
        assert_eq!(c.cstr(), Ok(""));
        assert_eq!(c.cstr(), Err(DecodeError::UnterminatedString { offset: 8 }));
        let mut c = Cursor::new(b"a\xff\0");
        assert_eq!(c.cstr(), Err(DecodeError::InvalidUtf8 { offset: 0 }));
        let mut c = Cursor::new(b"");
        assert_eq!(c.cstr(), Err(DecodeError::UnterminatedString { offset: 0 }));
    }

    #[test]
    fn trailing_bytes() {
        let mut c = Cursor::new(&[1, 2]);
        c.u8().ok();
        assert_eq!(
            c.finish(),
            Err(DecodeError::TrailingBytes {
                offset: 1,
                count: 1
            })
        );
    }
}

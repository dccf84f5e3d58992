//! `Lsn`: a WAL position. Progress is monotonic; positions only move forward.

use std::fmt;
use std::str::FromStr;

use postgres_types::PgLsn;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    pub const ZERO: Lsn = Lsn(0);

    pub fn as_u64(self) -> u64 {
        self.0
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Moves forward to `other` if it is later; never back.
    pub fn advance(&mut self, other: Lsn) {
        if other > *self {
            *self = other;
        }
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xffff_ffff)
    }
}

impl FromStr for Lsn {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (hi, lo) = s
            .split_once('/')
            .ok_or_else(|| format!("`{s}` is not an LSN"))?;
        let hi = u64::from_str_radix(hi, 16).map_err(|_| format!("`{s}` is not an LSN"))?;
        let lo = u64::from_str_radix(lo, 16).map_err(|_| format!("`{s}` is not an LSN"))?;
        if hi > 0xffff_ffff || lo > 0xffff_ffff {
            return Err(format!("`{s}` is not an LSN"));
        }
        Ok(Lsn((hi << 32) | lo))
    }
}

impl From<PgLsn> for Lsn {
    fn from(l: PgLsn) -> Self {
        Lsn(u64::from(l))
    }
}

impl From<Lsn> for PgLsn {
    fn from(l: Lsn) -> Self {
        PgLsn::from(l.0)
    }
}

#[cfg(test)]
mod tests {
    use super::Lsn;

    #[test]
    fn formats_parses_and_only_advances() {
        let l: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(l.to_string(), "16/B374D848");
        let mut p = l;
        p.advance(Lsn(1));
        assert_eq!(p, l);
        p.advance(Lsn(l.0 + 1));
        assert_eq!(p.0, l.0 + 1);
        assert!("x".parse::<Lsn>().is_err());
    }
}

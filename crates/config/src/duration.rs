//! Retention windows: `"forever"` or a whole number with a unit (`s`, `m`, `h`, `d`).

use std::time::Duration;

/// How long something is kept (or waited for): parsed once, in validation, from
/// `"forever"` or e.g. `"30d"`, so callers never read the text again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    Forever,
    After(Duration),
}

impl Retention {
    /// Parses `"forever"` or a whole number with a unit; the error says what to write.
    pub fn parse(s: &str) -> Result<Retention, String> {
        Ok(parse_retention(s)?.map_or(Retention::Forever, Retention::After))
    }

    /// The window, `None` for forever.
    pub fn after(self) -> Option<Duration> {
        match self {
            Retention::Forever => None,
            Retention::After(d) => Some(d),
        }
    }
}

/// Parses a retention window; `None` means forever.
pub fn parse_retention(s: &str) -> Result<Option<Duration>, String> {
    let s = s.trim();
    if s == "forever" {
        return Ok(None);
    }
    let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let seconds_per = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => {
            return Err(format!(
            "`{s}` is not a duration: use \"forever\" or e.g. \"30d\", \"12h\", \"15m\", \"90s\""
        ))
        }
    };
    match number.parse::<u64>() {
        Ok(n) if n > 0 => Ok(Some(Duration::from_secs(n.saturating_mul(seconds_per)))),
        _ => Err(format!(
            "`{s}` is not a duration: use \"forever\" or a positive number with s, m, h or d"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_windows_parse() {
        assert_eq!(parse_retention("forever"), Ok(None));
        assert_eq!(
            parse_retention("30d"),
            Ok(Some(Duration::from_secs(30 * 86_400)))
        );
        assert_eq!(parse_retention("90s"), Ok(Some(Duration::from_secs(90))));
        assert!(parse_retention("0d").is_err());
        assert!(parse_retention("30").is_err());
        assert!(parse_retention("d").is_err());
        assert!(parse_retention("1w").is_err());
        assert_eq!(Retention::parse("forever"), Ok(Retention::Forever));
        assert_eq!(
            Retention::parse("10m"),
            Ok(Retention::After(Duration::from_secs(600)))
        );
    }
}

//! What one check finds (its level, what it saw, the fix), and the report that prints
//! findings as they come and counts the failures.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Level {
    Ok,
    Warn,
    Fail,
}

/// One line of `walfold doctor`: ok, warn or FAIL, what was seen and, unless it is ok,
/// how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Finding {
    pub(super) level: Level,
    pub(super) what: String,
    pub(super) fix: String,
}

impl Finding {
    pub(super) fn new(level: Level, what: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding {
            level,
            what: what.into(),
            fix: fix.into(),
        }
    }

    pub(super) fn ok(what: impl Into<String>) -> Finding {
        Finding::new(Level::Ok, what, "")
    }

    pub(super) fn warn(what: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding::new(Level::Warn, what, fix)
    }

    pub(super) fn fail(what: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding::new(Level::Fail, what, fix)
    }

    /// `ok` when `good`, else at `level` with the fix.
    pub(super) fn unless(
        good: bool,
        level: Level,
        what: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding::new(if good { Level::Ok } else { level }, what, fix)
    }
}

pub(super) struct Report {
    pub(super) failures: usize,
    /// Print to standard error (when standard output carries something else).
    pub(super) to_stderr: bool,
    /// Said before each finding's text (`source orders: ` while one of several sources
    /// is checked).
    pub(super) scope: String,
}

impl Report {
    pub(super) fn new(to_stderr: bool) -> Report {
        Report {
            failures: 0,
            to_stderr,
            scope: String::new(),
        }
    }

    /// Prints `finding`.
    pub(super) fn add(&mut self, finding: Finding) {
        let tag = match finding.level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        let mut text = format!("{tag}  {}{}", self.scope, finding.what);
        if finding.level != Level::Ok && !finding.fix.is_empty() {
            text.push_str(&format!("\n      fix: {}", finding.fix));
        }
        if self.to_stderr {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
        self.failures += usize::from(finding.level == Level::Fail);
    }

    pub(super) fn extend(&mut self, findings: impl IntoIterator<Item = Finding>) {
        for f in findings {
            self.add(f);
        }
    }
}

//! Running helper programs and turning failures into [`Error`]s.

use std::process::{Command, Stdio};

use crate::Error;

/// Runs `cmd` with stdin closed, returns its stdout; a non-zero exit becomes
/// [`Error::Command`].
pub(crate) fn run(cmd: &mut Command, program: &str) -> Result<String, Error> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| Error::Spawn {
            program: program.to_owned(),
            source,
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let mut stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if stderr.trim().is_empty() {
            stderr = String::from_utf8_lossy(&out.stdout).into_owned();
        }
        Err(Error::Command {
            program: program.to_owned(),
            status: out.status.to_string(),
            stderr,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_stdout_and_failures() {
        let out = run(Command::new("sh").args(["-c", "echo hi"]), "sh").unwrap();
        assert_eq!(out, "hi\n");
        let err = run(
            Command::new("sh").args(["-c", "echo bad >&2; exit 3"]),
            "sh",
        );
        let msg = err.unwrap_err().to_string();
        assert!(msg.starts_with("sh failed (exit status: 3): bad"), "{msg}");
        let err = run(&mut Command::new("walfold-surely-not-a-program"), "x");
        assert!(matches!(err, Err(Error::Spawn { .. })));
    }
}

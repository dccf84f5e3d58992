//! Locating the PostgreSQL server binaries and other helper programs.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// Environment variable naming the directory that holds `initdb`, `pg_ctl`, `postgres`, `psql`.
pub const BINDIR_ENV: &str = "WALFOLD_PG_BINDIR";

const DEBIAN_ROOT: &str = "/usr/lib/postgresql";

/// `WALFOLD_PG_BINDIR`, else `pg_config --bindir` if it holds initdb, else the newest
/// `/usr/lib/postgresql/*/bin`.
pub(crate) fn find_bin_dir() -> Result<PathBuf, Error> {
    if let Some(dir) = env::var_os(BINDIR_ENV).filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        return if has_initdb(&dir) {
            Ok(dir)
        } else {
            Err(Error::BadBinDir { dir })
        };
    }
    let mut searched = Vec::new();
    if let Some(dir) = pg_config_bindir() {
        if has_initdb(&dir) {
            return Ok(dir);
        }
        searched.push(dir);
    }
    if let Some(dir) = newest_versioned(Path::new(DEBIAN_ROOT)) {
        return Ok(dir);
    }
    searched.push(Path::new(DEBIAN_ROOT).join("*/bin"));
    Err(Error::BinariesNotFound { searched })
}

fn has_initdb(dir: &Path) -> bool {
    dir.join("initdb").is_file()
}

fn pg_config_bindir() -> Option<PathBuf> {
    let out = Command::new("pg_config").arg("--bindir").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = String::from_utf8(out.stdout).ok()?;
    let dir = dir.trim();
    (!dir.is_empty()).then(|| PathBuf::from(dir))
}

/// The `<root>/<version>/bin` with the highest version that contains initdb.
fn newest_versioned(root: &Path) -> Option<PathBuf> {
    let entries = std::fs::read_dir(root).ok()?;
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = parse_version(entry.file_name().to_str()?)?;
            let bin = entry.path().join("bin");
            has_initdb(&bin).then_some((version, bin))
        })
        .max()
        .map(|(_, bin)| bin)
}

fn parse_version(name: &str) -> Option<Vec<u32>> {
    name.split('.').map(|part| part.parse().ok()).collect()
}

/// The first executable file called `name` on `PATH`.
pub(crate) fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_newest_version_with_initdb() {
        let root = env::temp_dir().join(format!("walfold-bins-test-{}", std::process::id()));
        for (version, with_initdb) in [("9.6", true), ("15", true), ("16", false), ("x", true)] {
            let bin = root.join(version).join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            if with_initdb {
                std::fs::write(bin.join("initdb"), "").unwrap();
            }
        }
        let found = newest_versioned(&root);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(found, Some(root.join("15").join("bin")));
    }

    #[test]
    fn versions_compare_numerically() {
        assert!(parse_version("10") > parse_version("9.6"));
        assert_eq!(parse_version("main"), None);
    }

    #[test]
    fn finds_sh_on_path() {
        assert!(find_in_path("sh").is_some());
        assert!(find_in_path("walfold-surely-not-a-program").is_none());
    }
}

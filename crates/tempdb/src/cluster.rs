//! The [`Cluster`] type: creating, configuring and tearing down a throwaway cluster.

use std::ffi::OsString;
use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::bins::find_bin_dir;
use crate::conf::{self, TlsPaths, INCLUDE_FILE};
use crate::exec::run;
use crate::guardian::Guardian;
use crate::tls::{self, TlsFiles};
use crate::user::RunAs;
use crate::{Error, SCRAM_PASSWORD, SCRAM_USER, SUPERUSER};

/// How many free ports to try when the chosen one gets taken before the server binds it.
const PORT_ATTEMPTS: u32 = 5;

/// Options for [`Cluster::start`].
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Generate a CA and server certificate and turn on `ssl`.
    pub tls: bool,
    /// Extra `postgresql.conf` settings (name, value); they override the defaults.
    pub extra_settings: Vec<(String, String)>,
    /// Roles that must authenticate with scram-sha-256 over TCP, like [`SCRAM_USER`] (the
    /// caller creates them, with their passwords).
    pub scram_roles: Vec<String>,
    /// The directory holding `initdb`, `pg_ctl`, `postgres` and `psql` (another version's
    /// server); `None`: as [`Cluster::start`] finds them.
    pub bin_dir: Option<PathBuf>,
}

/// A running throwaway PostgreSQL cluster; stopped and deleted on drop.
#[derive(Debug)]
pub struct Cluster {
    pub(crate) dir: PathBuf,
    pub(crate) data_dir: PathBuf,
    pub(crate) bin_dir: PathBuf,
    pub(crate) port: u16,
    pub(crate) tls: Option<TlsFiles>,
    pub(crate) run_as: RunAs,
    pub(crate) guardian: Option<Guardian>,
}

impl Cluster {
    /// Starts a new throwaway cluster: initdb into a fresh temp dir, wal_level=logical, a free
    /// loopback port, unix socket in the temp dir, trust auth for the superuser `postgres` over
    /// 127.0.0.1, plus the role `walfold_scram` (password `walfold-secret`) that must
    /// authenticate with scram-sha-256 over TCP.
    pub fn start(opts: Options) -> Result<Cluster, Error> {
        let bin_dir = match &opts.bin_dir {
            Some(dir) => dir.clone(),
            None => find_bin_dir()?,
        };
        let run_as = RunAs::detect()?;
        let dir = make_temp_dir(&run_as)?;
        let data_dir = dir.join("data");
        let mut stop: Vec<OsString> = run_as.prefix();
        stop.push(bin_dir.join("pg_ctl").into_os_string());
        stop.extend(["-D".into(), data_dir.clone().into_os_string()]);
        stop.extend(["-m", "immediate", "-w", "-t", "30", "stop"].map(OsString::from));
        let guardian = match Guardian::spawn(&dir, &stop) {
            Ok(guardian) => guardian,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        // From here on, dropping `cluster` (also on error) stops the server and removes `dir`.
        let mut cluster = Cluster {
            dir,
            data_dir,
            bin_dir,
            port: 0,
            tls: None,
            run_as,
            guardian: Some(guardian),
        };
        cluster.init(&opts)?;
        Ok(cluster)
    }

    /// One cluster per process, started on first use, with TLS on. A test helper: panics with
    /// the error message if the cluster cannot be started.
    pub fn shared() -> &'static Cluster {
        static SHARED: OnceLock<Cluster> = OnceLock::new();
        SHARED.get_or_init(|| {
            let opts = Options {
                tls: true,
                ..Options::default()
            };
            Cluster::start(opts)
                .unwrap_or_else(|e| panic!("walfold-tempdb: cannot start the shared cluster: {e}"))
        })
    }

    fn init(&mut self, opts: &Options) -> Result<(), Error> {
        if opts.tls {
            self.tls = Some(tls::generate(&self.dir)?);
        }
        self.run_as.chown(&self.dir)?;
        let mut initdb = self.run_as.command(&self.bin_dir.join("initdb"));
        initdb
            .current_dir(&self.dir)
            .env("LC_ALL", "C")
            .arg("-D")
            .arg(&self.data_dir)
            .args([
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]);
        run(&mut initdb, "initdb")?;
        self.write_file("pg_hba.conf", &conf::render_hba(&opts.scram_roles), false)?;
        self.write_file("postgresql.conf", &conf::include_line(), true)?;
        for attempt in 1..=PORT_ATTEMPTS {
            self.port = free_port()?;
            let tls = self.tls.as_ref().map(|t| TlsPaths {
                cert: &t.server_cert,
                key: &t.server_key,
            });
            let settings =
                conf::render_settings(self.port, &self.dir, tls.as_ref(), &opts.extra_settings);
            self.write_file(INCLUDE_FILE, &settings, false)?;
            let log_len = self.log_len();
            match self.pg_ctl("start", None) {
                Ok(()) => break,
                Err(_) if attempt < PORT_ATTEMPTS && self.port_clash_since(log_len) => continue,
                Err(e) => return Err(e),
            }
        }
        self.wait_ready("start")?;
        let create_role = format!(
            "CREATE ROLE {SCRAM_USER} LOGIN REPLICATION PASSWORD {};",
            conf::quote(SCRAM_PASSWORD)
        );
        self.psql("postgres", &create_role)?;
        Ok(())
    }

    /// Writes (or appends to) a file in the data directory, owned by the server's OS user.
    pub(crate) fn write_file(&self, name: &str, contents: &str, append: bool) -> Result<(), Error> {
        let path = self.data_dir.join(name);
        let result = if append {
            fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, contents.as_bytes()))
        } else {
            fs::write(&path, contents)
        };
        result.map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        self.run_as.chown(&path)
    }

    /// The TCP port the server listens on (127.0.0.1 only).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding initdb, pg_ctl, postgres, psql.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The cluster's data directory (inside the temp dir).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The unix socket directory: the temp dir that holds everything of this cluster.
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate that signed the server certificate, when TLS is on.
    pub fn ca_cert(&self) -> Option<&Path> {
        self.tls.as_ref().map(|t| t.ca_cert.as_path())
    }

    /// Makes the server present a self-signed certificate for `name` (see
    /// [`crate::self_signed_cert`]) to new connections; returns its path. Needs `tls`.
    pub fn serve_self_signed_cert(&self, name: &str) -> Result<PathBuf, Error> {
        let (cert, key) = tls::self_signed_cert(&self.dir, name, &[])?;
        self.run_as.chown(&cert)?;
        self.run_as.chown(&key)?;
        let path = |p: &Path| conf::quote(&p.display().to_string());
        self.psql(
            "postgres",
            &format!(
                "alter system set ssl_cert_file = {}; alter system set ssl_key_file = {}; \
                 select pg_reload_conf();",
                path(&cert),
                path(&key)
            ),
        )?;
        // The postmaster loads the certificate while it rereads the settings, before it
        // starts another session: a session that sees the new setting gets the new one.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.psql("postgres", "show ssl_cert_file")?.trim() != cert.display().to_string() {
            if std::time::Instant::now() > deadline {
                return Err(Error::io(
                    "waiting for the server to load the certificate",
                    std::io::ErrorKind::TimedOut.into(),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(cert)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.data_dir.join("postmaster.pid").exists() {
            let _ = self.pg_ctl("stop", Some("immediate"));
        }
        if let Some(guardian) = self.guardian.take() {
            guardian.release();
        }
        if self.dir.exists() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

pub(crate) fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| Error::io("binding 127.0.0.1:0 to find a free port", e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("reading the free port", e))?;
    Ok(addr.port())
}

/// Creates `<temp>/walfold-pg-<pid>-<n>`, a directory nobody else uses.
pub(crate) fn make_temp_dir(run_as: &RunAs) -> Result<PathBuf, Error> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let base = base_dir(run_as);
    let pid = std::process::id();
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("walfold-pg-{pid}-{n}"));
        match fs::create_dir(&dir) {
            Ok(()) => {
                let mode = fs::Permissions::from_mode(0o755);
                fs::set_permissions(&dir, mode)
                    .map_err(|e| Error::io(format!("chmod {}", dir.display()), e))?;
                return Ok(dir);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 10_000 => continue,
            Err(e) => {
                let hint = format!(
                    "creating {} (set TMPDIR to a writable directory)",
                    dir.display()
                );
                return Err(Error::io(hint, e));
            }
        }
    }
}

/// The system temp dir, or /tmp when the server's OS user could not reach it or the unix
/// socket path would get too long.
fn base_dir(run_as: &RunAs) -> PathBuf {
    let temp = std::env::temp_dir();
    let too_long = temp.as_os_str().len() > 60;
    let reachable = !run_as.switches_user() || world_traversable(&temp);
    if too_long || !reachable {
        PathBuf::from("/tmp")
    } else {
        temp
    }
}

fn world_traversable(path: &Path) -> bool {
    path.ancestors()
        .filter(|a| !a.as_os_str().is_empty())
        .all(|a| {
            fs::metadata(a)
                .map(|m| m.permissions().mode() & 0o001 != 0)
                .unwrap_or(false)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_dirs_are_fresh_and_named_after_the_pid() {
        let a = make_temp_dir(&RunAs::Current).unwrap();
        let b = make_temp_dir(&RunAs::Current).unwrap();
        assert_ne!(a, b);
        let name = a.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(name.starts_with(&format!("walfold-pg-{}-", std::process::id())));
        fs::remove_dir(a).unwrap();
        fs::remove_dir(b).unwrap();
    }

    #[test]
    fn free_port_is_nonzero() {
        assert_ne!(free_port().unwrap(), 0);
    }

    #[test]
    fn tmp_is_world_traversable() {
        assert!(world_traversable(Path::new("/tmp")));
    }
}

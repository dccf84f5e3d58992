//! A self-signed CA and a server certificate for `localhost`/127.0.0.1, made with `openssl`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::exec::run;
use crate::Error;

const OPENSSL_CNF: &str = "\
[req]
distinguished_name = dn
prompt = no

[dn]
CN = walfold-tempdb

[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

/// Paths of the generated files.
#[derive(Debug, Clone)]
pub(crate) struct TlsFiles {
    pub(crate) ca_cert: PathBuf,
    pub(crate) server_cert: PathBuf,
    pub(crate) server_key: PathBuf,
}

/// Generates `ca.crt`, `server.crt` and `server.key` (mode 0600) in `dir`.
pub(crate) fn generate(dir: &Path) -> Result<TlsFiles, Error> {
    let cnf = dir.join("openssl.cnf");
    fs::write(&cnf, OPENSSL_CNF).map_err(|e| Error::io(format!("writing {}", cnf.display()), e))?;
    let ca_key = dir.join("ca.key");
    let files = TlsFiles {
        ca_cert: dir.join("ca.crt"),
        server_cert: dir.join("server.crt"),
        server_key: dir.join("server.key"),
    };
    let csr = dir.join("server.csr");
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl()
        .args(["req", "-x509", "-config"])
        .arg(&cnf)
        .args([
            "-extensions",
            "ca_ext",
            "-days",
            "3650",
            "-subj",
            "/CN=walfold-tempdb test ca",
        ])
        .args(ec)
        .arg("-keyout")
        .arg(&ca_key)
        .arg("-out")
        .arg(&files.ca_cert)
        .run()?;
    openssl()
        .args(["req", "-new", "-config"])
        .arg(&cnf)
        .args(["-subj", "/CN=localhost"])
        .args(ec)
        .arg("-keyout")
        .arg(&files.server_key)
        .arg("-out")
        .arg(&csr)
        .run()?;
    openssl()
        .args([
            "x509",
            "-req",
            "-days",
            "3650",
            "-extensions",
            "server_ext",
            "-extfile",
        ])
        .arg(&cnf)
        .arg("-in")
        .arg(&csr)
        .arg("-CA")
        .arg(&files.ca_cert)
        .arg("-CAkey")
        .arg(&ca_key)
        .args(["-set_serial", &serial()])
        .arg("-out")
        .arg(&files.server_cert)
        .run()?;
    for key in [&ca_key, &files.server_key] {
        fs::set_permissions(key, fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("chmod 0600 {}", key.display()), e))?;
    }
    Ok(files)
}

fn openssl() -> Command {
    let bin = Path::new("/usr/bin/openssl");
    Command::new(if bin.is_file() {
        bin
    } else {
        Path::new("openssl")
    })
}

trait RunExt {
    fn run(&mut self) -> Result<String, Error>;
}

impl RunExt for Command {
    fn run(&mut self) -> Result<String, Error> {
        run(self, "openssl")
    }
}

/// A positive serial number that differs between runs.
fn serial() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{}",
        (nanos as u64 ^ u64::from(std::process::id())) >> 1 | 1
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_a_chain_that_verifies() {
        let dir = std::env::temp_dir().join(format!("walfold-tls-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let files = generate(&dir).unwrap();
        let out = openssl()
            .arg("verify")
            .arg("-CAfile")
            .arg(&files.ca_cert)
            .args(["-verify_hostname", "localhost", "-verify_ip", "127.0.0.1"])
            .arg(&files.server_cert)
            .output()
            .unwrap();
        let mode = fs::metadata(&files.server_key)
            .unwrap()
            .permissions()
            .mode();
        fs::remove_dir_all(&dir).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(mode & 0o777, 0o600);
    }
}

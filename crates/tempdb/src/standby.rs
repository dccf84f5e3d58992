//! A physical standby of a throwaway cluster, as an operator makes one
//! (`pg_basebackup -R`), for failover tests: cut it off so it falls behind, stop the
//! primary, promote the standby.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use crate::cluster::{free_port, make_temp_dir};
use crate::conf::{self, INCLUDE_FILE};
use crate::exec::run;
use crate::guardian::Guardian;
use crate::user::RunAs;
use crate::{Cluster, Error, SUPERUSER};

impl Cluster {
    /// Starts an asynchronous physical standby of this cluster (streaming replication,
    /// `hot_standby`), without TLS, on its own free port.
    pub fn standby(&self) -> Result<Cluster, Error> {
        let run_as = RunAs::detect()?;
        let dir = make_temp_dir(&run_as)?;
        let data_dir = dir.join("data");
        let mut stop: Vec<OsString> = run_as.prefix();
        stop.push(self.bin_dir.join("pg_ctl").into_os_string());
        stop.extend(["-D".into(), data_dir.clone().into_os_string()]);
        stop.extend(["-m", "immediate", "-w", "-t", "30", "stop"].map(OsString::from));
        let guardian = Guardian::spawn(&dir, &stop)?;
        let standby = Cluster {
            dir,
            data_dir,
            bin_dir: self.bin_dir.clone(),
            port: free_port()?,
            tls: None,
            run_as,
            guardian: Some(guardian),
        };
        standby.run_as.chown(&standby.dir)?;
        run_as_basebackup(self, &standby)?;
        let settings = conf::render_settings(
            standby.port,
            &standby.dir,
            None,
            &[("hot_standby".into(), "on".into())],
        );
        standby.write_file(INCLUDE_FILE, &settings, false)?;
        standby.pg_ctl("start", None)?;
        standby.wait_ready("start")?;
        Ok(standby)
    }

    /// Cuts a standby off its primary (its WAL receiver stops): from here on it falls
    /// behind, as an async standby does when the primary outruns it.
    pub fn detach(&self) -> Result<(), Error> {
        self.psql(
            "postgres",
            "alter system set primary_conninfo = ''; select pg_reload_conf()",
        )
        .map(drop)
    }

    /// Promotes a standby and waits until it accepts writes.
    pub fn promote(&self) -> Result<(), Error> {
        self.pg_ctl("promote", None)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.psql("postgres", "select pg_is_in_recovery()")?.trim() != "f" {
            if Instant::now() > deadline {
                return Err(Error::io(
                    "waiting for the promotion",
                    std::io::ErrorKind::TimedOut.into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

fn run_as_basebackup(primary: &Cluster, standby: &Cluster) -> Result<(), Error> {
    let mut cmd = standby
        .run_as
        .command(&primary.bin_dir.join("pg_basebackup"));
    cmd.current_dir(&standby.dir)
        .arg("-D")
        .arg(&standby.data_dir)
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &primary.port.to_string(),
            "-U",
            SUPERUSER,
        ])
        .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"]);
    run(&mut cmd, "pg_basebackup").map(drop)
}

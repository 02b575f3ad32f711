//! `muster tls`: a cluster CA and role certificates for development and
//! small clusters (docs/security.md).

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use muster_tls::{Role, Validity};

#[derive(Subcommand, Debug)]
pub enum TlsCmd {
    /// Create a cluster CA in DIR: ca.pem (give it to every process) and
    /// ca-key.pem (keep it where certificates are issued).
    Init(InitArgs),
    /// Issue a certificate: muster tls issue server 1 | agent NODE_ID | admin NAME | client NAME | reader NAME.
    /// Writes KIND-NAME.pem and KIND-NAME-key.pem; issuing again rotates it.
    Issue(IssueArgs),
}

#[derive(Args, Debug)]
pub struct InitArgs {
    /// Where the CA goes.
    #[arg(long, env = "MUSTER_TLS_DIR")]
    dir: PathBuf,
    /// A name for the CA (its common name).
    #[arg(long, default_value = "cluster")]
    name: String,
    /// How long the CA is valid.
    #[arg(long, default_value = "3650d")]
    valid_for: String,
}

#[derive(Args, Debug)]
pub struct IssueArgs {
    /// server, agent, admin, client or reader.
    kind: String,
    /// The server's id, the agent's node id, or the person's or service's name.
    name: String,
    /// The TLS dir holding the CA.
    #[arg(long, env = "MUSTER_TLS_DIR")]
    dir: PathBuf,
    /// How long the certificate is valid.
    #[arg(long, default_value = "365d")]
    valid_for: String,
    /// Extra DNS names or IP addresses (repeatable), e.g. a server's hostname.
    #[arg(long = "san")]
    sans: Vec<String>,
}

fn validity(s: &str) -> anyhow::Result<Validity> {
    let secs = crate::args::parse_duration_s(s).context("--valid-for")?;
    if secs == 0 {
        bail!("--valid-for must be longer than 0s");
    }
    let secs =
        i64::try_from(secs).ok().filter(|s| *s <= 100 * 365 * 86_400).context("--valid-for: at most 100 years")?;
    Ok(Validity::seconds(secs))
}

pub fn run(cmd: TlsCmd) -> anyhow::Result<()> {
    match cmd {
        TlsCmd::Init(a) => {
            let path = muster_tls::init_ca(&a.dir, &a.name, validity(&a.valid_for)?)?;
            out!("created the CA {} (and ca-key.pem beside it: keep it private)", path.display());
            out!("next: muster tls issue server 1 --dir {}", a.dir.display());
        }
        TlsCmd::Issue(a) => {
            let role = Role::new(&a.kind, &a.name)?;
            let path = muster_tls::issue(&a.dir, &role, validity(&a.valid_for)?, &a.sans)?;
            out!("issued {} to {} ({})", path.display(), role, role.uri());
        }
    }
    Ok(())
}

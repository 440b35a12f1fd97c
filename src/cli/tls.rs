//! `cairn tls ca create` and `cairn tls cert create`: a CA and
//! certificates in the current directory, as `consul tls` writes them
//! (the work is `crate::tls`'s; this is the command line).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use super::{CliError, CliResult};
use crate::tls::{self, CertKind, CertRequest};

#[derive(Subcommand, Debug)]
pub enum TlsCmd {
    /// Helpers for CAs.
    #[command(subcommand)]
    Ca(CaCmd),
    /// Helpers for certificates.
    #[command(subcommand)]
    Cert(CertCmd),
}

#[derive(Subcommand, Debug)]
pub enum CaCmd {
    /// Create a self-signed CA: <domain>-agent-ca.pem and its key.
    Create(CaArgs),
}

#[derive(Subcommand, Debug)]
pub enum CertCmd {
    /// Create a certificate signed by the CA:
    /// <dc>-<server|client>-<domain>-<n>.pem and its key.
    Create(CertArgs),
}

#[derive(Args, Debug)]
pub struct CaArgs {
    /// Days the CA is valid for.
    #[arg(long, default_value_t = 1825)]
    days: u32,
    /// The cluster's DNS domain (names the files).
    #[arg(long, default_value = "consul")]
    domain: String,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("kind").required(true).args(["server", "client"])))]
pub struct CertArgs {
    /// A server certificate (server.<dc>.<domain>).
    #[arg(long)]
    server: bool,
    /// A client certificate (client.<dc>.<domain>).
    #[arg(long)]
    client: bool,
    #[arg(long, default_value = "dc1")]
    dc: String,
    #[arg(long, default_value = "consul")]
    domain: String,
    /// The CA certificate (default: <domain>-agent-ca.pem).
    #[arg(long)]
    ca: Option<PathBuf>,
    /// The CA's key (default: <domain>-agent-ca-key.pem).
    #[arg(long)]
    key: Option<PathBuf>,
    /// Days the certificate is valid for.
    #[arg(long, default_value_t = 365)]
    days: u32,
    /// Another DNS name in the SANs (repeatable; localhost always is).
    #[arg(long = "additional-dnsname")]
    additional_dnsname: Vec<String>,
    /// Another IP address in the SANs (repeatable; 127.0.0.1 always is).
    #[arg(long = "additional-ipaddress")]
    additional_ipaddress: Vec<IpAddr>,
}

/// Runs a `tls` command in the current directory.
pub fn run(cmd: TlsCmd) -> CliResult {
    let dir = Path::new(".");
    match cmd {
        TlsCmd::Ca(CaCmd::Create(a)) => {
            let (cert, key) = tls::create_ca(dir, &a.domain, a.days)?;
            println!("==> Saved {}", name(&cert));
            println!("==> Saved {}", name(&key));
        }
        TlsCmd::Cert(CertCmd::Create(a)) => {
            let (ca_file, ca_key_file) = tls::ca_files(dir, &a.domain);
            let req = CertRequest {
                kind: if a.server {
                    CertKind::Server
                } else {
                    CertKind::Client
                },
                datacenter: a.dc,
                domain: a.domain,
                ca_file: a.ca.unwrap_or(ca_file),
                ca_key_file: a.key.unwrap_or(ca_key_file),
                days: a.days,
                extra_dns: a.additional_dnsname,
                extra_ips: a.additional_ipaddress,
            };
            for f in [&req.ca_file, &req.ca_key_file] {
                if !f.exists() {
                    return Err(CliError(format!(
                        "{} not found: create a CA first (cairn tls ca create) or name one with -ca and -key",
                        f.display()
                    )));
                }
            }
            if req.kind == CertKind::Server {
                println!(
                    "==> WARNING: Server Certificates grants authority to become a\n    server and access all state in the cluster including root keys\n    and all ACL tokens. Do not distribute them to production hosts\n    that are not server nodes. Store them as securely as CA keys."
                );
            }
            println!(
                "==> Using {} and {}",
                name(&req.ca_file),
                name(&req.ca_key_file)
            );
            let (cert, key) = tls::create_cert(dir, &req)?;
            println!("==> Saved {}", name(&cert));
            println!("==> Saved {}", name(&key));
        }
    }
    Ok(())
}

fn name(p: &Path) -> String {
    p.strip_prefix(".").unwrap_or(p).display().to_string()
}

//! TLS settings from PEM files, and `braid tls init`, which makes a CA with
//! a server and a client certificate for a quick start. The files use the
//! layout nbdkit, qemu and libnbd expect (`ca-cert.pem`, `server-cert.pem`,
//! `server-key.pem`, `client-cert.pem`, `client-key.pem`), so one directory
//! serves every tool.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

use crate::cli::TlsInitArgs;
use crate::out::outln;

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let certs = rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: not PEM certificates", path.display()))?;
    if certs.is_empty() {
        bail!("{}: no certificate in it", path.display());
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    rustls_pemfile::private_key(&mut &pem[..])
        .with_context(|| format!("{}: not a PEM private key", path.display()))?
        .with_context(|| format!("{}: no private key in it", path.display()))
}

fn roots(path: &Path) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for c in certs(path)? {
        roots
            .add(c)
            .with_context(|| format!("{}: not a usable CA certificate", path.display()))?;
    }
    Ok(roots)
}

/// The server side: certificate and key, and, with `client_ca`, only
/// clients holding a certificate that CA signed get in.
pub fn server(
    cert: &Path,
    key_path: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>> {
    let builder = rustls::ServerConfig::builder();
    let builder = match client_ca {
        Some(ca) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder(Arc::new(roots(ca)?))
                .build()
                .context("building the client certificate verifier")?,
        ),
        None => builder.with_no_client_auth(),
    };
    let cfg = builder
        .with_single_cert(certs(cert)?, key(key_path)?)
        .context("the server certificate and key do not match")?;
    Ok(Arc::new(cfg))
}

/// The client side: the CA that signed the target's certificate, and a
/// client certificate for targets that check clients.
pub fn client(
    ca: &Path,
    cert: Option<&Path>,
    key_path: Option<&Path>,
) -> Result<Arc<rustls::ClientConfig>> {
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots(ca)?);
    let cfg = match (cert, key_path) {
        (Some(c), Some(k)) => builder
            .with_client_auth_cert(certs(c)?, key(k)?)
            .context("the client certificate and key do not match")?,
        (None, None) => builder.with_no_client_auth(),
        _ => bail!("give both --tls-cert and --tls-key, or neither"),
    };
    Ok(Arc::new(cfg))
}

/// `braid tls init DIR`.
pub fn init(args: TlsInitArgs) -> Result<()> {
    let dir = &args.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for f in ["ca-cert.pem", "server-cert.pem", "client-cert.pem"] {
        if dir.join(f).exists() && !args.force {
            bail!(
                "{} exists; pass --force to replace the certificates in {}",
                dir.join(f).display(),
                dir.display()
            );
        }
    }
    let mut names = args.names.clone();
    if names.is_empty() {
        names.push("localhost".into());
        names.push("127.0.0.1".into());
        names.push("::1".into());
        if let Ok(addrs) = braid_netif::addrs() {
            for a in addrs
                .iter()
                .filter(|a| a.up && !a.loopback && !a.link_local())
            {
                names.push(a.ip.to_string());
            }
        }
        if let Ok(h) = std::fs::read_to_string("/etc/hostname") {
            let h = h.trim();
            if !h.is_empty() {
                names.push(h.to_owned());
            }
        }
    }
    let made = generate(dir, &names)?;
    outln!("made a CA and certificates in {}:", dir.display());
    for f in &made {
        outln!("  {}", f.display());
    }
    outln!("server certificate valid for: {}", names.join(", "));
    outln!(
        "serve:  braid serve --tls-cert {0}/server-cert.pem --tls-key {0}/server-key.pem --tls-client-ca {0}/ca-cert.pem ...",
        dir.display()
    );
    outln!(
        "client: braid attach nbds://HOST/EXPORT --tls-ca {0}/ca-cert.pem --tls-cert {0}/client-cert.pem --tls-key {0}/client-key.pem",
        dir.display()
    );
    outln!(
        "libnbd: nbdinfo 'nbds://HOST/EXPORT?tls-certificates={}'",
        dir.display()
    );
    Ok(())
}

fn generate(dir: &Path, names: &[String]) -> Result<Vec<PathBuf>> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, SanType,
    };
    let mut ca_params = CertificateParams::default();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "braid CA");
    ca_params.distinguished_name = dn;
    let ca_key = KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;

    let leaf = |cn: &str, sans: Vec<SanType>| -> Result<(String, String)> {
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        p.distinguished_name = dn;
        p.subject_alt_names = sans;
        let k = KeyPair::generate()?;
        let c = p.signed_by(&k, &ca, &ca_key)?;
        Ok((c.pem(), k.serialize_pem()))
    };
    let mut sans = Vec::new();
    for n in names {
        match n.parse::<IpAddr>() {
            Ok(ip) => sans.push(SanType::IpAddress(ip)),
            Err(_) => sans.push(SanType::DnsName(n.clone().try_into()?)),
        }
    }
    let (server_cert, server_key) = leaf("braid server", sans)?;
    let (client_cert, client_key) = leaf(
        "braid client",
        vec![SanType::DnsName("braid-client".try_into()?)],
    )?;
    let files = [
        ("ca-cert.pem", ca.pem(), 0o644),
        ("ca-key.pem", ca_key.serialize_pem(), 0o600),
        ("server-cert.pem", server_cert, 0o644),
        ("server-key.pem", server_key, 0o600),
        ("client-cert.pem", client_cert, 0o644),
        ("client-key.pem", client_key, 0o600),
    ];
    let mut made = Vec::new();
    for (name, pem, mode) in files {
        let p = dir.join(name);
        std::fs::write(&p, pem).with_context(|| format!("writing {}", p.display()))?;
        crate::control::set_mode(&p, mode);
        made.push(p);
    }
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_certificates_load_into_both_sides() {
        let d = tempfile::tempdir().unwrap();
        generate(d.path(), &["localhost".into(), "127.0.0.1".into()]).unwrap();
        let p = |f: &str| d.path().join(f);
        server(
            &p("server-cert.pem"),
            &p("server-key.pem"),
            Some(&p("ca-cert.pem")),
        )
        .unwrap();
        client(
            &p("ca-cert.pem"),
            Some(&p("client-cert.pem")),
            Some(&p("client-key.pem")),
        )
        .unwrap();
        let e = client(&p("ca-cert.pem"), Some(&p("client-cert.pem")), None).unwrap_err();
        assert!(e.to_string().contains("both"), "{e}");
        let e = server(&p("ca-key.pem"), &p("server-key.pem"), None).unwrap_err();
        assert!(format!("{e:#}").contains("no certificate"), "{e:#}");
    }
}

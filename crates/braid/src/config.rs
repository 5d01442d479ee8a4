//! Configuration files, as an alternative to flags (for systemd units and
//! hosts with several volumes). TOML; every key mirrors a flag of the same
//! name, and `contrib/*.toml` documents each one.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::cli::{MultipathArgs, UsageError};

/// `braid serve --config FILE`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeFile {
    #[serde(default)]
    pub listen: Vec<String>,
    #[serde(default)]
    pub read_only: bool,
    /// Serve writable images on a network file system (`--allow-network-fs`).
    #[serde(default)]
    pub allow_network_fs: bool,
    pub state_dir: Option<PathBuf>,
    pub control: Option<PathBuf>,
    /// The console and metrics listener (`--http`; `metrics` is its older
    /// name).
    #[serde(alias = "metrics")]
    pub http: Option<String>,
    /// The console's token file (`--http-token`).
    pub http_token: Option<PathBuf>,
    /// Port of the iSCSI portals (`--iscsi`).
    pub iscsi: Option<u16>,
    /// CHAP credentials file for iSCSI logins (`--iscsi-chap`).
    pub iscsi_chap: Option<PathBuf>,
    /// The iSCSI access list: initiators, their CHAP credentials and
    /// exports (`--iscsi-acl`).
    pub iscsi_acl: Option<PathBuf>,
    /// Prefix of iSCSI target names (`--iscsi-iqn`).
    pub iscsi_iqn: Option<String>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    /// Size for every missing file source (an export's own `create` wins).
    pub create: Option<String>,
    pub max_connections: Option<usize>,
    pub max_connections_per_client: Option<usize>,
    pub max_requests_per_connection: Option<usize>,
    pub max_inflight_per_connection: Option<String>,
    pub max_inflight_total: Option<String>,
    pub handshake_timeout: Option<f64>,
    pub idle_timeout: Option<f64>,
    pub send_timeout: Option<f64>,
    /// `--sendfile`.
    pub sendfile: Option<crate::cli::SendfileArg>,
    pub iscsi_dataout_timeout: Option<f64>,
    pub iscsi_nopin_interval: Option<f64>,
    pub iscsi_nopin_timeout: Option<f64>,
    /// Ceph configuration for rbd: exports (`--ceph-conf`).
    pub ceph_conf: Option<PathBuf>,
    /// Ceph user for rbd: exports (`--ceph-id`).
    pub ceph_id: Option<String>,
    /// A directory for an admin socket per RADOS client
    /// (`--ceph-admin-socket`).
    pub ceph_admin_socket: Option<PathBuf>,
    /// Keep librbd's write cache (`--rbd-cache`).
    #[serde(default)]
    pub rbd_cache: bool,
    /// Seconds a gateway's record lives (`--gateway-lease`).
    pub gateway_lease: Option<f64>,
    #[serde(default, rename = "export")]
    pub exports: Vec<ServeExport>,
}

/// One `[[export]]` of a serve file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeExport {
    pub name: String,
    /// A file, a block device, `mem:SIZE` or `rbd:POOL/[NAMESPACE/]IMAGE[@SNAP]`.
    pub source: String,
    /// Create a missing file of this size (sparse).
    pub create: Option<String>,
    pub volume_id: Option<String>,
    /// Client networks allowed to use the export (default: all).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Refuse writes to this export (`--read-only-export NAME`).
    #[serde(default)]
    pub read_only: bool,
    /// Its iSCSI unit starts with the write cache on
    /// (`--iscsi-write-cache NAME`).
    #[serde(default)]
    pub iscsi_write_cache: bool,
}

/// `braid attach --config FILE`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachFile {
    /// The console and metrics listener (`--http`; `metrics` is its older
    /// name).
    #[serde(alias = "metrics")]
    pub http: Option<String>,
    /// The console's token file (`--http-token`).
    pub http_token: Option<PathBuf>,
    pub control: Option<PathBuf>,
    #[serde(default, rename = "volume")]
    pub volumes: Vec<AttachVolume>,
}

/// One `[[volume]]` of an attach file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachVolume {
    pub uri: String,
    pub name: Option<String>,
    pub socket: Option<PathBuf>,
    pub tcp: Option<String>,
    pub policy: Option<String>,
    /// Paths with their knobs, as `--path` takes them.
    #[serde(default)]
    pub paths: Vec<String>,
    #[serde(default)]
    pub portals: Vec<String>,
    #[serde(default)]
    pub locals: Vec<String>,
    pub connections_per_path: Option<usize>,
    /// As --replay-window (e.g. "256MiB").
    pub replay_window: Option<String>,
    /// Seconds, or "queue".
    pub no_path_timeout: Option<toml::Value>,
    pub timeout_floor: Option<f64>,
    pub timeout_ceiling: Option<f64>,
    /// As --slow-reply-min and --slow-reply-max (seconds).
    pub slow_reply_min: Option<f64>,
    pub slow_reply_max: Option<f64>,
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// iSCSI: as --chap-secret-file.
    pub chap_secret_file: Option<PathBuf>,
    /// iSCSI: as --initiator-name.
    pub initiator_name: Option<String>,
    /// iSCSI: as --persistent-reservations.
    pub persistent_reservations: Option<bool>,
}

impl AttachVolume {
    /// The same settings as the flags would give.
    pub fn multipath(&self) -> Result<MultipathArgs> {
        let policy = self
            .policy
            .as_deref()
            .map(|p| {
                <crate::cli::PolicyName as clap::ValueEnum>::from_str(p, false).map_err(|_| {
                    UsageError(format!(
                        "volume {:?}: policy {p:?}: valid policies are {}",
                        self.uri,
                        braid_policy::NAMES.join(", ")
                    ))
                })
            })
            .transpose()?;
        let mut paths = Vec::new();
        for p in &self.paths {
            paths.push(
                p.parse()
                    .map_err(|e: String| UsageError(format!("volume {:?}: {e}", self.uri)))?,
            );
        }
        let mut locals = Vec::new();
        for l in &self.locals {
            locals.push(
                l.parse()
                    .map_err(|e: String| UsageError(format!("volume {:?}: {e}", self.uri)))?,
            );
        }
        let no_path_timeout = match &self.no_path_timeout {
            None => "60".to_owned(),
            Some(toml::Value::String(s)) => s.clone(),
            Some(toml::Value::Integer(i)) => i.to_string(),
            Some(toml::Value::Float(f)) => f.to_string(),
            Some(other) => {
                return Err(UsageError(format!(
                    "volume {:?}: no_path_timeout must be seconds or \"queue\", not {other}",
                    self.uri
                ))
                .into())
            }
        };
        Ok(MultipathArgs {
            portals: self.portals.clone(),
            locals,
            tls_ca: self.tls_ca.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            paths,
            policy,
            connections_per_path: self.connections_per_path.unwrap_or(1),
            replay_window: self
                .replay_window
                .clone()
                .unwrap_or_else(|| "256MiB".into()),
            no_path_timeout,
            timeout_floor: self.timeout_floor.unwrap_or(0.5),
            timeout_ceiling: self.timeout_ceiling.unwrap_or(10.0),
            slow_reply_min: self.slow_reply_min.unwrap_or(30.0),
            slow_reply_max: self.slow_reply_max.unwrap_or(120.0),
            chap_secret_file: self.chap_secret_file.clone(),
            initiator_name: self.initiator_name.clone(),
            persistent_reservations: self.persistent_reservations.unwrap_or(false),
        })
    }
}

/// Reads and parses a TOML file; mistakes name the file and the key.
pub fn load<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the configuration {}", path.display()))?;
    toml::from_str(&text).map_err(|e| UsageError(format!("{}: {e}", path.display())).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_file_parses_and_converts() {
        let f: AttachFile = toml::from_str(
            r#"
            metrics = "127.0.0.1:9810"
            [[volume]]
            uri = "nbd://10.0.1.5/vol"
            policy = "round-robin"
            locals = ["eth1", "10.0.2.2"]
            no_path_timeout = "queue"
            [[volume]]
            uri = "nbd://10.0.1.5/other"
            no_path_timeout = 5
            "#,
        )
        .unwrap();
        assert_eq!(f.volumes.len(), 2);
        // `metrics` is the older name of `http`.
        assert_eq!(f.http.as_deref(), Some("127.0.0.1:9810"));
        let m = f.volumes[0].multipath().unwrap();
        assert_eq!(m.no_path_timeout, "queue");
        assert_eq!(m.locals.len(), 2);
        assert_eq!(f.volumes[1].multipath().unwrap().no_path_timeout, "5");
    }

    #[test]
    fn the_documented_examples_parse() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contrib");
        let serve: ServeFile =
            toml::from_str(&std::fs::read_to_string(format!("{dir}/serve.toml")).unwrap()).unwrap();
        assert_eq!(serve.exports.len(), 2);
        assert_eq!(serve.listen, ["eth1", "eth2"]);
        let attach: AttachFile =
            toml::from_str(&std::fs::read_to_string(format!("{dir}/attach.toml")).unwrap())
                .unwrap();
        let m = attach.volumes[0].multipath().unwrap();
        assert_eq!(m.locals.len(), 2);
        assert_eq!(m.no_path_timeout, "60");
    }

    /// Every flag of `braid serve` has its key, documented in
    /// contrib/serve.toml, and the example with every key set parses.
    #[test]
    fn every_serve_flag_has_a_documented_key() {
        use clap::CommandFactory;
        let example = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../contrib/serve.toml"
        ))
        .unwrap();
        // Uncommenting `# key = value` lines gives the file with every key.
        let every_key: String = example
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest) if rest.split_whitespace().nth(1) == Some("=") => rest,
                _ => l,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let file: ServeFile = toml::from_str(&every_key).unwrap();
        assert!(file.max_connections.is_some() && file.idle_timeout.is_some());
        assert!(file.create.is_some() && file.tls_client_ca.is_some());
        let keys: Vec<&str> = every_key
            .lines()
            .filter_map(|l| l.split_once(" = ").map(|(k, _)| k.trim()))
            .collect();
        let cli = crate::cli::Cli::command();
        let serve = cli.find_subcommand("serve").unwrap();
        for arg in serve.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let key = match long {
                "config" | "help" | "verbose" | "quiet" => continue,
                // Per export, inside [[export]].
                "volume-id" => "volume_id".to_owned(),
                "read-only-export" => "read_only".to_owned(),
                other => other.replace('-', "_"),
            };
            assert!(
                keys.contains(&key.as_str()),
                "--{long} has no key {key:?} in contrib/serve.toml"
            );
        }
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e =
            toml::from_str::<AttachFile>("[[volume]]\nuri = \"x\"\npolcy = \"a\"\n").unwrap_err();
        assert!(e.to_string().contains("polcy"), "{e}");
        let s: ServeFile = toml::from_str(
            "listen = [\"all\"]\n[[export]]\nname = \"vol\"\nsource = \"mem:1GiB\"\n",
        )
        .unwrap();
        assert_eq!(s.exports[0].source, "mem:1GiB");
    }
}

/// An iSCSI CHAP credentials file (`--iscsi-chap`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChapFile {
    pub user: String,
    pub secret: String,
    pub target_user: Option<String>,
    pub target_secret: Option<String>,
}

/// A CHAP secret's bytes, or why it cannot be one: 12 to 255 bytes (RFC
/// 7143 asks at least 96 bits of a secret shared with a remote peer; the
/// length is all that is checked, so a short one is refused with it).
pub fn check_secret(what: &str, s: &str) -> std::result::Result<Vec<u8>, String> {
    if (12..=255).contains(&s.len()) {
        Ok(s.as_bytes().to_vec())
    } else {
        Err(format!(
            "{what} is {} bytes; CHAP secrets must be 12 to 255 bytes (RFC 7143 asks at least \
             96 bits; Windows takes 12 to 16)",
            s.len()
        ))
    }
}

/// Reads a CHAP credentials file: secrets of 12 to 255 bytes (RFC 7143
/// asks at least 96 bits of a secret shared with a remote peer).
pub fn chap_credentials(path: &std::path::Path) -> Result<braid_iscsi::chap::Credentials> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the CHAP file {}", path.display()))?;
    let f: ChapFile =
        toml::from_str(&text).map_err(|e| usage(format!("{}: {e}", path.display())))?;
    let check = |what: &str, s: &str| {
        check_secret(what, s).map_err(|why| usage(format!("{}: {why}", path.display())))
    };
    let secret = check("secret", &f.secret)?;
    let mutual = match (f.target_user, f.target_secret) {
        (Some(u), Some(s)) => Some((u, check("target_secret", &s)?)),
        (None, None) => None,
        _ => {
            return Err(usage(format!(
                "{}: mutual CHAP needs both target_user and target_secret",
                path.display()
            )))
        }
    };
    if mutual.as_ref().is_some_and(|(_, s)| *s == secret) {
        return Err(usage(format!(
            "{}: target_secret must differ from secret (RFC 7143)",
            path.display()
        )));
    }
    if let Ok(meta) = std::fs::metadata(path) {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                "{} can be read by other users; chmod 600 it",
                path.display()
            );
        }
    }
    Ok(braid_iscsi::chap::Credentials {
        user: f.user,
        secret,
        mutual,
    })
}

fn usage(msg: String) -> anyhow::Error {
    UsageError(msg).into()
}

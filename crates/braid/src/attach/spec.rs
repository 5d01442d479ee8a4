//! What to attach: the volumes named on the command line and in the
//! configuration file, with their sockets, checked before anything opens.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;

use crate::cli::{AttachArgs, MultipathArgs, UsageError};
use crate::config::AttachFile;
use crate::control;

/// One volume to attach.
#[derive(Debug)]
pub(super) struct Spec {
    pub name: String,
    pub uri: String,
    pub multipath: MultipathArgs,
    pub socket: PathBuf,
    pub tcp: Option<SocketAddr>,
}

impl Spec {
    /// Everything it was given, to tell on a reload whether it changed.
    pub fn fingerprint(&self) -> String {
        format!("{self:?}")
    }
}

pub(super) fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// Where sockets go by default: `/run/braid` for root, else the runtime
/// directory.
fn socket_dir() -> PathBuf {
    control::dir()
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/braid"))
}

/// The local name of a volume nobody named: the NBD export's name, or
/// the last part of the iSCSI target's name (and its LUN unless 0), in
/// the characters an export name may hold.
fn default_name(uri: &braid_initiator::VolumeUri) -> String {
    match uri {
        braid_initiator::VolumeUri::Nbd(u) => u.export.clone(),
        braid_initiator::VolumeUri::Iscsi(u) => {
            let last = u.target.rsplit(':').next().unwrap_or(&u.target);
            let mut name: String = last
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                        c
                    } else {
                        '-'
                    }
                })
                .collect();
            if u.lun != 0 {
                name.push_str(&format!("-lun{}", u.lun));
            }
            name
        }
    }
}

/// The volumes the command line and the configuration file name, checked.
pub(super) fn specs(args: &AttachArgs, file: &AttachFile) -> Result<Vec<Spec>> {
    let mut out = Vec::new();
    if let Some(uri) = &args.uri {
        let parsed: braid_initiator::VolumeUri = uri.parse().map_err(usage)?;
        let name = args.name.clone().unwrap_or_else(|| default_name(&parsed));
        let name = if name.is_empty() {
            "default".into()
        } else {
            name
        };
        let tcp = args
            .tcp
            .as_deref()
            .map(|t| {
                t.parse()
                    .map_err(|_| usage(format!("--tcp {t:?}: expected ADDR:PORT")))
            })
            .transpose()?;
        out.push(Spec {
            socket: args
                .socket
                .clone()
                .unwrap_or_else(|| socket_dir().join(format!("{name}.sock"))),
            name,
            uri: uri.clone(),
            multipath: args.multipath.clone(),
            tcp,
        });
    }
    for v in &file.volumes {
        let parsed: braid_initiator::VolumeUri = v.uri.parse().map_err(usage)?;
        let name = v.name.clone().unwrap_or_else(|| default_name(&parsed));
        let tcp = v
            .tcp
            .as_deref()
            .map(|t| {
                t.parse()
                    .map_err(|_| usage(format!("tcp {t:?}: expected ADDR:PORT")))
            })
            .transpose()?;
        out.push(Spec {
            socket: v
                .socket
                .clone()
                .unwrap_or_else(|| socket_dir().join(format!("{name}.sock"))),
            name,
            uri: v.uri.clone(),
            multipath: v.multipath()?,
            tcp,
        });
    }
    if out.is_empty() {
        return Err(usage(
            "nothing to attach: give a URI (braid attach nbd://HOST/EXPORT, or \
             iscsi://HOST/IQN/LUN) or --config FILE",
        ));
    }
    let mut names = std::collections::HashSet::new();
    for s in &out {
        if !names.insert(s.name.clone()) {
            return Err(usage(format!(
                "two volumes are named {:?}; give one of them another name",
                s.name
            )));
        }
        braid_store::source::check_export_name(&s.name).map_err(|e| usage(e.0))?;
    }
    Ok(out)
}

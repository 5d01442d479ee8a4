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

/// The volumes the command line and the configuration file name, checked.
pub(super) fn specs(args: &AttachArgs, file: &AttachFile) -> Result<Vec<Spec>> {
    let mut out = Vec::new();
    if let Some(uri) = &args.uri {
        let parsed: braid_initiator::NbdUri = uri.parse().map_err(usage)?;
        let name = args.name.clone().unwrap_or_else(|| parsed.export.clone());
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
        let parsed: braid_initiator::NbdUri = v.uri.parse().map_err(usage)?;
        let name = v.name.clone().unwrap_or_else(|| parsed.export.clone());
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
            "nothing to attach: give a URI (braid attach nbd://HOST/EXPORT) or --config FILE",
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
        braid_target::source::check_export_name(&s.name).map_err(|e| usage(e.0))?;
    }
    Ok(out)
}

//! `braid serve --iscsi`: the iSCSI portals started beside NBD's (the
//! same addresses, another port), the CHAP credentials file, and the
//! operator's ALUA control (`braid alua`, through the control socket).

use anyhow::{Context, Result};
use braid_iscsi::scsi::AccessState;
use braid_target::iscsi::{IscsiHandle, IscsiServer};
use braid_target::portal::Portal;
use braid_target::Target;
use tracing::{info, warn};

use crate::cli::UsageError;
use crate::ctl;

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// Starts the iSCSI portals: every NBD portal's address (and device) at
/// `port`.
pub async fn start(
    target: &Target,
    portals: &[Portal],
    port: u16,
    chap: Option<braid_iscsi::chap::Credentials>,
) -> Result<(tokio::task::JoinHandle<()>, IscsiHandle)> {
    let portals: Vec<Portal> = portals
        .iter()
        .zip(target.local_addrs())
        .map(|(p, mut addr)| {
            addr.set_port(port);
            Portal {
                addr,
                device: p.device.clone(),
            }
        })
        .collect();
    if chap.is_none() {
        warn!(
            "iSCSI without CHAP: any client that can connect (within an export's --allow list) \
             may log in; --iscsi-chap FILE requires credentials"
        );
    }
    let cfg = braid_target::iscsi::IscsiConfig {
        chap,
        ..Default::default()
    };
    let server = IscsiServer::bind(&portals, &target.exports(), &cfg).await?;
    for p in server.handle().portals() {
        info!("iSCSI listening on {} (portal group {})", p.addr, p.tag);
    }
    for name in server.target_names() {
        info!("iSCSI target {name}");
    }
    let handle = server.handle();
    let stop = target.stop_handle().subscribe();
    Ok((tokio::spawn(server.run(stop)), handle))
}

/// The control socket's `alua` request.
pub fn set_alua(iscsi: Option<&IscsiHandle>, portal: &str, state: &str) -> ctl::Ack {
    let Some(iscsi) = iscsi else {
        return ctl::Ack::refused("this braid serve has no iSCSI portals (start it with --iscsi)");
    };
    let Some(state) = AccessState::from_name(state) else {
        let names: Vec<&str> = AccessState::ALL.iter().map(|s| s.name()).collect();
        return ctl::Ack::refused(format!(
            "no ALUA state {state:?}; the states are {}",
            names.join(", ")
        ));
    };
    match iscsi.set_access_state(portal, state) {
        Ok(()) => ctl::Ack::ok(),
        Err(e) => ctl::Ack::refused(e.to_string()),
    }
}

/// The iSCSI side as `braid status` shows it.
pub fn status(iscsi: &IscsiHandle) -> ctl::IscsiStatus {
    ctl::IscsiStatus {
        targets: iscsi.target_names(),
        portals: iscsi
            .portals()
            .into_iter()
            .map(|p| ctl::IscsiPortalStatus {
                portal: p.addr.to_string(),
                group: p.tag,
                state: p.state.name().to_owned(),
            })
            .collect(),
    }
}

/// Reads a CHAP credentials file: secrets of 12 to 255 bytes (RFC 7143
/// asks at least 96 bits of a secret shared with a remote peer).
pub fn chap_credentials(path: &std::path::Path) -> Result<braid_iscsi::chap::Credentials> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the CHAP file {}", path.display()))?;
    let f: crate::config::ChapFile =
        toml::from_str(&text).map_err(|e| usage(format!("{}: {e}", path.display())))?;
    let check = |what: &str, s: &str| {
        if (12..=255).contains(&s.len()) {
            Ok(s.as_bytes().to_vec())
        } else {
            Err(usage(format!(
                "{}: {what} is {} bytes; CHAP secrets must be 12 to 255 bytes",
                path.display(),
                s.len()
            )))
        }
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
            warn!(
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

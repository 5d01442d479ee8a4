//! `braid serve --iscsi`: the iSCSI portals started beside NBD's (the
//! same addresses, another port), the target name prefix, the operator's
//! ALUA control (`braid alua`, through the control socket) and the iSCSI
//! part of `braid status`.

use anyhow::Result;
use braid_iscsi::scsi::AccessState;
use braid_iscsi_target::{IscsiHandle, IscsiServer};
use braid_nbd_target::Target;
use braid_store::portal::Portal;
use tracing::{info, warn};

use crate::ctl;

/// Starts the iSCSI portals: every NBD portal's address (and device) at
/// `port`.
pub async fn start(
    target: &Target,
    portals: &[Portal],
    port: u16,
    cfg: braid_iscsi_target::IscsiConfig,
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
    let access = &cfg.access;
    if !access.any_chap() {
        warn!(
            "iSCSI without CHAP: any client that can connect (within an export's --allow list) \
             may log in; --iscsi-chap FILE requires credentials"
        );
    }
    if !access.initiators.is_empty() || access.others.is_none() {
        // Names and counts only: no secret is ever logged.
        info!(
            "iSCSI access list: {} initiators; initiators not listed {}; discovery {}",
            access.initiators.len(),
            match &access.others {
                None => "refused",
                Some(g) if g.chap.is_some() => "allowed with CHAP",
                Some(_) => "allowed without CHAP",
            },
            if access.discovery.is_some() {
                "with its own CHAP credential"
            } else {
                "without CHAP"
            }
        );
    }
    let server = IscsiServer::bind(&portals, &target.exports(), &cfg).await?;
    for p in server.handle().portals() {
        info!("iSCSI listening on {} (portal group {})", p.addr, p.tag);
    }
    for name in server.target_names() {
        info!("iSCSI target {name}");
        // braid's target takes its own names as they are (an export may
        // be called `db_1`), but initiators that check RFC 3722 refuse to
        // log in to such a target, so say so where the operator looks.
        if let Err(why) = braid_iscsi::names::check(&name) {
            warn!(
                "iSCSI target {name} {why}: initiators that check names (RFC 3722) may refuse \
                 it; name the export with lower-case letters, digits, '-', '.' and ':' only"
            );
        }
    }
    let handle = server.handle();
    let stop = target.stop_handle().subscribe();
    Ok((tokio::spawn(server.run(stop)), handle))
}

/// An IQN prefix from the command line or serve.toml, checked: target
/// names are it and the export's name, so it must be a valid IQN up to
/// the colon (RFC 3720 3.2.6.3.1: `iqn.YYYY-MM.reversed.domain`, lower
/// case). The colon is added when missing.
///
/// # Errors
///
/// What is wrong with it, and an example of the form.
pub fn iqn_prefix(given: &str) -> std::result::Result<String, String> {
    let example = "e.g. iqn.2024-05.com.example.storage";
    let p = given.strip_suffix(':').unwrap_or(given);
    let bad = |why: &str| format!("--iscsi-iqn {given:?}: {why} ({example})");
    let rest = p
        .strip_prefix("iqn.")
        .ok_or_else(|| bad("an IQN starts with \"iqn.\""))?;
    let date_ok = rest.len() > 8
        && rest.as_bytes()[..7].iter().enumerate().all(|(i, c)| {
            if i == 4 {
                *c == b'-'
            } else {
                c.is_ascii_digit()
            }
        })
        && rest.as_bytes()[7] == b'.';
    if !date_ok {
        return Err(bad("the naming authority's date comes first, as YYYY-MM."));
    }
    if let Some(c) = p
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | ':')))
    {
        return Err(bad(&format!(
            "{c:?} is not allowed (lower-case letters, digits, '.', '-' and ':')"
        )));
    }
    if p.len() > 200 {
        return Err(bad(
            "too long: names end at 223 bytes, and the export's name follows",
        ));
    }
    Ok(format!("{p}:"))
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

#[cfg(test)]
mod tests {
    use super::iqn_prefix;

    #[test]
    fn an_iqn_prefix_is_checked_and_ends_in_a_colon() {
        assert_eq!(
            iqn_prefix("iqn.2024-05.com.example.nas").as_deref(),
            Ok("iqn.2024-05.com.example.nas:")
        );
        assert_eq!(
            iqn_prefix("iqn.2024-05.com.example:nas:").as_deref(),
            Ok("iqn.2024-05.com.example:nas:")
        );
        for (bad, why) in [
            ("eui.02004567a425678d", "starts with"),
            ("iqn.24-05.com.example", "YYYY-MM"),
            ("iqn.2024-05", "YYYY-MM"),
            ("iqn.2024-05.com.Example", "'E' is not allowed"),
            ("iqn.2024-05.com example", "' ' is not allowed"),
        ] {
            let e = iqn_prefix(bad).unwrap_err();
            assert!(e.contains(why) && e.contains("e.g. iqn."), "{bad}: {e}");
        }
    }
}

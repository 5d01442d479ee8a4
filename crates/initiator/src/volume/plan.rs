//! Which paths an NBD volume would open: discovery from the first portal,
//! the local bindings resolved, and local sides paired with portals, as
//! [`super::Volume::open`] does before it connects anything. `braid doctor`
//! checks exactly these paths.

use super::admin::with_rules;
use super::{OpenError, VolumeConfig};
use crate::discover;
use crate::uri::{Endpoint, NbdUri, VolumeUri};

/// What a volume would open, before any path is connected: what the first
/// portal said, the paths (local side and portal of each, as discovery and
/// the flags pair them), and the TLS they use.
pub struct Plan {
    pub discovery: discover::Discovery,
    pub paths: Vec<discover::PathSpec>,
    pub tls: Option<crate::conn::TlsClient>,
}

/// Discovers the volume and pairs its paths exactly as [`super::Volume::open`]
/// does, without connecting them (`braid doctor` checks these paths).
///
/// # Errors
///
/// A usage mistake, or the first portal cannot be asked.
pub async fn plan(cfg: &VolumeConfig) -> Result<Plan, OpenError> {
    let VolumeUri::Nbd(uri) = &cfg.uri else {
        return Err(OpenError::Usage(format!(
            "{}: an iSCSI volume; its paths come from SendTargets",
            cfg.uri
        )));
    };
    plan_nbd(cfg, uri).await
}

/// [`plan`] of an NBD volume.
pub(super) async fn plan_nbd(cfg: &VolumeConfig, uri: &NbdUri) -> Result<Plan, OpenError> {
    let locals = discover::resolve_locals(&with_rules(cfg)).map_err(OpenError::Usage)?;
    let tls = match (&cfg.tls, uri.tls) {
        (Some(config), _) => {
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from(uri.host.clone())
                .map_err(|e| {
                    OpenError::Usage(format!("{:?} cannot be checked by TLS: {e}", uri.host))
                })?;
            Some(crate::conn::TlsClient {
                connector: tokio_rustls::TlsConnector::from(config.clone()),
                name,
            })
        }
        (None, true) => {
            return Err(OpenError::Usage(
                "nbds:// needs TLS settings: give --tls-ca (and --tls-cert/--tls-key if the \
                     server checks clients)"
                    .into(),
            ))
        }
        (None, false) => None,
    };
    // Ask from the first local binding that reaches the portal (an
    // allow-list may admit only the addresses paths are bound to).
    let first_local = match &uri.endpoint {
        Endpoint::Tcp(_) => discover::pair(&locals, std::slice::from_ref(&uri.endpoint))
            .into_iter()
            .next()
            .map(|p| p.local)
            .unwrap_or_default(),
        Endpoint::Unix(_) => Default::default(),
    };
    let d = discover::discover(
        &uri.endpoint,
        &first_local,
        &uri.export,
        cfg.connect_timeout,
        tls.as_ref(),
    )
    .await?;
    let mut portals: Vec<Endpoint> = match (&uri.endpoint, cfg.portals.is_empty()) {
        (Endpoint::Unix(_), _) => vec![uri.endpoint.clone()],
        (_, false) => cfg.portals.iter().copied().map(Endpoint::Tcp).collect(),
        (_, true) if !d.portals.is_empty() => {
            d.portals.iter().copied().map(Endpoint::Tcp).collect()
        }
        _ => vec![uri.endpoint.clone()],
    };
    // A portal named by a --path joins those in use; it never narrows
    // them (--portal does).
    if !matches!(uri.endpoint, Endpoint::Unix(_)) {
        for p in cfg.paths.iter().filter_map(|r| r.portal) {
            if !portals.contains(&Endpoint::Tcp(p)) {
                portals.push(Endpoint::Tcp(p));
            }
        }
    }
    let specs = if matches!(uri.endpoint, Endpoint::Unix(_)) {
        discover::pair(&[], &portals)
    } else {
        discover::pair(&locals, &portals)
    };
    Ok(Plan {
        discovery: d,
        paths: specs,
        tls,
    })
}

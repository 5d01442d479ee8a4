//! Opening an iSCSI volume: SendTargets for the target's portals, one
//! session that learns what the unit is (identity, size, limits, caching,
//! which fence it gets), and the volume's plan.

use std::collections::HashSet;
use std::sync::atomic::AtomicU16;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use braid_iscsi::chap::Credentials;
use braid_iscsi::initiator::cdb;
use braid_iscsi::initiator::session::Command;
use braid_iscsi::initiator::unit;
use braid_iscsi::negotiate::Params;
use braid_proto::TransmissionFlags;
use tracing::{info, warn};

use super::keys::Keys;
use super::{Expect, Iscsi};
use crate::conn::ConnectError;
use crate::discover::{self, PathSpec};
use crate::iscsi::fence::Fence;
use crate::iscsi::{self, IscsiUri, Opened, SessionConfig};
use crate::uri::Endpoint;
use crate::volume::admin::{path_configs, with_rules};
use crate::volume::open::{engine_config, policy, split_rules, start, Plan};
use crate::volume::{OpenError, Settings, Volume, VolumeConfig, VolumeInfo};

/// What braid asks of a target at login.
fn params() -> Params {
    Params {
        header_digest: true,
        data_digest: true,
        max_recv_data: 256 * 1024,
        max_burst: 1 << 20,
        first_burst: 256 * 1024,
        initial_r2t: false,
        immediate_data: true,
        max_outstanding_r2t: 8,
        // Nothing of a failed connection is kept for recovery: braid
        // recovers by sending elsewhere (ErrorRecoveryLevel 0).
        default_time2wait: 0,
        default_time2retain: 0,
        ..Params::default()
    }
}

/// The credentials to log in with: given, or from the URI.
fn credentials(cfg: &VolumeConfig, uri: &IscsiUri) -> Result<Option<Credentials>, OpenError> {
    if let Some(c) = &cfg.chap {
        if uri.user.as_ref().is_some_and(|u| *u != c.user) {
            return Err(OpenError::Usage(format!(
                "the URI names CHAP user {:?} but the secret file is for {:?}",
                uri.user.as_deref().unwrap_or_default(),
                c.user
            )));
        }
        return Ok(Some(c.clone()));
    }
    let Some(user) = &uri.user else {
        return Ok(None);
    };
    let Some(secret) = &uri.password else {
        return Err(OpenError::Usage(format!(
            "the URI names CHAP user {user:?} without a secret: give it with --chap-secret-file \
             (or in the URI as USER%SECRET)"
        )));
    };
    let mutual = match (&uri.target_user, &uri.target_password) {
        (Some(u), Some(p)) => Some((u.clone(), p.as_bytes().to_vec())),
        (None, None) => None,
        _ => {
            return Err(OpenError::Usage(
                "mutual CHAP needs both target_user and target_password".into(),
            ))
        }
    };
    Ok(Some(Credentials {
        user: user.clone(),
        secret: secret.as_bytes().to_vec(),
        mutual,
    }))
}

/// Opens an iSCSI volume.
pub(crate) async fn open(
    cfg: VolumeConfig,
    uri: IscsiUri,
    span: tracing::Span,
) -> Result<Volume, OpenError> {
    if cfg.connections_per_path.unwrap_or(1) > 1 {
        return Err(OpenError::Usage(
            "an iSCSI path is one session: --connections-per-path must be 1 (give more portals \
             or --local addresses for more paths)"
                .into(),
        ));
    }
    if cfg.tls.is_some() {
        return Err(OpenError::Usage(
            "iSCSI paths do not use TLS: drop --tls-ca".into(),
        ));
    }
    if cfg.persistent_reservations && cfg.danger_no_fence {
        return Err(OpenError::Usage(
            "--persistent-reservations fences failed paths; it cannot go with no fencing".into(),
        ));
    }
    let session = SessionConfig {
        initiator: cfg
            .initiator_name
            .clone()
            .unwrap_or_else(iscsi::default_initiator_name),
        target: uri.target.clone(),
        lun: uri.lun,
        chap: credentials(&cfg, &uri)?,
        params: params(),
        isid_random: rand::random(),
        next_qualifier: AtomicU16::new(1),
    };
    let locals = discover::resolve_locals(&with_rules(&cfg)).map_err(OpenError::Usage)?;
    let first = Endpoint::Tcp(uri.portal);
    let first_local = discover::pair(&locals, std::slice::from_ref(&first))
        .into_iter()
        .next()
        .map(|p| p.local)
        .unwrap_or_default();
    let mut portals: Vec<Endpoint> = if cfg.portals.is_empty() {
        found_portals(&uri, &first_local, &session, cfg.connect_timeout).await
    } else {
        cfg.portals.iter().copied().map(Endpoint::Tcp).collect()
    };
    for p in cfg.paths.iter().filter_map(|r| r.portal) {
        if !portals.contains(&Endpoint::Tcp(p)) {
            portals.push(Endpoint::Tcp(p));
        }
    }
    let specs = discover::pair(&locals, &portals);
    let configs = path_configs(&cfg.paths, &specs).map_err(OpenError::Usage)?;
    // One session tells what the unit is; the paths are opened afresh.
    let probe_spec = PathSpec {
        local: first_local,
        portal: first.clone(),
    };
    let o = iscsi::open::open(
        &probe_spec,
        &session,
        session.next_isid(),
        cfg.connect_timeout,
    )
    .await?;
    let described = describe(&o, cfg.connect_timeout).await;
    let fence = Fence::choose(&o.inquiry, cfg.persistent_reservations, cfg.danger_no_fence);
    let prepared = if cfg.persistent_reservations {
        prepare_reservations(&o, &session, cfg.connect_timeout).await
    } else {
        Ok(())
    };
    o.conn.logout(Duration::from_secs(1)).await;
    prepared?;
    if let Fence::Held { unit } = &fence {
        warn!(
            unit,
            "no fence is known for this target: writes of a failed path will be held and fail \
             with EIO at the no-path timeout (--persistent-reservations fences a target that \
             has PREEMPT AND ABORT)"
        );
    }
    let (limits, caching) = described;
    let capacity = o.capacity.ok_or_else(|| {
        ConnectError::Other(format!(
            "{}: the port asked first does not serve the unit ({}); name an active portal in the URI",
            uri.portal,
            o.access.name()
        ))
    })?;
    let bs = capacity.block_size;
    let max_payload = match u64::from(limits.max_transfer) * u64::from(bs) {
        0 => 32 << 20,
        n => n.clamp(u64::from(bs), 32 << 20) as u32,
    };
    let mut flags = TransmissionFlags::HAS_FLAGS
        | TransmissionFlags::SEND_FLUSH
        | TransmissionFlags::CAN_MULTI_CONN;
    if caching.is_some_and(|c| c.fua) {
        flags |= TransmissionFlags::SEND_FUA;
    }
    if caching.is_some_and(|c| c.read_only) {
        flags |= TransmissionFlags::READ_ONLY;
    }
    let preferred = bs.max(4096);
    let split = split_rules(&cfg, bs, preferred, max_payload);
    // A logical unit has one cache whichever port wrote to it (SBC-4):
    // SYNCHRONIZE CACHE on one session covers writes on every other, so
    // every policy may spread writes.
    let policy = policy(&cfg, true, specs.len() > 1)?;
    let identity_text = o.identity.as_ref().map(ToString::to_string);
    if o.identity.is_none() {
        warn!("the unit names itself neither in VPD 0x83 nor 0x80: paths are checked by size only");
    }
    let settings = Settings {
        connect_timeout: cfg.connect_timeout,
        fencing: !cfg.danger_no_fence,
        transport: Box::new(Iscsi(Arc::new(Expect {
            session,
            identity: o.identity.clone(),
            size: capacity.bytes(),
            block_size: bs,
            source: uri.portal.to_string(),
            ports: Mutex::new(vec![(None, None); specs.len()]),
            watching: Mutex::new(HashSet::new()),
            tags: Mutex::new(vec![None; specs.len()]),
            reservations: cfg.persistent_reservations,
            fence: fence.clone(),
            keys: Keys::default(),
        }))),
    };
    let plan = Plan {
        engine: engine_config(&cfg, split, capacity.bytes(), bs),
        specs,
        configs,
        policy,
        settings,
        instance: None,
        info: VolumeInfo {
            export: uri.target.clone(),
            size: capacity.bytes(),
            flags: TransmissionFlags(flags),
            min_block: bs,
            preferred_block: preferred,
            max_payload,
            identity: identity_text,
            paths: Vec::new(),
            connections_per_path: 1,
            fencing: !cfg.danger_no_fence,
            fence: fence.name(),
            block_status: false,
            transport: "iscsi",
        },
    };
    start(plan, span).await
}

/// Before any path registers: a target without PREEMPT AND ABORT is
/// refused (no fence could ever be confirmed), and keys an earlier volume
/// of this initiator left are removed.
async fn prepare_reservations(
    o: &Opened,
    session: &SessionConfig,
    timeout: Duration,
) -> Result<(), OpenError> {
    if let Err(answer) = iscsi::reserve::check_preempt(&o.conn, timeout).await {
        let without = Fence::choose(&o.inquiry, false, false);
        let instead = match &without {
            Fence::Held { .. } => String::new(),
            f => format!(" (without it, braid fences this target by {})", f.name()),
        };
        return Err(OpenError::Usage(format!(
            "the target ({} {}) does not implement PERSISTENT RESERVE OUT with PREEMPT AND \
             ABORT (it answered {answer}), so --persistent-reservations could never confirm a \
             fence there: leave out --persistent-reservations{instead}",
            o.inquiry.vendor, o.inquiry.product
        )));
    }
    match iscsi::reserve::remove_stale(&o.conn, &session.initiator, timeout).await {
        Ok(Some(0)) => {}
        Ok(Some(n)) => info!(
            keys = n,
            initiator = session.initiator,
            "removed reservation keys an earlier volume of this initiator left registered"
        ),
        Ok(None) => warn!(
            "the target has no READ FULL STATUS: keys an earlier volume of this initiator may \
             have left stay registered (braid cannot tell them from other hosts' keys)"
        ),
        Err(e) => warn!("removing keys an earlier volume of this initiator left failed: {e}"),
    }
    Ok(())
}

/// Every reachable portal of the target, the URI's first; what discovery
/// left out is logged.
async fn found_portals(
    uri: &IscsiUri,
    local: &crate::conn::Local,
    session: &SessionConfig,
    timeout: Duration,
) -> Vec<Endpoint> {
    match iscsi::discover::portals(uri.portal, local, session, timeout).await {
        Ok(p) => {
            if p.unlisted {
                warn!(target = %uri.target, "SendTargets does not list the target: using {} only", uri.portal);
            }
            for (addr, why) in &p.left_out {
                info!("portal {addr} from SendTargets left out: {why}");
            }
            p.reachable.into_iter().map(Endpoint::Tcp).collect()
        }
        Err(e) => {
            warn!(
                "SendTargets at {} failed ({}): using that portal only",
                uri.portal,
                crate::conn::chain(&e)
            );
            vec![Endpoint::Tcp(uri.portal)]
        }
    }
}

/// The unit's limits and caching, which not every target answers.
async fn describe(o: &Opened, timeout: Duration) -> (unit::BlockLimits, Option<unit::Caching>) {
    let lun = o.conn.lun();
    let call = |c: [u8; 16], read: u32| {
        o.conn.call(
            Command {
                lun,
                cdb: c,
                read,
                write: None,
            },
            timeout,
        )
    };
    let limits = match call(cdb::inquiry(Some(0xb0), 64), 64).await {
        Ok(a) if a.outcome.is_good() => unit::block_limits(&a.data).unwrap_or_default(),
        _ => Default::default(),
    };
    let caching = match call(cdb::mode_sense_caching(64), 64).await {
        Ok(a) if a.outcome.is_good() => unit::caching(&a.data).ok(),
        _ => None,
    };
    (limits, caching)
}

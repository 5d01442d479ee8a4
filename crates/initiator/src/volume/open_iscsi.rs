//! An iSCSI volume: the URI's portal is asked for every portal of the
//! target (SendTargets), one session learns what the unit is, and every
//! path is an iSCSI session checked to lead to the same unit (VPD 0x83
//! identity and size). How a failed path is fenced depends on the unit
//! (see `iscsi::fence`): by logging in with its session's ISID (with
//! tgt, then LOGICAL UNIT RESET, whose unit attention the volume's own
//! sessions take as the fence's), or (`--persistent-reservations`) by
//! preempting its key, or not at all (its writes are held). A unit
//! attention for a reset stands in for NBD's instance and triggers the
//! replay; ALUA states (`alua.rs`) feed the engine.

use std::collections::HashSet;
use std::sync::atomic::AtomicU16;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use braid_iscsi::chap::Credentials;
use braid_iscsi::initiator::cdb;
use braid_iscsi::initiator::login::Isid;
use braid_iscsi::initiator::sense::Attention;
use braid_iscsi::initiator::session::Command;
use braid_iscsi::initiator::unit::{self, AccessState, Identity};
use braid_iscsi::negotiate::Params;
use braid_proto::braid_ns::ConnId;
use braid_proto::{Cookie, Errno, TransmissionFlags};
use bytes::Bytes;
use tracing::{info, warn};

use super::admin::{path_configs, with_rules};
use super::alua::{access, heard, watch};
use super::core::{finish, place, ConnSink, Shared};
use super::keys::Keys;
use super::link::Link;
use super::open::{engine_config, policy, split_rules, start, Plan};
use super::{OpenError, Settings, Transport, Volume, VolumeConfig, VolumeInfo};
use crate::conn::ConnectError;
use crate::discover::{self, PathSpec};
use crate::engine::{Access, Instance, PathId};
use crate::iscsi::fence::Fence;
use crate::iscsi::{self, IscsiUri, Opened, SessionConfig};
use crate::uri::Endpoint;

/// What every session of an iSCSI volume must agree on.
pub(crate) struct Expect {
    pub session: SessionConfig,
    pub identity: Option<Identity>,
    pub size: u64,
    pub block_size: u32,
    /// The portal the expectation came from, for messages.
    pub source: String,
    /// Each path's relative port and port group, for ALUA.
    pub ports: Mutex<Vec<(Option<u16>, Option<u16>)>>,
    /// Paths whose ALUA state is being watched.
    pub watching: Mutex<HashSet<usize>>,
    /// Each path's iSCSI portal group tag, from its last login: a session
    /// is reinstated only through a portal of its own group.
    pub tags: Mutex<Vec<Option<u16>>>,
    /// Failed paths are fenced by persistent reservation.
    pub reservations: bool,
    /// How failed paths are fenced (the reservation fence iff
    /// `reservations`).
    pub fence: Fence,
    /// Sessions owed the unit attention of a LOGICAL UNIT RESET this
    /// volume's own fence sent (tgt): the first reset each hears is that
    /// one, which lost nothing, not a restart.
    pub own_resets: Mutex<HashSet<Isid>>,
    /// The keys this volume's sessions registered and have not withdrawn
    /// or preempted: a path that failed without writes to fence leaves
    /// its key behind, and closing the volume preempts those.
    pub keys: Keys,
}

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
pub(super) async fn open(
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
        connections_per_path: 1,
        connect_timeout: cfg.connect_timeout,
        probe_len: bs,
        max_payload,
        fencing: !cfg.danger_no_fence,
        transport: Transport::Iscsi(Box::new(Expect {
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
            own_resets: Mutex::new(HashSet::new()),
            keys: Keys::default(),
        })),
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

/// Opens a session on `spec` and checks it leads to the volume's unit.
///
/// # Errors
///
/// As [`iscsi::open::open`], or [`ConnectError::NotSameVolume`] with both
/// identities.
pub(super) async fn dial(
    x: &Expect,
    spec: &PathSpec,
    timeout: Duration,
) -> Result<Opened, ConnectError> {
    let o = iscsi::open::open(spec, &x.session, x.session.next_isid(), timeout).await?;
    let describe = |id: &Option<Identity>, size: Option<u64>| {
        let id = id
            .as_ref()
            .map_or("a unit without identity".to_owned(), |i| format!("LUN {i}"));
        match size {
            Some(s) => format!("{id} of {s} bytes"),
            None => id,
        }
    };
    let size = o.capacity.map(|c| c.bytes());
    let other_unit = x.identity.is_some() && o.identity != x.identity;
    let other_size = size.is_some_and(|s| s != x.size)
        || o.capacity.is_some_and(|c| c.block_size != x.block_size);
    if other_unit || other_size {
        o.conn.logout(Duration::from_secs(1)).await;
        return Err(ConnectError::NotSameVolume {
            portal: spec.portal.to_string(),
            found: describe(&o.identity, size),
            first: x.source.clone(),
            expected: describe(&x.identity, Some(x.size)),
        });
    }
    if x.reservations {
        // Registered before it carries a write, so that a fence can
        // preempt it.
        let key = iscsi::reserve::key(o.conn.logged_in.isid);
        if !x.keys.admit(key) {
            o.conn.logout(Duration::from_secs(1)).await;
            return Err(closed_while_dialing(spec));
        }
        let joined = iscsi::reserve::join(&o.conn, timeout).await;
        if x.keys.closed() {
            // The volume withdrew its keys while this one was being
            // registered: it may have landed after the sweep.
            if iscsi::reserve::leave(&o.conn, timeout).await.is_ok() {
                x.keys.forget([key]);
            }
            o.conn.logout(Duration::from_secs(1)).await;
            return Err(closed_while_dialing(spec));
        }
        if let Err(e) = joined {
            // The key stays recorded: the target may have registered it.
            o.conn.logout(Duration::from_secs(1)).await;
            return Err(ConnectError::Other(format!("{}: {e}", spec.portal)));
        }
    }
    Ok(o)
}

fn closed_while_dialing(spec: &PathSpec) -> ConnectError {
    ConnectError::Other(format!(
        "{}: the volume closed while the path was connecting",
        spec.portal
    ))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Keys of sessions a fence preempted are no longer the volume's.
pub(super) fn fenced(x: &Expect, conns: &[ConnId]) {
    x.keys
        .forget(conns.iter().map(|c| iscsi::reserve::key(isid_of(*c))));
}

/// As the volume closes: the first live session preempts the keys left
/// by failed sessions, then every live session withdraws its own, so the
/// reservation ends (bounded; with no live session the keys stay until an
/// administrator clears them).
pub(super) async fn leave_all(x: &Expect, conns: Vec<Arc<iscsi::Conn>>) {
    let t = Duration::from_secs(2);
    let live: Vec<u64> = conns
        .iter()
        .map(|c| iscsi::reserve::key(c.logged_in.isid))
        .collect();
    let mut stale = x.keys.close();
    stale.retain(|k| !live.contains(k));
    if let Some(first) = conns.first() {
        if let Err(e) = iscsi::reserve::preempt(first, &stale, t, t).await {
            warn!("preempting the keys of failed sessions failed: {e}");
        }
    } else if !stale.is_empty() {
        warn!(
            keys = stale.len(),
            "no live path to withdraw the volume's reservation keys: the unit stays reserved"
        );
    }
    for c in &conns {
        match iscsi::reserve::leave(c, t).await {
            Ok(()) => {
                x.keys.forget([iscsi::reserve::key(c.logged_in.isid)]);
            }
            Err(e) => warn!("withdrawing a path's reservation key failed: {e}"),
        }
    }
}

/// The engine's id of a session: its ISID, which is what fences it.
pub(super) fn conn_id(isid: Isid) -> ConnId {
    let mut b = [0u8; 16];
    b[10..].copy_from_slice(&isid.0);
    ConnId(u128::from_be_bytes(b))
}

/// The ISID a session's id names.
pub(super) fn isid_of(id: ConnId) -> Isid {
    let b = id.0.to_be_bytes();
    let mut isid = [0u8; 6];
    isid.copy_from_slice(&b[10..]);
    Isid(isid)
}

/// Hands a path's new session to the engine. A reset the session saw
/// (after the volume opened) means the target may have lost unflushed
/// writes: they are written again first.
pub(super) fn adopt(shared: &Arc<Shared>, path: PathId, o: Opened, opening: bool) {
    let Transport::Iscsi(x) = &shared.settings.transport else {
        unreachable!("iSCSI sessions only on iSCSI volumes")
    };
    let mut core = shared.lock();
    if shared.closed() {
        return;
    }
    let now = shared.now();
    // A session's first command is told of a power on the first time its
    // initiator port meets the target after a start: at open that says
    // only that the target tells of restarts; later, that it may have
    // restarted (the engine decides whether this is a restart it knows).
    let instance = match o.instance {
        // braid's target names its process: the engine compares names.
        Some(id) => Instance::Known(id),
        None if !o.reset_seen => Instance::Unknown,
        None if opening => {
            core.engine.restarts_told();
            Instance::Unknown
        }
        None => Instance::ResetSeen,
    };
    let generation = core.paths[path.0].generation + 1;
    let id = conn_id(o.conn.logged_in.isid);
    let conn = Arc::new(o.conn);
    conn.attach(Arc::new(ConnSink {
        shared: Arc::downgrade(shared),
        path,
        generation,
        allocation: None,
    }));
    if let Some(slot) = x
        .ports
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_mut(path.0)
    {
        *slot = (o.relative_port, o.port_group);
    }
    if let Some(slot) = lock(&x.tags).get_mut(path.0) {
        *slot = conn.logged_in.portal_group_tag;
    }
    let p = &mut core.paths[path.0];
    p.generation = generation;
    p.conns = vec![Some(Link::Iscsi(conn))];
    p.allocation = vec![None];
    core.engine
        .path_up_with(now, path, vec![Some(id)], shared.settings.fencing, instance);
    let state = access(o.access);
    core.engine.set_access(now, path, state);
    core.act(shared);
    drop(core);
    if state != Access::Optimized && state != Access::NonOptimized {
        watch(shared, path);
    }
}

/// Notes that every live session of the volume is owed the unit
/// attention of the LOGICAL UNIT RESET its fence is about to send.
pub(super) fn expect_own_reset(shared: &Arc<Shared>) {
    let Transport::Iscsi(x) = &shared.settings.transport else {
        return;
    };
    let core = shared.lock();
    let live = core
        .paths
        .iter()
        .flat_map(|p| &p.conns)
        .filter_map(|c| match c {
            Some(Link::Iscsi(c)) => Some(c.logged_in.isid),
            _ => None,
        });
    lock(&x.own_resets).extend(live);
}

/// Whether the reset `path`'s session heard is the one this volume's
/// fence sent (each session is owed one).
fn own_reset(shared: &Shared, core: &super::core::Core, path: PathId) -> bool {
    let Transport::Iscsi(x) = &shared.settings.transport else {
        return false;
    };
    let Some(Some(Link::Iscsi(c))) = core.paths[path.0].conns.first() else {
        return false;
    };
    let own = lock(&x.own_resets).remove(&c.logged_in.isid);
    if own {
        info!("the unit was reset by this volume's own fence (29h): nothing to replay");
    }
    own
}

impl iscsi::Replies for ConnSink {
    fn data(&self, cookie: Cookie, offset: u64, data: Bytes) {
        self.with_core(|_, core| place(core, cookie, Some(offset), data));
    }

    fn done(&self, cookie: Cookie, error: Option<(Errno, String)>) {
        self.with_core(|shared, core| finish(shared, core, cookie, error));
    }

    fn elsewhere(&self, cookie: Cookie, state: AccessState) {
        let shared = self.with_core(|shared, core| {
            let now = shared.now();
            core.engine.set_access(now, self.path, access(state));
            core.engine.retry_elsewhere(now, cookie);
            core.act(shared);
            shared.clone()
        });
        if let Some(shared) = shared {
            watch(&shared, self.path);
        }
    }

    fn attention(&self, attention: Attention) {
        // From the path's current session only.
        let shared = self.with_core(|shared, core| {
            let own = attention == Attention::Reset && own_reset(shared, core, self.path);
            (!own).then(|| shared.clone())
        });
        if let Some(shared) = shared.flatten() {
            heard(&shared, self.path, attention);
        }
    }

    fn lost(&self, reason: String) {
        crate::conn::Sink::lost(self, reason);
    }
}

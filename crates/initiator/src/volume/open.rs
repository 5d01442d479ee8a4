//! Opening a volume: what each transport finds out first (NBD here,
//! iSCSI in `open_iscsi.rs`) becomes a [`Plan`]; [`start`] turns any plan
//! into a running volume the same way: the engine and its paths, every
//! path opened at once, failed ones retried in the background.

use std::time::{Duration, Instant};

use braid_policy::{by_name, Policy, SplitRules};
use tracing::{info, warn, Instrument};

use super::admin::path_configs;
use super::core::{Core, PathIo, Shared, Tasks};
use super::{recover, OpenError, Settings, Transport, Volume, VolumeConfig, VolumeInfo};
use crate::conn::ConnectError;
use crate::discover::{Expect, PathSpec};
use crate::engine::{Engine, EngineConfig, PathConfig, PathId};
use crate::uri::NbdUri;

/// What a transport found out, ready to become a volume.
pub(super) struct Plan {
    pub specs: Vec<PathSpec>,
    pub configs: Vec<PathConfig>,
    pub policy: Box<dyn Policy>,
    pub engine: EngineConfig,
    pub settings: Settings,
    /// The target's instance, where discovery learnt it.
    pub instance: Option<u128>,
    /// `paths` and `block_status` are filled in by [`start`].
    pub info: VolumeInfo,
}

/// The engine's split rules for a target's block sizes and payload limit.
pub(super) fn split_rules(
    cfg: &VolumeConfig,
    min: u32,
    preferred: u32,
    max_payload: u32,
) -> SplitRules {
    let align = u64::from(preferred.max(min).max(1));
    let max = u64::from(max_payload).clamp(align, 32 << 20);
    SplitRules {
        align,
        chunk: cfg.chunk.unwrap_or(256 * 1024).max(align),
        max: max / align * align,
    }
}

/// The engine's settings for a volume of `size` bytes.
pub(super) fn engine_config(
    cfg: &VolumeConfig,
    split: SplitRules,
    size: u64,
    min_block: u32,
) -> EngineConfig {
    EngineConfig {
        split,
        size,
        min_block,
        timeout_floor: cfg.timeout_floor,
        timeout_ceiling: cfg.timeout_ceiling.max(cfg.timeout_floor),
        no_path_timeout: cfg.no_path_timeout,
        slow_reply_min: cfg.slow_reply_min,
        slow_reply_max: cfg.slow_reply_max.max(cfg.slow_reply_min),
        replay_window: cfg.replay_window,
        ..EngineConfig::default()
    }
}

/// Starts the engine, opens every path at once, and hands back the
/// volume; paths that did not open are retried in the background.
///
/// # Errors
///
/// No path opened, or one leads to another volume.
pub(super) async fn start(plan: Plan, span: tracing::Span) -> Result<Volume, OpenError> {
    let Plan {
        specs,
        configs,
        policy,
        engine,
        settings,
        instance,
        mut info,
    } = plan;
    let epoch = Instant::now();
    let mut engine = Engine::new(engine, policy);
    if let Some(id) = instance {
        engine.instance_seen(Duration::ZERO, id);
    }
    let mut paths = Vec::new();
    for (i, (spec, config)) in specs.iter().zip(configs).enumerate() {
        engine.add_path(config, Duration::ZERO);
        paths.push(PathIo {
            span: tracing::info_span!(parent: &span, "path", n = i + 1, via = %spec),
            spec: spec.clone(),
            conns: Vec::new(),
            allocation: Vec::new(),
            generation: 0,
            reconnecting: false,
        });
    }
    let shared = std::sync::Arc::new(Shared {
        tasks: Tasks {
            fence: |shared, path, fence, conns| {
                Box::pin(recover::fence(shared, path, fence, conns))
            },
            reconnect: |shared, path, after| Box::pin(recover::reconnect(shared, path, after)),
        },
        core: std::sync::Mutex::new(Core {
            engine,
            reqs: Default::default(),
            paths,
            received: Default::default(),
            warned_no_fencing: false,
            span: span.clone(),
            timeline: Default::default(),
        }),
        epoch,
        settings,
        closed: Default::default(),
    });
    let opened = super::futures_join(specs.iter().enumerate().map(|(i, spec)| {
        let shared = shared.clone();
        let spec = spec.clone();
        let timeout = shared.settings.connect_timeout;
        async move { recover::open_conns(&shared, PathId(i), &spec, timeout).await }
    }))
    .await;
    let failures: Vec<(usize, ConnectError)> = opened
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| r.err().map(|e| (i, e)))
        .collect();
    if failures.len() == specs.len() {
        return Err(OpenError::NoPath(
            failures
                .iter()
                .map(|(i, e)| format!("path {} ({}): {}", i + 1, specs[*i], crate::conn::chain(e)))
                .collect(),
        ));
    }
    for (i, e) in &failures {
        if matches!(e, ConnectError::NotSameVolume { .. }) {
            return Err(OpenError::Usage(e.to_string()));
        }
        let mut core = shared.lock();
        let span = core.paths[*i].span.clone();
        span.in_scope(|| {
            warn!(
                "did not open: {}; retrying in the background",
                crate::conn::chain(e)
            )
        });
        core.engine.reconnect_failed(PathId(*i));
        core.act(&shared);
    }
    info.block_status = shared
        .lock()
        .paths
        .iter()
        .any(|p| p.allocation.iter().any(Option::is_some));
    info.paths = specs.iter().map(ToString::to_string).collect();
    let ticker = tokio::spawn(super::tick(std::sync::Arc::downgrade(&shared)).instrument(span));
    Ok(Volume {
        shared,
        info,
        ticker: std::sync::Mutex::new(Some(ticker)),
    })
}

/// The policy asked for, or the default; a policy that spreads writes is
/// refused where the target's flushes would not cover every connection.
pub(super) fn policy(
    cfg: &VolumeConfig,
    multi_conn: bool,
    spreading: bool,
) -> Result<Box<dyn Policy>, OpenError> {
    let name = match (&cfg.policy, multi_conn) {
        (Some(p), _) if p == "failover" => p.clone(),
        (Some(p), false) if spreading => {
            return Err(OpenError::Usage(format!(
                "policy {p:?} spreads one volume over several connections, but the server does \
                 not offer CAN_MULTI_CONN (its connections may not share a cache, so a flush on \
                 one would not cover writes on another); use --policy failover with this server"
            )))
        }
        (Some(p), _) => p.clone(),
        (None, false) if spreading => {
            warn!(
                "the server does not offer CAN_MULTI_CONN: using policy failover (one \
                 connection at a time) so flushes stay correct"
            );
            "failover".to_owned()
        }
        (None, _) => "adaptive".to_owned(),
    };
    by_name(&name, &cfg.policy_options).map_err(|e| OpenError::Usage(e.to_string()))
}

/// An NBD volume: the first portal says what the volume is and where else
/// it is served; every path is an NBD connection set.
pub(super) async fn nbd(
    cfg: VolumeConfig,
    uri: NbdUri,
    span: tracing::Span,
) -> Result<Volume, OpenError> {
    let super::Plan {
        discovery: d,
        paths: specs,
        tls,
    } = super::plan::plan_nbd(&cfg, &uri).await?;
    let configs = path_configs(&cfg.paths, &specs).map_err(OpenError::Usage)?;
    let multi = d.export.flags.can_multi_conn();
    let spreading = specs.len() > 1 || cfg.connections_per_path.unwrap_or(1) > 1;
    let policy = policy(&cfg, multi, spreading)?;
    let connections_per_path = if multi {
        cfg.connections_per_path.unwrap_or(1).max(1)
    } else {
        1
    };
    let export = d.export.clone();
    let split = split_rules(
        &cfg,
        export.min_block,
        export.preferred_block,
        export.max_payload,
    );
    let settings = Settings {
        connections_per_path,
        connect_timeout: cfg.connect_timeout,
        probe_len: export.min_block.max(1).min(export.size.min(4096) as u32),
        max_payload: export.max_payload,
        fencing: d.braid && !cfg.danger_no_fence,
        transport: Transport::Nbd(Expect {
            export: uri.export.clone(),
            tls,
            size: export.size,
            identity: d.identity.clone(),
            source: uri.endpoint.to_string(),
            // Fresh for each open: a fence by this volume can name
            // only connections this volume opened.
            session: braid_proto::braid_ns::SessionToken(uuid::Uuid::new_v4().as_u128()),
        }),
    };
    let plan = Plan {
        engine: engine_config(&cfg, split, export.size, export.min_block),
        specs,
        configs,
        policy,
        settings,
        instance: d.instance.map(|i| i.0),
        info: VolumeInfo {
            export: uri.export.clone(),
            size: export.size,
            flags: export.flags,
            min_block: export.min_block,
            preferred_block: export.preferred_block,
            max_payload: export.max_payload,
            identity: d.identity,
            paths: Vec::new(),
            connections_per_path,
            fencing: d.braid,
            fence: if d.braid && !cfg.danger_no_fence {
                "x-braid:fence"
            } else {
                "none"
            },
            block_status: false,
            transport: "nbd",
        },
    };
    let many = plan.specs.len() > 1;
    let vol = start(plan, span).await?;
    if !d.braid && many {
        info!("the server is not braid: no fencing, and identity is checked by size only");
    }
    Ok(vol)
}

//! Opening a volume: what each transport finds out first (`nbd.rs`,
//! `iscsi/open.rs`) becomes a [`Plan`]; [`start`] turns any plan into a
//! running volume the same way: the engine and its paths, every path
//! opened at once, failed ones retried in the background.

use std::time::{Duration, Instant};

use braid_policy::{by_name, Policy, SplitRules};
use tracing::{warn, Instrument};

use super::core::{Core, PathIo, Shared, Tasks};
use super::{recover, OpenError, Settings, Volume, VolumeConfig, VolumeInfo};
use crate::conn::ConnectError;
use crate::discover::PathSpec;
use crate::engine::{Engine, EngineConfig, PathConfig, PathId};

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
        if e.other_volume() {
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

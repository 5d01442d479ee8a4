//! `braid serve`: flags checked into a configuration, exports opened, the
//! target run in the foreground until SIGINT or SIGTERM.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use braid_target::backend::{Backend, FileBackend, MemBackend};
use braid_target::identity::{default_state_dir, IdentityStore};
use braid_target::portal::{self, ListenSpec, DEFAULT_PORT};
use braid_target::source::{format_size, parse_size, ExportSpec, Source};
use braid_target::{Export, Exports, Limits, Target};
use tracing::{info, warn};
use uuid::Uuid;

use crate::cli::{ServeArgs, UsageError};

/// `braid serve`, checked.
struct ServeConfig {
    listen: Vec<ListenSpec>,
    default_listen: bool,
    read_only: bool,
    create: Option<u64>,
    volume_ids: HashMap<String, Uuid>,
    state_dir: std::path::PathBuf,
    exports: Vec<ExportSpec>,
}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

impl ServeConfig {
    fn from_args(args: ServeArgs) -> Result<Self> {
        let mut seen = std::collections::HashSet::new();
        for e in &args.exports {
            if !seen.insert(e.name.clone()) {
                return Err(usage(format!("export name {:?} is given twice", e.name)));
            }
        }
        let mut volume_ids = HashMap::new();
        for v in &args.volume_ids {
            let (name, id) = v
                .split_once('=')
                .ok_or_else(|| usage(format!("--volume-id {v:?}: write NAME=UUID")))?;
            if !seen.contains(name) {
                return Err(usage(format!(
                    "--volume-id {v:?}: there is no export named {name:?}"
                )));
            }
            let id = Uuid::parse_str(id)
                .map_err(|e| usage(format!("--volume-id {v:?}: {id:?} is not a UUID ({e})")))?;
            volume_ids.insert(name.to_owned(), id);
        }
        let create = args
            .create
            .as_deref()
            .map(|s| parse_size(s).map_err(|e| usage(format!("--create {s:?}: {e}"))))
            .transpose()?;
        let default_listen = args.listen.is_empty();
        let listen = if default_listen {
            vec![ListenSpec::Addr(
                (std::net::Ipv4Addr::LOCALHOST, DEFAULT_PORT).into(),
            )]
        } else {
            args.listen
        };
        Ok(Self {
            listen,
            default_listen,
            read_only: args.read_only,
            create,
            volume_ids,
            state_dir: args.state_dir.unwrap_or_else(default_state_dir),
            exports: args.exports,
        })
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    let cfg = ServeConfig::from_args(args)?;
    let portals = portal::resolve(&cfg.listen).map_err(usage)?;
    let exports = open_exports(&cfg)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let target = Target::bind(exports, &portals, Limits::default())?;
        for (p, addr) in portals.iter().zip(target.local_addrs()) {
            match &p.device {
                Some(dev) => info!("portal {addr} (bound to {dev})"),
                None => info!("portal {addr}"),
            }
        }
        for e in target.exports().iter() {
            info!(
                "export {:?}: {} {}{}, volume {}",
                e.name,
                e.description,
                format_size(e.backend.size()),
                if e.read_only { ", read-only" } else { "" },
                e.volume
            );
        }
        if cfg.default_listen {
            info!(
                "serving on loopback only; to serve on this host's network addresses add \
                 --listen all, or --listen IFACE for each NIC"
            );
        }
        let stop = target.stop_handle();
        tokio::spawn(async move {
            wait_for_signal().await;
            stop.stop();
        });
        target.run().await.context("flushing exports at exit")?;
        info!("stopped");
        anyhow::Ok(())
    })
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        warn!("cannot install signal handlers; stop braid with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => info!("SIGINT: stopping"),
        _ = term.recv() => info!("SIGTERM: stopping"),
    }
}

fn open_exports(cfg: &ServeConfig) -> Result<Exports> {
    let mut store: Option<IdentityStore> = None;
    let mut list = Vec::new();
    for spec in &cfg.exports {
        let (backend, description): (Arc<dyn Backend>, String) = match &spec.source {
            Source::Mem(size) => (Arc::new(MemBackend::new(*size)), "memory".into()),
            Source::File(path) => {
                create_if_missing(path, cfg.create)?;
                let b = FileBackend::open(path, cfg.read_only)
                    .with_context(|| format!("export {:?}", spec.name))?;
                (Arc::new(b), path.display().to_string())
            }
        };
        let volume = match (&spec.source, cfg.volume_ids.get(&spec.name)) {
            (Source::Mem(_), Some(id)) => *id,
            (Source::Mem(_), None) => Uuid::new_v4(),
            (Source::File(path), explicit) => {
                identity(&mut store, &cfg.state_dir, path, explicit.copied())?
            }
        };
        list.push(Arc::new(Export {
            name: spec.name.clone(),
            description,
            backend,
            read_only: cfg.read_only,
            volume,
        }));
    }
    Ok(Exports::new(list))
}

fn identity(
    store: &mut Option<IdentityStore>,
    dir: &Path,
    path: &Path,
    explicit: Option<Uuid>,
) -> Result<Uuid> {
    if store.is_none() {
        *store = Some(
            IdentityStore::open(dir)
                .with_context(|| format!("reading volume identities in {}", dir.display()))?,
        );
    }
    let store = store.as_mut().expect("opened above");
    let result = match explicit {
        Some(id) => store.set(path, id).map(|()| id),
        None => store.identity(path),
    };
    result.with_context(|| {
        format!(
            "saving the volume identity of {} in {} (choose a writable --state-dir)",
            path.display(),
            store.path().display()
        )
    })
}

fn create_if_missing(path: &Path, size: Option<u64>) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    let Some(size) = size else {
        bail!(
            "{} does not exist; create it, or pass --create SIZE to make a sparse file",
            path.display()
        );
    };
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.set_len(size)
        .with_context(|| format!("sizing {} to {}", path.display(), format_size(size)))?;
    info!("created {} ({}, sparse)", path.display(), format_size(size));
    Ok(())
}

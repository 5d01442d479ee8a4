//! The exports `braid serve` was given, opened: files and devices (made
//! when `--create` says so), memory, Ceph images, each with its volume
//! identity.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use braid_target::backend::{Backend, FileBackend};
use braid_target::identity::IdentityStore;
use braid_target::source::{format_size, Source};
use braid_target::{Export, Exports};
use tracing::info;
use uuid::Uuid;

use super::ServeConfig;

pub(super) fn open(cfg: &ServeConfig, gateway: &mut crate::gateway::Gateway) -> Result<Exports> {
    let mut store: Option<IdentityStore> = None;
    let mut list = Vec::new();
    for spec in &cfg.exports {
        let read_only = cfg.read_only || cfg.read_only_exports.contains(&spec.name);
        if let Source::Rbd(rbd) = &spec.source {
            let explicit = cfg.volume_ids.get(&spec.name).copied();
            let o = gateway.open(&spec.name, rbd, read_only, explicit)?;
            let read_only = read_only || rbd.snap.is_some();
            let mut export = Export::local(
                spec.name.clone(),
                o.description,
                o.backend,
                read_only,
                o.volume,
            );
            export.allow = cfg.allow.get(&spec.name).cloned().unwrap_or_default();
            export.peers = o.peers;
            list.push(Arc::new(export));
            continue;
        }
        let (backend, description): (Arc<dyn Backend>, String) = match &spec.source {
            Source::Mem(size) => (
                Arc::new(FileBackend::memory(*size).context("cannot make a memory volume")?),
                "memory".into(),
            ),
            Source::File(path) => {
                create_if_missing(path, cfg.create.get(&spec.name).copied())?;
                let b = FileBackend::open(path, read_only)
                    .with_context(|| format!("export {:?}", spec.name))?;
                (Arc::new(b), path.display().to_string())
            }
            Source::Rbd(_) => unreachable!("opened above"),
        };
        let volume = match (&spec.source, cfg.volume_ids.get(&spec.name)) {
            (Source::Mem(_), Some(id)) => *id,
            (Source::Mem(_), None) => Uuid::new_v4(),
            (Source::File(path), explicit) => {
                identity(&mut store, &cfg.state_dir, path, explicit.copied())?
            }
            (Source::Rbd(_), _) => unreachable!("opened above"),
        };
        let mut export = Export::local(spec.name.clone(), description, backend, read_only, volume);
        export.allow = cfg.allow.get(&spec.name).cloned().unwrap_or_default();
        list.push(Arc::new(export));
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

//! The exports `braid serve` was given, opened: files and devices (made
//! when `--create` says so), memory, Ceph images, each with its volume
//! identity.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use braid_store::backend::{Backend, FileBackend};
use braid_store::identity::{IdentityStore, Want};
use braid_store::source::{format_size, Source};
use braid_store::{Export, Exports};
use tracing::{info, warn};
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
                shared_with_other_hosts(path, &spec.name, read_only, cfg.allow_network_fs)?;
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
                let want = Want {
                    export: &spec.name,
                    read_only,
                    explicit: explicit.copied(),
                };
                identity(&mut store, &cfg.state_dir, path, want)?
            }
            (Source::Rbd(_), _) => unreachable!("opened above"),
        };
        let mut export = Export::local(spec.name.clone(), description, backend, read_only, volume);
        export.allow = cfg.allow.get(&spec.name).cloned().unwrap_or_default();
        list.push(Arc::new(export));
    }
    one_identity_each(&list)?;
    Ok(Exports::new(list))
}

/// Refuses two exports with one identity: an initiator would take them
/// for paths to one volume and spread its I/O over two disks.
fn one_identity_each(exports: &[Arc<Export>]) -> Result<()> {
    for (i, a) in exports.iter().enumerate() {
        if let Some(b) = exports[i + 1..].iter().find(|b| b.volume == a.volume) {
            bail!(
                "exports {:?} ({}) and {:?} ({}) have one volume identity, {}: initiators would \
                 take them for one volume and mix their data. Give each its own (drop the \
                 --volume-id that repeats the other's), or serve one of them",
                a.name,
                a.description,
                b.name,
                b.description,
                a.volume
            );
        }
    }
    Ok(())
}

fn identity(
    store: &mut Option<IdentityStore>,
    dir: &Path,
    path: &Path,
    want: Want<'_>,
) -> Result<Uuid> {
    if store.is_none() {
        *store = Some(
            IdentityStore::open(dir)
                .with_context(|| format!("reading volume identities in {}", dir.display()))?,
        );
    }
    let store = store.as_mut().expect("opened above");
    store.resolve(path, want).with_context(|| {
        format!(
            "saving the volume identity of {} in {} (choose a writable --state-dir)",
            path.display(),
            store.path().display()
        )
    })
}

/// Refuses a writable image on a network file system unless
/// `--allow-network-fs` accepts it, and says at start that its lock holds
/// on this host only.
fn shared_with_other_hosts(
    path: &Path,
    export: &str,
    read_only: bool,
    allowed: bool,
) -> Result<()> {
    let fs = braid_store::backend::netfs::network_fs(path)
        .with_context(|| format!("export {export:?}: examining {}", path.display()))?;
    let Some(fs) = fs else { return Ok(()) };
    if read_only {
        warn!(
            "{}, served as {export:?}, is on {fs}, shared with other hosts: braid's lock on it \
             holds on this host only, so another host may change it while this one serves it \
             read-only",
            path.display()
        );
        return Ok(());
    }
    if !allowed {
        bail!(
            "export {export:?}: {} is on {fs}, a file system other hosts share, and braid's lock \
             on an image holds on this host only: a braid serve, qemu or mount on another host \
             would not see it and could write the same image, which corrupts it. Move the image \
             to a local disk, or serve it from this host alone and say so with \
             --allow-network-fs (allow_network_fs = true in serve.toml)",
            path.display()
        );
    }
    warn!(
        "{}, served as {export:?}, is on {fs}: locked on this host only (--allow-network-fs); \
         no other host may serve, run or mount it while this one serves it",
        path.display()
    );
    Ok(())
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

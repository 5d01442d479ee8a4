//! `braid attach`: the multipath volume as a local NBD export, for the
//! kernel (nbd-client), qemu, nbdfuse and every other NBD client. The
//! front end is the target's own (handshake, validation, replies); each
//! request is forwarded to the volume, which spreads it over the paths.
//!
//! Each volume has a target of its own, on its own socket, so that a
//! reload (SIGHUP, `systemctl reload braid-attach`) can attach or detach
//! one volume while every other keeps its clients and its paths.

mod console;
mod devices;
mod forward;
mod report;
mod spec;

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use braid_nbd_target::Target;
use braid_store::portal::Portal;
use braid_store::{Export, Exports, Limits};
use forward::VolumeForward;
use tracing::{error, info, warn};

use crate::attached::{Attached, Volumes};
use crate::cli::AttachArgs;
use crate::config::{self, AttachFile};
use crate::rates::Rates;
use crate::signals::{Signal, Signals};
use crate::{control, metrics, multipath};

#[cfg(test)]
pub use report::knobs;
use spec::{specs, usage, Spec};

pub fn run(args: AttachArgs) -> Result<()> {
    let file: AttachFile = match &args.config {
        Some(p) => config::load(p)?,
        None => AttachFile::default(),
    };
    let specs = specs(&args, &file)?;
    // Checked before anything opens: a bad URI or option is a usage error.
    for s in &specs {
        multipath::config(&s.uri, &s.multipath)?;
    }
    let http = crate::console::settings(
        args.http.as_deref().or(file.http.as_deref()),
        args.http_token.as_deref().or(file.http_token.as_deref()),
    )?;
    let control_path = args
        .control
        .clone()
        .or(file.control.clone())
        .unwrap_or_else(|| control::default_path("attach"));
    let rt = runtime(args.threads)?;
    rt.block_on(async move {
        let mut signals = Signals::install()?;
        let volumes = Volumes::default();
        // The control socket and the console first: an address already taken
        // must end the start before a volume's socket says it is attached.
        let rates = Arc::new(Mutex::new(Rates::default()));
        tokio::spawn(report::sample(volumes.clone(), rates.clone()));
        let handler = report::handler(volumes.clone(), rates.clone());
        let _control = control::serve(&control_path, handler.clone())?;
        if let Some(http) = &http {
            let source = console::AttachSource {
                volumes: volumes.clone(),
                rates,
                scrape: metrics::Scrape::new(metrics::attach::AttachCollector(volumes.clone())),
                handler,
            };
            crate::console::start(http, None, Arc::new(source), volumes.events()).await?;
        }
        for spec in &specs {
            match attach(spec).await {
                Ok(a) => volumes.add(a),
                Err(e) => {
                    // Nothing half-attached is left behind.
                    for a in volumes.snapshot() {
                        a.detach().await;
                    }
                    return Err(e);
                }
            }
        }
        let attached = volumes.snapshot();
        let devices = devices::free_nbd_devices(Path::new("/sys/block"), attached.len());
        for (a, dev) in attached.iter().zip(devices) {
            devices::print_usage(a, &dev);
        }
        crate::notify::ready(&format!("{} volume(s) attached", attached.len()));
        loop {
            match signals.next().await {
                Signal::Stop(which) => {
                    crate::notify::stopping();
                    info!("{which}: detaching every volume");
                    break;
                }
                Signal::Reload => {
                    crate::notify::reloading();
                    match reload_heeding_stop(&args, &volumes, &mut signals).await {
                        Ok(summary) => crate::notify::ready(&summary),
                        Err(which) => {
                            crate::notify::stopping();
                            info!(
                                "{which} during a reload: detaching every volume, the ones \
                                 the reload was detaching with them"
                            );
                            break;
                        }
                    }
                }
            }
        }
        let failed = detach_all(&volumes, &mut signals).await?;
        info!("detached");
        anyhow::ensure!(!failed, "a volume's final flush failed (see the log)");
        Ok(())
    })
}

/// A reload, run while signals are still heard: it may wait long (a
/// dropped volume with writes to flush and no path waits for one up to
/// the no-path timeout). A stop ends it where it is, with the stop's
/// signal (`Err`): a volume it was detaching is still in `volumes`, so the
/// stop detaches it with the rest, with the stop's notice and second-signal
/// escape. A SIGHUP meanwhile is kept: the file may have changed again
/// since it was read, so it is read again once this reload is done.
async fn reload_heeding_stop(
    args: &AttachArgs,
    volumes: &Volumes,
    signals: &mut Signals,
) -> Result<String, &'static str> {
    loop {
        let mut again = false;
        let mut reloading = std::pin::pin!(reload(args, volumes));
        let summary = loop {
            tokio::select! {
                summary = &mut reloading => break summary,
                signal = signals.next() => match signal {
                    Signal::Stop(which) => return Err(which),
                    Signal::Reload => {
                        again = true;
                        info!("SIGHUP during a reload: the file is read again once this one is done");
                    }
                },
            }
        };
        if !again {
            return Ok(summary);
        }
    }
}

/// How long a stop may take before attach says what it waits for.
const STOP_NOTICE: std::time::Duration = std::time::Duration::from_secs(1);

/// Detaches every volume, each after its final FLUSH (`true` if one
/// failed). A FLUSH with no path waits for one up to the no-path timeout:
/// after [`STOP_NOTICE`] the log says so, and a second SIGTERM or SIGINT
/// stops at once, naming the volumes whose writes were not flushed.
async fn detach_all(volumes: &Volumes, signals: &mut Signals) -> Result<bool> {
    let snapshot = volumes.snapshot();
    let detach = async {
        let mut failed = false;
        for a in &snapshot {
            failed |= !a.detach().await;
        }
        failed
    };
    let mut detach = std::pin::pin!(detach);
    let mut notice = std::pin::pin!(tokio::time::sleep(STOP_NOTICE));
    let mut noticed = false;
    loop {
        tokio::select! {
            failed = &mut detach => return Ok(failed),
            () = &mut notice, if !noticed => {
                noticed = true;
                let waiting = unflushed(&snapshot);
                if !waiting.is_empty() {
                    warn!(
                        "waiting to flush {waiting} before detaching (with no path to the \
                         target, for one to come back, up to --no-path-timeout); SIGTERM again \
                         (or Ctrl-C) stops now, and writes since the last flush are then not \
                         known to be durable"
                    );
                }
            }
            signal = signals.next() => {
                if let Signal::Stop(which) = signal {
                    let waiting = unflushed(&snapshot);
                    if waiting.is_empty() {
                        info!("{which} again: every volume is flushed; stopping now");
                        return Ok(false);
                    }
                    error!("{which} again: stopping now; {waiting} detached without its final flush");
                    anyhow::bail!(
                        "stopped by a second {which}: {waiting} not flushed; what was written since \
                         the last flush may not be durable"
                    );
                }
            }
        }
    }
}

/// The volumes still holding writes a FLUSH would make durable, named
/// (`"a", "b"`); empty when there are none.
fn unflushed(volumes: &[Arc<Attached>]) -> String {
    let names: Vec<String> = volumes
        .iter()
        .filter(|a| a.volume.unflushed())
        .map(|a| format!("{:?}", a.name))
        .collect();
    names.join(", ")
}

/// Hosts with at most this many cores run attach on one thread unless
/// `--threads` says otherwise. Measured on 2 cores (fio through attach,
/// three alternating rounds, `bench/single-notes.md`): one thread gave
/// 4 KiB random writes +19% at 24% less of attach's CPU, 1 MiB writes
/// +16%, and reads the same at 15% less CPU. There the client (and often
/// the server) needs the other core, and a second worker of attach's
/// costs a wake-up per hop; on more cores, one thread would do every
/// copy of a fast link alone.
const ONE_THREAD_UP_TO: usize = 2;

/// The threads attach runs on: `--threads`, else one on a small host and
/// one per core (`None`) on others.
fn threads(flag: Option<u16>, cores: usize) -> Option<u16> {
    flag.or((cores <= ONE_THREAD_UP_TO).then_some(1))
}

/// The runtime every attached volume runs on: one thread, where a reply
/// reaches the local socket's writer without waking another thread, or a
/// pool of `threads` (one per core when `None`).
fn runtime(flag: Option<u16>) -> Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let chosen = threads(flag, cores);
    let mut b = match chosen {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(usize::from(n));
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    if flag.is_none() {
        let n = chosen.map_or(cores, usize::from);
        info!("running on {n} thread(s) ({cores} cores; --threads sets it)");
    }
    Ok(b.enable_all().build()?)
}

/// Opens one volume and serves it on its own socket (and TCP port, if
/// asked).
async fn attach(spec: &Spec) -> Result<Arc<Attached>> {
    let cfg = multipath::config(&spec.uri, &spec.multipath)?;
    let vol = Arc::new(multipath::open(cfg).await?);
    let served = serve(spec, &vol).await;
    let (target, stop) = match served {
        Ok(t) => t,
        Err(e) => {
            vol.close().await;
            return Err(e);
        }
    };
    info!(volume = %spec.name, socket = %spec.socket.display(), "attached");
    Ok(Arc::new(Attached::start(
        spec.name.clone(),
        spec.uri.clone(),
        spec.socket.clone(),
        vol,
        spec.fingerprint(),
        target,
        stop,
    )))
}

/// The local target of one volume, bound and not yet running.
async fn serve(
    spec: &Spec,
    vol: &Arc<braid_initiator::Volume>,
) -> Result<(Target, braid_nbd_target::StopHandle)> {
    let identity = vol
        .info()
        .identity
        .as_deref()
        .and_then(|i| uuid::Uuid::parse_str(i).ok())
        .unwrap_or_else(uuid::Uuid::new_v4);
    let export = Arc::new(Export {
        name: spec.name.clone(),
        description: format!("{} over {} paths", spec.uri, vol.info().paths.len()),
        storage: Arc::new(VolumeForward(vol.clone())),
        read_only: false,
        volume: identity,
        allow: Vec::new(),
        peers: None,
        writes: Default::default(),
    });
    let tcp: Vec<Portal> = spec
        .tcp
        .iter()
        .map(|&addr| Portal { addr, device: None })
        .collect();
    for p in &tcp {
        if !p.addr.ip().is_loopback() {
            return Err(usage(format!(
                "--tcp {}: only loopback addresses (the volume is not access-controlled here)",
                p.addr
            )));
        }
    }
    let mut target = Target::bind(Exports::new(vec![export]), &tcp, Limits::default())?;
    if let Some(dir) = spec.socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    target.bind_unix(&spec.socket)?;
    control::set_mode(&spec.socket, 0o660);
    let stop = target.stop_handle();
    Ok((target, stop))
}

/// Reads the configuration again and makes the attached volumes match it:
/// volumes gone from it are detached, new ones attached, changed ones
/// attached again; the rest are not touched. A volume that fails to
/// attach is logged and left out; the others carry on. Returns a summary
/// for the log and systemd.
async fn reload(args: &AttachArgs, volumes: &Volumes) -> String {
    let Some(path) = &args.config else {
        warn!("reload asked, but braid attach was started without --config: nothing to re-read");
        return format!("{} volume(s) attached", volumes.snapshot().len());
    };
    let wanted = match config::load(path).and_then(|file| specs(args, &file)) {
        Ok(s) => s,
        Err(e) => {
            error!(
                "reload: {} is not valid, nothing changed: {e:#}",
                path.display()
            );
            return format!(
                "{} volume(s) attached; reload refused",
                volumes.snapshot().len()
            );
        }
    };
    let (mut added, mut removed, mut failed) = (0, 0, 0);
    let mut changed = Vec::new();
    for a in volumes.snapshot() {
        match wanted.iter().find(|s| s.name == a.name) {
            Some(s) if s.fingerprint() == a.fingerprint => {}
            Some(_) => {
                info!(volume = %a.name, "reload: its settings changed; attaching it again");
                // Listed until detached: a stop meanwhile detaches it too.
                a.detach().await;
                volumes.remove(&a.name);
                changed.push(a.name.clone());
            }
            None => {
                info!(volume = %a.name, "reload: no longer configured; detaching it");
                a.detach().await;
                volumes.remove(&a.name);
                removed += 1;
            }
        }
    }
    for s in &wanted {
        if volumes.find(&s.name).is_some() {
            continue;
        }
        match attach(s).await {
            Ok(a) => {
                volumes.add(a);
                added += usize::from(!changed.contains(&s.name));
            }
            Err(e) => {
                error!(volume = %s.name, "reload: attaching failed: {e:#}");
                failed += 1;
            }
        }
    }
    let summary = format!(
        "{} volume(s) attached; reload: {added} added, {removed} removed, {} changed, \
         {failed} failed",
        volumes.snapshot().len(),
        changed.len()
    );
    info!("{summary}");
    summary
}

#[cfg(test)]
mod runtime_tests {
    use super::threads;

    #[test]
    fn small_hosts_run_on_one_thread_and_the_flag_always_wins() {
        assert_eq!(threads(None, 1), Some(1));
        assert_eq!(threads(None, 2), Some(1));
        assert_eq!(threads(None, 3), None, "one per core");
        assert_eq!(threads(None, 64), None);
        assert_eq!(threads(Some(4), 2), Some(4));
        assert_eq!(threads(Some(1), 64), Some(1));
    }
}

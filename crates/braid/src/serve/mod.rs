//! `braid serve`: flags checked into a configuration, exports opened, the
//! target run in the foreground until SIGINT or SIGTERM.

mod acl;
mod exports;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use braid_nbd_target::Target;
use braid_store::access::Network;
use braid_store::identity::default_state_dir;
use braid_store::portal::{self, ListenSpec, DEFAULT_PORT};
use braid_store::source::{format_size, parse_size, ExportSpec, Source};
use braid_store::Limits;
use tracing::info;
use uuid::Uuid;

use crate::cli::{ServeArgs, UsageError};
use crate::config::{self, ServeFile};
use crate::control;
use crate::rates::Rates;

mod console;
mod iscsi;
mod report;

use report::{handler, sample};

/// Every front end `braid serve` can run, as each states itself. A new
/// front end is added here, beside the lines below that start it; the log
/// level directive reads its log target from here (`crate::logging`).
pub const FRONT_ENDS: [braid_store::Capabilities; 2] = [
    braid_nbd_target::CAPABILITIES,
    braid_iscsi_target::CAPABILITIES,
];

/// `braid serve`, checked.
struct ServeConfig {
    listen: Vec<ListenSpec>,
    default_listen: bool,
    read_only: bool,
    /// Exports that refuse writes when the whole server does not.
    read_only_exports: std::collections::HashSet<String>,
    /// Writable images may be on a network file system.
    allow_network_fs: bool,
    /// Size to create each missing file source with, by export name.
    create: HashMap<String, u64>,
    volume_ids: HashMap<String, Uuid>,
    state_dir: std::path::PathBuf,
    control: std::path::PathBuf,
    /// The console and metrics listener.
    http: Option<crate::console::Http>,
    /// Port of the iSCSI portals, when iSCSI is served.
    iscsi: Option<u16>,
    /// Who may log in over iSCSI, with which CHAP credentials.
    iscsi_access: braid_iscsi::access::Access,
    /// What every iSCSI target name starts with.
    iscsi_iqn: String,
    /// Exports whose iSCSI units start with the write cache on.
    iscsi_write_cache: std::collections::HashSet<String>,
    /// Data-Out timeout and NOP-In pings.
    iscsi_timers: braid_iscsi_target::Timers,
    exports: Vec<ExportSpec>,
    /// Certificate, key, and the CA that client certificates must chain to.
    tls: Option<(PathBuf, PathBuf, Option<PathBuf>)>,
    allow: HashMap<String, Vec<Network>>,
    limits: Limits,
    sendfile: braid_nbd_target::Sendfile,
    ceph: crate::gateway::CephSettings,
}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

impl ServeConfig {
    fn from_args(mut args: ServeArgs) -> Result<Self> {
        let file: ServeFile = match &args.config {
            Some(p) => config::load(p)?,
            None => ServeFile::default(),
        };
        let mut create_per: HashMap<String, String> = HashMap::new();
        for e in &file.exports {
            for a in &e.allow {
                args.allow.push(format!("{}={a}", e.name));
            }
            let spec: ExportSpec = format!("{}={}", e.name, e.source)
                .parse()
                .map_err(|e: braid_store::source::SpecError| usage(e.0))?;
            args.exports.push(spec);
            if let Some(c) = &e.create {
                create_per.insert(e.name.clone(), c.clone());
            }
            if let Some(id) = &e.volume_id {
                args.volume_ids.push(format!("{}={id}", e.name));
            }
            if e.read_only {
                args.read_only_exports.push(e.name.clone());
            }
            if e.iscsi_write_cache {
                args.iscsi_write_cache.push(e.name.clone());
            }
        }
        // A flag wins over its key in the file.
        args.create = args.create.or(file.create);
        let max_connections = args
            .max_connections
            .or(file.max_connections)
            .unwrap_or(1024);
        let max_connections_per_client = args
            .max_connections_per_client
            .or(file.max_connections_per_client)
            .unwrap_or(128);
        let max_requests_per_connection = args
            .max_requests_per_connection
            .or(file.max_requests_per_connection)
            .unwrap_or(256);
        let max_inflight_per_connection = args
            .max_inflight_per_connection
            .or(file.max_inflight_per_connection)
            .unwrap_or_else(|| "128M".into());
        let max_inflight_total = args
            .max_inflight_total
            .or(file.max_inflight_total)
            .unwrap_or_else(|| "1G".into());
        let handshake_timeout = args
            .handshake_timeout
            .or(file.handshake_timeout)
            .unwrap_or(10.0);
        let idle_timeout = args.idle_timeout.or(file.idle_timeout).unwrap_or(0.0);
        let send_timeout = args.send_timeout.or(file.send_timeout);
        for l in &file.listen {
            args.listen.push(l.parse().map_err(usage)?);
        }
        args.read_only |= file.read_only;
        let mut seen = std::collections::HashSet::new();
        for e in &args.exports {
            if !seen.insert(e.name.clone()) {
                return Err(usage(format!("export name {:?} is given twice", e.name)));
            }
        }
        for (flag, names) in [
            ("--read-only-export", &args.read_only_exports),
            ("--iscsi-write-cache", &args.iscsi_write_cache),
        ] {
            if let Some(name) = names.iter().find(|n| !seen.contains(*n)) {
                return Err(usage(format!(
                    "{flag} {name:?}: there is no export of that name"
                )));
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
        let size = |s: &str| parse_size(s).map_err(|e| usage(format!("--create {s:?}: {e}")));
        let mut create = HashMap::new();
        for e in &args.exports {
            let chosen = create_per.get(&e.name).or(args.create.as_ref());
            if let Some(s) = chosen {
                create.insert(e.name.clone(), size(s)?);
            }
        }
        let mut allow: HashMap<String, Vec<Network>> = HashMap::new();
        for a in &args.allow {
            let (name, net) = a.split_once('=').ok_or_else(|| {
                usage(format!(
                    "--allow {a:?}: write NAME=CIDR, e.g. vol=10.0.1.0/24"
                ))
            })?;
            if !seen.contains(name) {
                return Err(usage(format!(
                    "--allow {a:?}: there is no export named {name:?}"
                )));
            }
            let net: Network = net
                .parse()
                .map_err(|e| usage(format!("--allow {a:?}: {e}")))?;
            allow.entry(name.to_owned()).or_default().push(net);
        }
        let tls = match (
            args.tls_cert.or(file.tls_cert),
            args.tls_key.or(file.tls_key),
            args.tls_client_ca.or(file.tls_client_ca),
        ) {
            (Some(c), Some(k), ca) => Some((c, k, ca)),
            (None, None, None) => None,
            _ => {
                return Err(usage(
                    "TLS needs both a certificate and a key (--tls-cert and --tls-key)",
                ))
            }
        };
        let secs = |v: f64, flag: &str| -> Result<Duration> {
            if v.is_finite() && v >= 0.0 {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err(usage(format!("{flag} must be a number of seconds")))
            }
        };
        let inflight = parse_size(&max_inflight_per_connection).map_err(|e| {
            usage(format!(
                "--max-inflight-per-connection {max_inflight_per_connection:?}: {e}"
            ))
        })?;
        if max_connections == 0
            || max_connections_per_client == 0
            || max_requests_per_connection == 0
            || inflight < 32 << 20
        {
            return Err(usage(
                "connection limits must be at least 1, and --max-inflight-per-connection at least \
                 32M (one maximum request)",
            ));
        }
        let total = parse_size(&max_inflight_total)
            .map_err(|e| usage(format!("--max-inflight-total {max_inflight_total:?}: {e}")))?;
        if total < inflight {
            return Err(usage(
                "--max-inflight-total must be at least --max-inflight-per-connection",
            ));
        }
        let handshake = secs(handshake_timeout, "--handshake-timeout")?;
        if handshake.is_zero() {
            return Err(usage("--handshake-timeout must be more than 0"));
        }
        let idle = secs(idle_timeout, "--idle-timeout")?;
        let send = match send_timeout {
            Some(v) => Some(secs(v, "--send-timeout")?).filter(|d| !d.is_zero()),
            None => Limits::default().send_timeout,
        };
        let iscsi_timers = {
            let t = braid_iscsi_target::Timers::default();
            let or = |v: Option<f64>, d: Duration, flag| {
                v.map_or(Ok(d), |v| secs(v, flag)).and_then(|d| {
                    (!d.is_zero())
                        .then_some(d)
                        .ok_or_else(|| usage(format!("{flag} must be more than 0")))
                })
            };
            let interval = args.iscsi_nopin_interval.or(file.iscsi_nopin_interval);
            braid_iscsi_target::Timers {
                data_out: or(
                    args.iscsi_dataout_timeout.or(file.iscsi_dataout_timeout),
                    t.data_out,
                    "--iscsi-dataout-timeout",
                )?,
                nop_in_interval: match interval {
                    Some(v) => Some(secs(v, "--iscsi-nopin-interval")?).filter(|d| !d.is_zero()),
                    None => t.nop_in_interval,
                },
                nop_in_timeout: or(
                    args.iscsi_nopin_timeout.or(file.iscsi_nopin_timeout),
                    t.nop_in_timeout,
                    "--iscsi-nopin-timeout",
                )?,
            }
        };
        let limits = Limits {
            handshake_timeout: handshake,
            idle_timeout: (!idle.is_zero()).then_some(idle),
            send_timeout: send,
            max_requests: max_requests_per_connection,
            max_bytes: inflight as usize,
            max_total_bytes: total as usize,
            max_connections,
            max_connections_per_client,
        };
        let default_listen = args.listen.is_empty();
        let listen = if default_listen {
            vec![ListenSpec::Addr(
                (std::net::Ipv4Addr::LOCALHOST, DEFAULT_PORT).into(),
            )]
        } else {
            args.listen
        };
        let http = crate::console::settings(
            args.http.or(file.http).as_deref(),
            args.http_token.or(file.http_token).as_deref(),
        )?;
        let iscsi = args.iscsi.or(file.iscsi);
        let iscsi_can = braid_iscsi_target::CAPABILITIES;
        if iscsi.is_some() && tls.is_some() && !iscsi_can.tls {
            return Err(usage(
                "--iscsi with --tls-cert: braid's iSCSI portals have no TLS (CHAP authenticates \
                 but does not encrypt), so they would serve in the clear what NBD serves only over TLS; leave out --iscsi, or TLS",
            ));
        }
        if iscsi.is_some()
            && !iscsi_can.fenced_across_gateways
            && args
                .exports
                .iter()
                .any(|e| matches!(e.source, Source::Rbd(_)))
        {
            return Err(usage(
                "--iscsi with an rbd: export: braid's iSCSI portals take no part in fencing \
                 across gateways yet, so a stalled gateway's iSCSI writes could land late; serve \
                 RBD images over NBD (leave out --iscsi), or serve them from another braid serve",
            ));
        }
        let lease = secs(
            args.gateway_lease.or(file.gateway_lease).unwrap_or(15.0),
            "--gateway-lease",
        )?;
        if lease < Duration::from_secs(1) {
            return Err(usage("--gateway-lease must be at least 1 second"));
        }
        let ceph = crate::gateway::CephSettings {
            conf: args.ceph_conf.or(file.ceph_conf),
            id: args.ceph_id.or(file.ceph_id),
            admin_socket: match args.ceph_admin_socket.or(file.ceph_admin_socket) {
                Some(dir) if !dir.is_dir() => {
                    return Err(usage(format!(
                        "--ceph-admin-socket {}: not a directory (create it first; each RADOS \
                         client of this gateway opens a socket in it)",
                        dir.display()
                    )))
                }
                dir => dir,
            },
            cache: args.rbd_cache || file.rbd_cache,
            lease,
        };
        if !args.iscsi_write_cache.is_empty() && iscsi.is_none() {
            return Err(usage(
                "iscsi_write_cache without iscsi: set the iSCSI port too",
            ));
        }
        let iscsi_iqn = match args.iscsi_iqn.or(file.iscsi_iqn) {
            Some(_) if iscsi.is_none() => {
                return Err(usage("iscsi_iqn without iscsi: set the iSCSI port too"))
            }
            Some(p) => iscsi::iqn_prefix(&p).map_err(usage)?,
            None => braid_iscsi_target::DEFAULT_IQN_PREFIX.to_owned(),
        };
        let iscsi_chap = args
            .iscsi_chap
            .or(file.iscsi_chap)
            .map(|p| config::chap_credentials(&p))
            .transpose()?;
        if iscsi_chap.is_some() && iscsi.is_none() {
            return Err(usage("iscsi_chap without iscsi: set the iSCSI port too"));
        }
        let iscsi_acl = args.iscsi_acl.or(file.iscsi_acl);
        let iscsi_access =
            match iscsi_acl.as_deref() {
                Some(_) if iscsi.is_none() => {
                    return Err(usage("iscsi_acl without iscsi: set the iSCSI port too"))
                }
                Some(_) if iscsi_chap.is_some() => return Err(usage(
                    "iscsi_acl and iscsi_chap together: the access list gives each initiator its \
                     own credentials ([unlisted] for the rest); keep one",
                )),
                Some(p) => acl::read(p, &seen, |e| braid_iscsi_target::target_name(&iscsi_iqn, e))?,
                None => braid_iscsi::access::Access::open(iscsi_chap),
            };
        Ok(Self {
            http,
            iscsi,
            iscsi_access,
            iscsi_iqn,
            iscsi_write_cache: args.iscsi_write_cache.into_iter().collect(),
            iscsi_timers,
            listen,
            default_listen,
            read_only: args.read_only,
            read_only_exports: args.read_only_exports.into_iter().collect(),
            allow_network_fs: args.allow_network_fs || file.allow_network_fs,
            create,
            volume_ids,
            state_dir: args
                .state_dir
                .or(file.state_dir)
                .unwrap_or_else(default_state_dir),
            control: args
                .control
                .or(file.control)
                .unwrap_or_else(|| control::default_path("serve")),
            exports: args.exports,
            tls,
            allow,
            limits,
            // Neither given: the target's own default (`remote`).
            sendfile: args
                .sendfile
                .or(file.sendfile)
                .map(Into::into)
                .unwrap_or_default(),
            ceph,
        })
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    let cfg = ServeConfig::from_args(args)?;
    let resolved = portal::resolve(&cfg.listen).map_err(usage)?;
    for l in &resolved.left_out {
        info!(
            "--listen all leaves out {} on {}: {} (--listen {} serves on it anyway)",
            l.addr.ip, l.addr.iface, l.reason, l.addr.iface
        );
    }
    let portals = resolved.portals;
    let mut gateway = crate::gateway::Gateway::new(cfg.ceph.clone());
    let exports = exports::open(&cfg, &mut gateway)?;
    // Durable before any connection id is issued under its tag, so that a
    // restart after a power cut still answers fences of this process.
    let lineage = braid_store::lineage::Lineage::claim(&cfg.state_dir).with_context(|| {
        format!(
            "recording this server in {} (choose a writable --state-dir)",
            cfg.state_dir.display()
        )
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let signals = crate::signals::Signals::install()?;
        let mut target = Target::bind(exports, &portals, cfg.limits.clone())?;
        target.registry().adopt(lineage);
        target.set_sendfile(cfg.sendfile);
        if let Some((cert, key, ca)) = &cfg.tls {
            target.set_tls(crate::tls::server(cert, key, ca.as_deref())?);
            info!(
                "TLS required{}",
                if ca.is_some() {
                    ", with client certificates signed by the given CA"
                } else {
                    ""
                }
            );
        }
        // iSCSI sessions are registered apart from NBD's connections, and
        // a gateway's fences reach both.
        let iscsi_sessions = Arc::new(braid_store::registry::Registry::new());
        // In every RBD image's gateway registry before a client can come.
        gateway.start(&target, &iscsi_sessions).await?;
        // Bound before anything says the server is up.
        let iscsi = match cfg.iscsi {
            Some(port) => {
                let port_offset = gateway.iscsi_port_offset(&cfg.state_dir).await?;
                let settings = braid_iscsi_target::IscsiConfig {
                    iqn_prefix: cfg.iscsi_iqn.clone(),
                    access: cfg.iscsi_access.clone(),
                    state_dir: Some(cfg.state_dir.clone()),
                    write_cache: cfg.iscsi_write_cache.clone(),
                    limits: cfg.limits.clone(),
                    instance: target.instance().0,
                    timers: cfg.iscsi_timers,
                    connections: iscsi_sessions,
                    port_offset,
                };
                let started = iscsi::start(&target, &portals, port, settings).await?;
                let published = started.1.portals();
                let published = published.iter().map(|p| (p.addr.to_string(), p.tag));
                gateway.publish_iscsi(published.collect()).await?;
                Some(started)
            }
            None => None,
        };
        // The control socket and the console are bound before the lines that
        // say the server is up: a port already taken must end the start, not
        // a server that its supervisor (or a test) already counted as serving.
        let rates = Arc::new(Mutex::new(Rates::default()));
        let registry = target.registry();
        tokio::spawn(sample(registry.clone(), rates.clone()));
        let portals_shown: Vec<String> = portals
            .iter()
            .zip(target.local_addrs())
            .map(|(p, a)| match &p.device {
                Some(d) => format!("{a} (on {d})"),
                None => a.to_string(),
            })
            .collect();
        let iscsi_handle = iscsi.as_ref().map(|(_, h)| h.clone());
        let front_ends: report::FrontEnds = {
            let iscsi = iscsi_handle.clone();
            Arc::new(move || crate::ctl::FrontEndStatus {
                iscsi: iscsi.as_ref().map(iscsi::status),
            })
        };
        let handler = handler(
            registry,
            target.exports(),
            portals_shown,
            iscsi_handle,
            front_ends,
            rates,
        );
        let _control = control::serve(&cfg.control, handler.clone())?;
        if let Some(http) = &cfg.http {
            console::start(http, &cfg, &target, &portals, handler).await?;
        }
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
                format_size(e.size()),
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
        crate::notify::ready(&format!(
            "serving {} export(s) on {} portal(s)",
            target.exports().iter().count(),
            portals.len()
        ));
        tokio::spawn(signals.stop_on_signal(target.stop_handle()));
        let exports = target.exports();
        let ran = target.run().await.context("flushing exports at exit");
        // Every connection drained: this gateway's records may go.
        gateway.stop().await;
        ran?;
        if let Some((task, _)) = iscsi {
            // iSCSI writes that were still running when NBD's final flush
            // ran: flushed once more now that every connection is gone.
            let _ = task.await;
            for e in exports.iter() {
                if let Some(b) = e.storage.backend() {
                    b.flush().context("flushing exports at exit")?;
                }
            }
        }
        info!("stopped");
        anyhow::Ok(())
    })
}

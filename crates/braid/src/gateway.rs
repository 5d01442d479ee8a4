//! `rbd:` exports in `braid serve`: one Ceph connection shared by all of
//! them, joined to each image's gateways once the portals are bound, and
//! left after the last connection drained. Without the `rbd` feature an
//! `rbd:` export is refused with the command that builds braid with it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use braid_nbd_target::Target;
use braid_store::backend::Backend;
use braid_store::registry::Registry;
use braid_store::source::RbdSpec;
use braid_store::Peers;
use uuid::Uuid;

/// `--ceph-conf`, `--ceph-id`, `--ceph-admin-socket`, `--rbd-cache`,
/// `--gateway-lease`.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "rbd"), allow(dead_code))]
pub struct CephSettings {
    pub conf: Option<PathBuf>,
    pub id: Option<String>,
    pub admin_socket: Option<PathBuf>,
    pub cache: bool,
    pub lease: Duration,
}

/// An `rbd:` export, opened.
pub struct Opened {
    pub backend: Arc<dyn Backend>,
    pub peers: Option<Arc<dyn Peers>>,
    pub description: String,
    pub volume: Uuid,
}

/// The Ceph side of one `braid serve`.
pub struct Gateway {
    #[cfg_attr(not(feature = "rbd"), allow(dead_code))]
    settings: CephSettings,
    #[cfg(feature = "rbd")]
    ceph: Option<Arc<braid_gateway::Ceph>>,
}

impl Gateway {
    pub fn new(settings: CephSettings) -> Self {
        Self {
            settings,
            #[cfg(feature = "rbd")]
            ceph: None,
        }
    }

    /// Opens export `name` of `spec`, connecting to the cluster first if
    /// no export did yet.
    ///
    /// # Errors
    ///
    /// Built without the `rbd` feature; the cluster, pool or image cannot
    /// be used; the image cannot be served as asked.
    #[cfg(feature = "rbd")]
    pub fn open(
        &mut self,
        name: &str,
        spec: &RbdSpec,
        read_only: bool,
        identity: Option<Uuid>,
    ) -> Result<Opened> {
        use braid_gateway::{Ceph, GatewayOptions, RbdVolume};
        let ceph = match &self.ceph {
            Some(c) => c.clone(),
            None => {
                let opts = GatewayOptions {
                    connect: braid_rbd_options(&self.settings),
                    lease: self.settings.lease,
                    cache: self.settings.cache,
                    admin_sockets: self.settings.admin_socket.clone(),
                };
                let c = Ceph::connect(opts).map_err(|e| anyhow::anyhow!("export {name:?}: {e}"))?;
                self.ceph = Some(c.clone());
                c
            }
        };
        let vol = RbdVolume::open(&ceph, name, spec, read_only, identity)
            .map_err(|e| anyhow::anyhow!("export {name:?}: {e}"))?;
        Ok(Opened {
            peers: vol.peers(),
            description: vol.describe(),
            volume: vol.identity(),
            backend: vol,
        })
    }

    /// Without the `rbd` feature: refuses, saying how to get it.
    ///
    /// # Errors
    ///
    /// Always.
    #[cfg(not(feature = "rbd"))]
    pub fn open(
        &mut self,
        name: &str,
        spec: &RbdSpec,
        _read_only: bool,
        _identity: Option<Uuid>,
    ) -> Result<Opened> {
        anyhow::bail!(
            "export {name:?} ({spec}): this braid was built without Ceph RBD support; build it \
             with `cargo build --release --features rbd` (needs Debian's librbd-dev, \
             librados-dev and libclang-dev)"
        )
    }

    /// Joins every image's gateways; call after binding, before serving.
    /// `iscsi` is the iSCSI sessions' registry, which the gateway's fences
    /// reach as they reach NBD's connections.
    ///
    /// # Errors
    ///
    /// An image cannot be served beside the gateways already there.
    pub async fn start(&self, target: &Target, iscsi: &Arc<Registry>) -> Result<()> {
        #[cfg(feature = "rbd")]
        if let Some(ceph) = &self.ceph {
            let registries = vec![target.registry(), iscsi.clone()];
            ceph.start(registries, target.advertised_portals().to_vec())
                .await
                .map_err(anyhow::Error::msg)?;
        }
        let _ = (target, iscsi);
        Ok(())
    }

    /// Where this gateway's iSCSI port ids start: 256 times its range
    /// among the gateways of its (first) image, which it keeps across
    /// restarts by an identity of its own in `state_dir`; 0 without an
    /// image to serve.
    ///
    /// # Errors
    ///
    /// The identity cannot be kept, or the range cannot be had.
    pub async fn iscsi_port_offset(&self, state_dir: &std::path::Path) -> Result<u16> {
        #[cfg(feature = "rbd")]
        if let Some(ceph) = &self.ceph {
            let me = identity(state_dir)?;
            let ceph = ceph.clone();
            let range = tokio::task::spawn_blocking(move || ceph.port_range(&me))
                .await?
                .map_err(anyhow::Error::msg)?;
            return Ok(range.map_or(0, |r| r << 8));
        }
        let _ = state_dir;
        Ok(0)
    }

    /// Publishes this gateway's iSCSI portals and their tags to the other
    /// gateways of its images, whose SendTargets then name them.
    ///
    /// # Errors
    ///
    /// A record could not be written.
    pub async fn publish_iscsi(&self, portals: Vec<(String, u16)>) -> Result<()> {
        #[cfg(feature = "rbd")]
        if let Some(ceph) = &self.ceph {
            ceph.publish_iscsi(portals)
                .await
                .map_err(anyhow::Error::msg)?;
            return Ok(());
        }
        let _ = portals;
        Ok(())
    }

    /// Leaves every image's gateways; call once the target stopped.
    pub async fn stop(&self) {
        #[cfg(feature = "rbd")]
        if let Some(ceph) = &self.ceph {
            ceph.stop().await;
        }
    }
}

#[cfg(feature = "rbd")]
fn braid_rbd_options(s: &CephSettings) -> braid_gateway::ConnectOptions {
    braid_gateway::ConnectOptions {
        conf: s.conf.clone(),
        id: s.id.clone(),
        settings: Vec::new(),
    }
}

/// This gateway's identity among an image's gateways, the same across
/// restarts: a random one made at the first start and kept in the state
/// directory (`gateway-identity`).
#[cfg(feature = "rbd")]
fn identity(state_dir: &std::path::Path) -> Result<String> {
    use anyhow::Context;
    let path = state_dir.join("gateway-identity");
    match std::fs::read_to_string(&path) {
        Ok(kept) if !kept.trim().is_empty() => return Ok(kept.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let made = Uuid::new_v4().simple().to_string();
    let tmp = state_dir.join("gateway-identity.new");
    std::fs::create_dir_all(state_dir)
        .and_then(|()| std::fs::write(&tmp, format!("{made}\n")))
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, &path))
        .with_context(|| {
            format!(
                "keeping this gateway's identity in {} (choose a writable --state-dir)",
                path.display()
            )
        })?;
    Ok(made)
}

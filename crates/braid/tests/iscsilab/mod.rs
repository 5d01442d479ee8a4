//! iSCSI targets in the lab's storage namespace, one portal per path:
//! braid's own (`braid serve --iscsi`, whose SendTargets names every
//! portal) and Debian's tgt (which names only the portal asked, so braid
//! is given each one with `--portal`). Shared by the lab's iSCSI tests.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use braid_lab::{Lab, Side};

use crate::labkit::LabServe;
use crate::tgtkit::Tgt;

pub const BRAID_IQN: &str = "iqn.2026-11.org.braid-storage:vol";
pub const TGT_IQN: &str = "iqn.2026-11.org.example:lab";
/// The volume's size on either target.
pub const SIZE: u64 = 64 << 20;

/// Which target serves the volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Braid,
    Tgt,
}

enum Running {
    Braid(LabServe),
    Tgt(Tgt),
}

/// A target serving one 64 MiB unit on every lab path.
pub struct Target {
    pub kind: Kind,
    /// One portal per lab path, path 1 first.
    pub portals: Vec<SocketAddr>,
    running: Running,
    /// The control socket of braid's target (for `braid alua`).
    pub control: PathBuf,
    _dir: tempfile::TempDir,
}

impl Target {
    /// Starts `kind` on `port` of every path's storage address.
    pub fn start(lab: &Lab, kind: Kind, port: u16) -> Target {
        let dir = tempfile::tempdir().unwrap();
        let portals: Vec<SocketAddr> = lab
            .paths()
            .iter()
            .map(|p| SocketAddr::new(p.storage_addr.into(), port))
            .collect();
        let control = dir.path().join("serve.sock");
        let running = match kind {
            Kind::Braid => {
                let port = port.to_string();
                let control = control.display().to_string();
                let mut args = vec!["--iscsi", &port, "--control", &control];
                let listen: Vec<String> = portals.iter().map(|p| format!("{}:0", p.ip())).collect();
                for l in &listen {
                    args.extend(["--listen", l]);
                }
                args.push("vol=mem:64MiB");
                Running::Braid(LabServe::start(lab, &args, 1))
            }
            Kind::Tgt => {
                let file = dir.path().join("lun.img");
                std::fs::File::create(&file)
                    .and_then(|f| f.set_len(SIZE))
                    .unwrap();
                let mut tgt =
                    Tgt::start_in(&["ip", "netns", "exec", lab.ns(Side::Storage)], &portals);
                tgt.target(1, TGT_IQN, 1, &file, "braidlab1");
                Running::Tgt(tgt)
            }
        };
        Target {
            kind,
            portals,
            running,
            control,
            _dir: dir,
        }
    }

    /// The volume's URI, naming path 1's portal.
    pub fn uri(&self) -> String {
        match self.kind {
            Kind::Braid => format!("iscsi://{}/{BRAID_IQN}/0", self.portals[0]),
            Kind::Tgt => format!("iscsi://{}/{TGT_IQN}/1", self.portals[0]),
        }
    }

    /// The portals braid must be told of: none for braid's target
    /// (discovery finds them), each for tgt.
    pub fn named_portals(&self) -> Vec<SocketAddr> {
        match self.kind {
            Kind::Braid => Vec::new(),
            Kind::Tgt => self.portals.clone(),
        }
    }

    /// [`Self::named_portals`] as `--portal` arguments.
    pub fn portal_args(&self) -> Vec<String> {
        self.named_portals()
            .iter()
            .flat_map(|p| ["--portal".to_owned(), p.to_string()])
            .collect()
    }

    /// What the target logged (braid's target only).
    pub fn log(&self) -> String {
        match &self.running {
            Running::Braid(s) => s.log(),
            Running::Tgt(_) => String::new(),
        }
    }
}

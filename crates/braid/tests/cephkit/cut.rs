//! Cutting chosen daemons of a throwaway cluster off from others, one
//! direction at a time, on loopback: what the OSD map barrier's test uses
//! to hold an OSD and a gateway behind on maps for as long as it needs
//! (a random delay, as `Cluster::lag_maps` makes, decides the race only
//! most of the time).
//!
//! A cut is an nftables table of its own that drops the TCP segments sent
//! from one set of local ports to another; the sender's TCP stack keeps
//! sending them again, so once the cut is lifted what was held arrives,
//! in order, as after a network fault. Only the ports of connections open
//! when the cut is made are named.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crate::common::output;

use super::Cluster;

/// The cluster of this test binary with two OSDs (`scripts/ceph-cluster
/// --osds 2`), or `None` as [`super::ceph`]; a test binary uses one kind.
pub fn ceph_two_osds() -> Option<&'static Cluster> {
    super::available().then(|| super::start(&["--osds", "2"]))
}

/// One direction of traffic dropped until this is dropped.
pub struct Cut {
    table: String,
}

static CUTS: AtomicU32 = AtomicU32::new(0);

/// The two pools of [`Cluster::split_image`], made once per cluster.
static SPLIT: OnceLock<(String, String)> = OnceLock::new();

impl Cut {
    /// Drops what goes from any of the ports `from` to any of the ports
    /// `to` (TCP on 127.0.0.1).
    pub fn new(what: &str, from: &[u16], to: &[u16]) -> Cut {
        assert!(
            !from.is_empty() && !to.is_empty(),
            "{what}: no ports to cut ({from:?} to {to:?})"
        );
        clear_stale();
        let table = format!(
            "braid_cut_{}_{}",
            std::process::id(),
            CUTS.fetch_add(1, Ordering::SeqCst)
        );
        let list = |ports: &[u16]| {
            ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let rules = format!(
            "table ip {table} {{\n chain input {{\n  type filter hook input priority 0; policy \
             accept;\n  ip saddr 127.0.0.1 tcp sport {{ {} }} tcp dport {{ {} }} drop\n }}\n}}\n",
            list(from),
            list(to)
        );
        let file = tempfile::NamedTempFile::new().expect("a temporary file");
        std::fs::write(file.path(), rules).expect("writing the rules");
        nft(&["-f".as_ref(), file.path().as_os_str()], what);
        Cut { table }
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        delete_table(&self.table, "lifting a cut");
    }
}

/// Removes the cuts of test processes that are gone (killed before their
/// cuts were dropped), whose rules would otherwise catch whatever later
/// uses those ports.
fn clear_stale() {
    let out = output(
        Command::new("nft").args(["list", "tables"]),
        Duration::from_secs(10),
    );
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(table) = line.strip_prefix("table ip ") else {
            continue;
        };
        let Some(pid) = table
            .strip_prefix("braid_cut_")
            .and_then(|t| t.split('_').next())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            delete_table(table, "removing a cut left by a test process that is gone");
        }
    }
}

fn delete_table(table: &str, what: &str) {
    nft(
        &["delete", "table", "ip", table].map(std::ffi::OsStr::new),
        what,
    );
}

fn nft(args: &[&std::ffi::OsStr], what: &str) {
    let out = output(Command::new("nft").args(args), Duration::from_secs(10));
    assert!(
        out.status.success(),
        "{what}: nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The local ports of every TCP socket of process `pid` (listening ones
/// and connections), as `ss` lists them.
pub fn ports_of(pid: u32) -> Vec<u16> {
    let out = output(Command::new("ss").arg("-tanpH"), Duration::from_secs(10));
    assert!(out.status.success(), "ss failed");
    let owner = format!("pid={pid},");
    let mut ports: Vec<u16> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&owner))
        .filter_map(|l| {
            l.split_whitespace()
                .nth(3)?
                .rsplit(':')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    ports.sort_unstable();
    ports.dedup();
    assert!(!ports.is_empty(), "process {pid} has no TCP sockets");
    ports
}

impl Cluster {
    /// The PID of daemon `name` (`mon.a`, `osd.0`).
    pub fn daemon_pid(&self, name: &str) -> u32 {
        let path = self.dir.join("run").join(format!("{name}.pid"));
        let pid =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        pid.trim().parse().expect("a PID")
    }

    /// The monitor's port, as the configuration names it.
    pub fn mon_port(&self) -> u16 {
        let conf = std::fs::read_to_string(&self.conf).expect("ceph.conf");
        conf.lines()
            .find_map(|l| l.strip_prefix("mon host = v1:127.0.0.1:"))
            .and_then(|p| p.trim().parse().ok())
            .expect("mon host in ceph.conf")
    }

    /// A new image of `size` whose metadata (header, barrier object, the
    /// pool's own objects) is on osd.1 and whose data is on osd.0: two
    /// pools, each placed by a CRUSH rule on one OSD's device class, the
    /// image in one with its data in the other (`rbd create
    /// --data-pool`). Needs a cluster from [`ceph_two_osds`].
    pub fn split_image(&self, hint: &str, size: &str) -> super::Image<'_> {
        let (meta, data) = SPLIT.get_or_init(|| self.split_pools());
        let name = super::unique(hint);
        let spec = format!("{meta}/{name}");
        self.ok(
            "rbd",
            &[
                "create",
                "--size",
                size,
                "--image-feature",
                "layering",
                "--data-pool",
                data,
                &spec,
            ],
        );
        self.adopt(meta, &name)
    }

    fn split_pools(&self) -> (String, String) {
        let (meta, data) = ("braid-meta".to_owned(), "braid-data".to_owned());
        for (osd, class) in [("osd.0", "behind"), ("osd.1", "ahead")] {
            self.ok("ceph", &["osd", "crush", "rm-device-class", osd]);
            self.ok("ceph", &["osd", "crush", "set-device-class", class, osd]);
            let rule = format!("on-{class}");
            self.ok(
                "ceph",
                &[
                    "osd",
                    "crush",
                    "rule",
                    "create-replicated",
                    &rule,
                    "default",
                    "osd",
                    class,
                ],
            );
        }
        for (pool, rule) in [(&meta, "on-ahead"), (&data, "on-behind")] {
            self.ok(
                "ceph",
                &["osd", "pool", "create", pool, "8", "8", "replicated", rule],
            );
        }
        self.ok("rbd", &["pool", "init", &meta]);
        self.ok(
            "ceph",
            &["osd", "pool", "application", "enable", &data, "rbd"],
        );
        (meta, data)
    }

    /// Write operations the OSD has done (`op_w` of its `perf dump`).
    pub fn osd_writes(&self, osd: u32) -> u64 {
        let said = self.admin(
            &format!("osd.{osd}"),
            &serde_json::json!({"prefix": "perf dump"}),
        );
        let v: serde_json::Value = serde_json::from_str(&said).expect("perf dump is JSON");
        v["osd"]["op_w"].as_u64().expect("osd op_w")
    }
}

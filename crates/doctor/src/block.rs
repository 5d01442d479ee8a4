//! Block devices: finding a device by number or name, the devices under it
//! (an md array's members, a partition's disk), and the checks on a disk's
//! request queue (`/sys/block/X/queue/`): I/O scheduler, `nr_requests`,
//! `read_ahead_kb`, and whether the write cache the kernel believes in is
//! the one the disk has.

use crate::finding::{Finding, Fix, Severity, Subject};
use crate::parse;
use crate::root::Root;

/// A block device, by its kernel name (`sda`, `sda1`, `md0`, `dm-0`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockDev {
    pub name: String,
    /// Its sysfs directory (`/sys/block/sda/sda1` for a partition).
    pub sys: String,
    /// For a partition, the whole disk it is on.
    pub disk: Option<String>,
}

impl BlockDev {
    /// The device whose request queue serves this one: the disk of a
    /// partition, else itself.
    pub fn queue_dir(&self) -> String {
        match &self.disk {
            Some(d) => format!("/sys/block/{d}/queue"),
            None => format!("{}/queue", self.sys),
        }
    }
}

/// Every block device and partition under `/sys/block`.
pub fn all(root: &Root) -> Vec<BlockDev> {
    let mut out = Vec::new();
    for disk in root.list("/sys/block") {
        let sys = format!("/sys/block/{disk}");
        for part in root.list(&sys) {
            if part.starts_with(&disk) && root.exists(&format!("{sys}/{part}/partition")) {
                out.push(BlockDev {
                    name: part.clone(),
                    sys: format!("{sys}/{part}"),
                    disk: Some(disk.clone()),
                });
            }
        }
        out.push(BlockDev {
            name: disk,
            sys,
            disk: None,
        });
    }
    out
}

/// The device with this `major:minor` (each device's `dev` file).
pub fn by_number(root: &Root, major: u32, minor: u32) -> Option<BlockDev> {
    let want = format!("{major}:{minor}");
    all(root)
        .into_iter()
        .find(|d| root.read(&format!("{}/dev", d.sys)).as_deref() == Some(want.as_str()))
}

/// The device of this kernel name.
pub fn by_name(root: &Root, name: &str) -> Option<BlockDev> {
    all(root).into_iter().find(|d| d.name == name)
}

/// The device and everything under it, top first: an md or dm device's
/// members (`slaves/`) and a partition's disk, recursively, each once.
pub fn stack(root: &Root, top: &BlockDev) -> Vec<BlockDev> {
    let mut out = vec![top.clone()];
    let mut i = 0;
    // Bounded by the number of devices there are: each is added once.
    while i < out.len() {
        let dev = out[i].clone();
        let mut under = root.list(&format!("{}/slaves", dev.sys));
        // A partition's queue is its disk's.
        under.extend(dev.disk.clone());
        for member in under {
            if out.iter().all(|d| d.name != member) {
                if let Some(m) = by_name(root, &member) {
                    out.push(m);
                }
            }
        }
        i += 1;
    }
    out
}

/// Checks of one device's queue. Partitions are checked through their
/// disk; md and dm devices (bio-based, no `mq/`) only for read-ahead.
pub fn check_queue(root: &Root, dev: &BlockDev) -> Vec<Finding> {
    if dev.disk.is_some() {
        return Vec::new();
    }
    let q = dev.queue_dir();
    let subject = Subject::Device(dev.name.clone());
    let mut out = Vec::new();
    out.extend(read_ahead(root, &q, &subject));
    if !root.exists(&format!("{}/mq", dev.sys)) {
        return out;
    }
    let rotational = root.number::<u8>(&format!("{q}/rotational"));
    out.extend(scheduler(root, &q, rotational, &subject));
    out.extend(nr_requests(root, dev, &q, &subject));
    out.extend(write_cache(root, dev, &q, &subject));
    out
}

fn read_ahead(root: &Root, q: &str, subject: &Subject) -> Option<Finding> {
    let path = format!("{q}/read_ahead_kb");
    let ra: u64 = root.number(&path)?;
    let opt_io = root
        .number::<u64>(&format!("{q}/optimal_io_size"))
        .unwrap_or(0);
    // The kernel's own default: twice the optimal I/O size (an md
    // array's full stripe), at least 128 KiB (VM_READAHEAD_PAGES).
    let want = (2 * opt_io / 1024).max(128);
    let mut f = Finding::ok(
        "read-ahead",
        subject.clone(),
        format!("read-ahead {ra} KiB covers sequential reads"),
    )
    .read(&path, ra.to_string());
    if opt_io > 0 {
        f = f.read(format!("{q}/optimal_io_size"), opt_io.to_string());
    }
    if ra < want {
        f.severity = Severity::Warn;
        f.why = format!(
            "read-ahead of {ra} KiB (below {want} KiB{}) makes every sequential read through \
             the page cache wait for the disk in small pieces: a path can carry no more than the \
             disk delivers",
            if opt_io > 0 {
                ", twice the full stripe"
            } else {
                ""
            }
        );
        f = f.fix(Fix::Run(format!("echo {want} > {path}")));
    }
    Some(f)
}

fn scheduler(root: &Root, q: &str, rotational: Option<u8>, subject: &Subject) -> Option<Finding> {
    let path = format!("{q}/scheduler");
    let text = root.read(&path)?;
    let active = parse::scheduler(&text)?;
    let offered: Vec<&str> = text
        .split_whitespace()
        .map(|w| w.trim_matches(['[', ']']))
        .collect();
    let mut f = Finding::ok(
        "io-scheduler",
        subject.clone(),
        format!("{active} suits this kind of disk"),
    )
    .read(&path, text.clone());
    if let Some(r) = rotational {
        f = f.read(format!("{q}/rotational"), r.to_string());
    }
    let better = |want: &str| offered.contains(&want).then(|| want.to_owned());
    let change = match (rotational, active.as_str()) {
        (Some(1), "none") => better("mq-deadline").or_else(|| better("bfq")).map(|s| {
            (
                s,
                "a spinning disk with no I/O scheduler seeks between the streams of every path \
                 and client in arrival order; a scheduler sorts them and keeps reads from \
                 starving behind writes",
            )
        }),
        (Some(0), "bfq") => better("mq-deadline").or_else(|| better("none")).map(|s| {
            (
                s,
                "bfq spends CPU on every request to share a disk fairly, which at solid-state \
                 rates caps the IOPS all paths together can reach",
            )
        }),
        _ => None,
    };
    if let Some((to, why)) = change {
        f.severity = Severity::Warn;
        f.why = why.to_owned();
        f = f.fix(Fix::Run(format!("echo {to} > {path}")));
    }
    Some(f)
}

fn nr_requests(root: &Root, dev: &BlockDev, q: &str, subject: &Subject) -> Option<Finding> {
    let path = format!("{q}/nr_requests");
    let n: u64 = root.number(&path)?;
    let depth_path = format!("{}/device/queue_depth", dev.sys);
    let depth: Option<u64> = root.number(&depth_path);
    // A disk that takes one command at a time gains nothing from more.
    let floor = depth.map_or(32, |d| d.min(32));
    let mut f = Finding::ok(
        "nr-requests",
        subject.clone(),
        format!("{n} requests may queue at the disk"),
    )
    .read(&path, n.to_string());
    if let Some(d) = depth {
        f = f.read(&depth_path, d.to_string());
    }
    if n < floor {
        let want = depth.map_or(64, |d| (2 * d).clamp(64, 256));
        f.severity = Severity::Warn;
        f.why = format!(
            "only {n} requests may wait at the disk{}: with several paths and clients sending \
             at once the rest queue in software and the disk never sees enough to reorder",
            depth.map_or(String::new(), |d| format!(", which takes {d} at once"))
        );
        f = f.fix(Fix::Run(format!("echo {want} > {path}")));
    }
    Some(f)
}

fn write_cache(root: &Root, dev: &BlockDev, q: &str, subject: &Subject) -> Option<Finding> {
    let path = format!("{q}/write_cache");
    let kernel = root.read(&path)?;
    // What a SCSI/SATA disk itself reports (sd.c cache_type_show).
    let scsi_dir = format!("{}/device/scsi_disk", dev.sys);
    let disk_says = root.list(&scsi_dir).first().and_then(|hctl| {
        let p = format!("{scsi_dir}/{hctl}/cache_type");
        root.read(&p).map(|v| (p, v))
    });
    let mut f = Finding::ok(
        "write-cache",
        subject.clone(),
        if kernel == "write back" {
            "a volatile write cache that the kernel flushes on every FLUSH and FUA".to_owned()
        } else {
            "no volatile write cache: every write is durable when it completes".to_owned()
        },
    )
    .read(&path, kernel.clone());
    if let Some((p, v)) = &disk_says {
        f = f.read(p, v.clone());
        if kernel == "write through" && v.contains("write back") {
            f.severity = Severity::Fail;
            f.why = "the kernel was told this disk has no volatile cache, so it sends no cache \
                     flush, but the disk says it caches writes: a FLUSH braid acknowledges can \
                     still be lost at power failure"
                .into();
            f = f.fix(Fix::Run(format!("echo 'write back' > {path}")));
        }
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_of_a_partition_owns_the_queue() {
        let d = BlockDev {
            name: "sda1".into(),
            sys: "/sys/block/sda/sda1".into(),
            disk: Some("sda".into()),
        };
        assert_eq!(d.queue_dir(), "/sys/block/sda/queue");
    }
}

//! md RAID arrays (`/sys/block/mdX/md/`, `/proc/mdstat`): degraded
//! arrays, a RAID 4/5/6 stripe cache left at its default, a resync or
//! reshape held to `sync_speed_min` while the array serves I/O (with what
//! that costs in days), and a missing write-intent bitmap. The arithmetic
//! is in [`MdArray`]'s methods, apart from the reading.

use crate::finding::{Evidence, Finding, Fix, Severity, Subject};
use crate::parse;
use crate::root::Root;
use crate::units;

/// The kernel's default `stripe_cache_size` (raid5.c NR_STRIPES).
pub const DEFAULT_STRIPE_CACHE: u64 = 256;

/// What an array reports of itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MdArray {
    pub name: String,
    /// `/sys/block/mdX/md`.
    pub dir: String,
    /// `raid5`, `raid6`, `raid1`, ...
    pub level: String,
    pub raid_disks: Option<u64>,
    pub chunk_bytes: Option<u64>,
    pub degraded: Option<u64>,
    /// `idle`, `resync`, `recover`, `reshape`, `check`, `repair`, `frozen`.
    pub sync_action: Option<String>,
    /// Sectors done and in all (per member device).
    pub sync_completed: Option<(u64, u64)>,
    /// KiB/s now.
    pub sync_speed: Option<u64>,
    /// KiB/s and whether the array's own (else the system's).
    pub sync_speed_min: Option<(u64, bool)>,
    pub sync_speed_max: Option<(u64, bool)>,
    pub stripe_cache_size: Option<u64>,
    /// `bitmap/location`: `none`, `+8`, `file`.
    pub bitmap: Option<String>,
    /// This array's lines of `/proc/mdstat`.
    pub mdstat: Vec<String>,
    /// Everything read, in order, as evidence.
    pub read: Vec<Evidence>,
}

/// Every md array under `/sys/block`.
pub fn arrays(root: &Root) -> Vec<MdArray> {
    let mdstat = root.read_raw("/proc/mdstat").unwrap_or_default();
    root.list("/sys/block")
        .into_iter()
        .filter(|n| root.exists(&format!("/sys/block/{n}/md/level")))
        .map(|n| read_array(root, &n, &mdstat))
        .collect()
}

/// Reads one array.
pub fn read_array(root: &Root, name: &str, mdstat: &str) -> MdArray {
    let dir = format!("/sys/block/{name}/md");
    let mut a = MdArray {
        name: name.to_owned(),
        dir: dir.clone(),
        ..MdArray::default()
    };
    let mut get = |file: &str| -> Option<String> {
        let p = format!("{dir}/{file}");
        let v = root.read(&p)?;
        a.read.push(Evidence::new(p, v.clone()));
        Some(v)
    };
    let level = get("level");
    let raid_disks = get("raid_disks");
    let chunk = get("chunk_size");
    let degraded = get("degraded");
    let action = get("sync_action");
    let busy = action
        .as_deref()
        .is_some_and(|s| s != "idle" && s != "frozen");
    let (completed, speed, min, max) = if busy {
        (
            get("sync_completed"),
            get("sync_speed"),
            get("sync_speed_min"),
            get("sync_speed_max"),
        )
    } else {
        (None, None, None, None)
    };
    let stripe = get("stripe_cache_size");
    let bitmap = get("bitmap/location");
    a.level = level.unwrap_or_default();
    // During a reshape these read `new (old)`; the first is what the
    // array is becoming.
    let first = |s: Option<String>| s.and_then(|s| s.split_whitespace().next()?.parse().ok());
    a.raid_disks = first(raid_disks);
    a.chunk_bytes = first(chunk);
    a.degraded = first(degraded);
    a.sync_action = action;
    a.sync_completed = completed.as_deref().and_then(parse::sync_completed);
    a.sync_speed = first(speed);
    a.sync_speed_min = min.as_deref().and_then(parse::sync_speed);
    a.sync_speed_max = max.as_deref().and_then(parse::sync_speed);
    a.stripe_cache_size = first(stripe);
    a.bitmap = bitmap;
    a.mdstat = mdstat_lines(mdstat, name);
    a
}

/// The lines of `/proc/mdstat` about one array: its own and the indented
/// ones after it.
fn mdstat_lines(mdstat: &str, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in mdstat.lines() {
        if line.starts_with(&format!("{name} :")) {
            inside = true;
        } else if !line.starts_with(' ') && !line.starts_with('\t') {
            inside = false;
        }
        if inside && !line.trim().is_empty() {
            out.push(line.trim().to_owned());
        }
    }
    out
}

impl MdArray {
    /// RAID levels with parity, which have a stripe cache.
    pub fn has_parity(&self) -> bool {
        matches!(self.level.as_str(), "raid4" | "raid5" | "raid6")
    }

    /// Levels that survive a disk failure.
    pub fn redundant(&self) -> bool {
        matches!(
            self.level.as_str(),
            "raid1" | "raid4" | "raid5" | "raid6" | "raid10"
        )
    }

    /// A resync, recovery or reshape is running: work that must finish
    /// before the array is whole or its new shape is in use (a `check` or
    /// `repair` scrub is left alone: it should yield to I/O).
    pub fn rebuilding(&self) -> bool {
        matches!(
            self.sync_action.as_deref(),
            Some("resync" | "recover" | "reshape")
        )
    }

    /// Bytes per member device still to do.
    pub fn remaining_bytes(&self) -> Option<u64> {
        let (done, total) = self.sync_completed?;
        Some((total - done) * 512)
    }

    /// Seconds to finish at `kib_per_s`.
    pub fn seconds_at(&self, kib_per_s: u64) -> Option<f64> {
        (kib_per_s > 0).then_some(self.remaining_bytes()? as f64 / (kib_per_s as f64 * 1024.0))
    }

    /// Memory a stripe cache of `n` entries takes: one page per member
    /// device per entry (raid5.c `raid5_set_cache_size`).
    pub fn stripe_cache_bytes(&self, n: u64) -> u64 {
        n * 4096 * self.raid_disks.unwrap_or(1)
    }

    /// Devices holding data in a full stripe.
    pub fn data_disks(&self) -> Option<u64> {
        let parity = match self.level.as_str() {
            "raid4" | "raid5" => 1,
            "raid6" => 2,
            _ => return None,
        };
        self.raid_disks?.checked_sub(parity)
    }

    fn summary(&self) -> String {
        let mut s = self.level.clone();
        if let Some(n) = self.raid_disks {
            s.push_str(&format!(", {n} devices"));
        }
        if let Some(c) = self.chunk_bytes.filter(|c| *c > 0) {
            s.push_str(&format!(", {} chunk", units::bytes(c)));
        }
        if let Some(a) = &self.sync_action {
            s.push_str(&format!(", {a}"));
        }
        s
    }
}

/// The speed a rebuild is given at least, with `fix_sync_speed`: enough
/// for a multi-terabyte disk in hours, while leaving the rest of the
/// disks' bandwidth to clients.
pub const SUGGESTED_SYNC_MIN: u64 = 50_000;

/// Checks of one array; `mem_total` (bytes) bounds the stripe cache
/// suggested.
pub fn check(a: &MdArray, mem_total: Option<u64>) -> Vec<Finding> {
    let subject = Subject::Device(a.name.clone());
    let mut out = Vec::new();
    let progress: Vec<Evidence> = a
        .mdstat
        .iter()
        .filter(|l| l.contains('%') || l.starts_with(&a.name))
        .map(|l| Evidence::new("/proc/mdstat", l.clone()))
        .collect();

    if let Some(d) = a.degraded {
        let mut f = Finding::ok(
            "md-degraded",
            subject.clone(),
            format!("{}: all members present", a.summary()),
        )
        .read(format!("{}/degraded", a.dir), d.to_string());
        if d > 0 {
            f.severity = Severity::Fail;
            f.why = format!(
                "{} is missing {d} device(s): one more failure can lose the array, and every \
                 read of a missing device is rebuilt from the others at a fraction of the speed",
                a.name
            );
            f = f.with(progress.clone()).fix(Fix::Manual(format!(
                "replace the failed disk: mdadm --manage /dev/{} --add /dev/NEWDISK",
                a.name
            )));
        }
        out.push(f);
    }

    if a.has_parity() {
        out.push(stripe_cache(a, &subject, mem_total, &progress));
    }
    if a.rebuilding() {
        out.push(sync_speed(a, &subject, &progress));
    }
    if a.redundant() {
        if let Some(b) = &a.bitmap {
            let path = format!("{}/bitmap/location", a.dir);
            let mut f = Finding::ok(
                "md-bitmap",
                subject.clone(),
                "a write-intent bitmap: after a crash only the regions being written are resynced",
            )
            .read(&path, b.clone());
            if b == "none" {
                f.severity = Severity::Warn;
                f.why = format!(
                    "without a write-intent bitmap an unclean shutdown makes {} resync every \
                     stripe, hours to days of degraded speed for every path",
                    a.name
                );
                f = f.fix(Fix::Run(format!(
                    "mdadm --grow --bitmap=internal /dev/{}",
                    a.name
                )));
            }
            out.push(f);
        }
    }
    out
}

fn stripe_cache(
    a: &MdArray,
    subject: &Subject,
    mem_total: Option<u64>,
    progress: &[Evidence],
) -> Finding {
    let path = format!("{}/stripe_cache_size", a.dir);
    let Some(size) = a.stripe_cache_size else {
        return Finding::ok(
            "md-stripe-cache",
            subject.clone(),
            "no stripe cache reported",
        )
        .with(
            a.read
                .iter()
                .filter(|e| e.source.ends_with("/level"))
                .cloned(),
        );
    };
    let mut f = Finding::ok(
        "md-stripe-cache",
        subject.clone(),
        format!(
            "{}: stripe cache of {size} entries ({})",
            a.summary(),
            units::bytes(a.stripe_cache_bytes(size))
        ),
    )
    .read(&path, size.to_string());
    if size > DEFAULT_STRIPE_CACHE {
        return f;
    }
    // The largest of these whose memory stays under 1/32 of RAM.
    let budget = mem_total.map_or(u64::MAX, |m| m / 32);
    let want = [32768u64, 16384, 8192, 4096]
        .into_iter()
        .find(|n| a.stripe_cache_bytes(*n) <= budget);
    f.severity = Severity::Warn;
    let rebuild = if a.rebuilding() {
        let action = a.sync_action.as_deref().unwrap_or("resync");
        format!(
            ", and a {action} with it runs at a few MB/s{}",
            a.sync_speed
                .map_or(String::new(), |s| format!(" ({s} KiB/s now)"))
        )
    } else {
        String::new()
    };
    f.why = format!(
        "the default {size}-entry stripe cache makes {} read back old data and parity for most \
         writes instead of writing full stripes{rebuild}",
        a.name
    );
    f = f.with(progress.iter().cloned());
    if let Some(m) = mem_total {
        f = f.read("/proc/meminfo", format!("MemTotal: {} kB", m / 1024));
    }
    f.fix = Some(match want {
        Some(n) => Fix::Run(format!("echo {n} > {path}")),
        None => Fix::Manual(format!(
            "raise {path} to 4096 once the host has {} of memory to spare",
            units::bytes(a.stripe_cache_bytes(4096))
        )),
    });
    if let Some(n) = want {
        f.why.push_str(&format!(
            "; {n} entries take {}",
            units::bytes(a.stripe_cache_bytes(n))
        ));
    }
    f
}

fn sync_speed(a: &MdArray, subject: &Subject, progress: &[Evidence]) -> Finding {
    let action = a.sync_action.clone().unwrap_or_default();
    let min_path = format!("{}/sync_speed_min", a.dir);
    let evidence: Vec<Evidence> = a
        .read
        .iter()
        .filter(|e| {
            [
                "/sync_action",
                "/sync_completed",
                "/sync_speed",
                "/sync_speed_min",
                "/sync_speed_max",
            ]
            .iter()
            .any(|s| e.source.ends_with(s))
        })
        .cloned()
        .collect();
    let mut f = Finding::ok(
        "md-sync-speed",
        subject.clone(),
        format!("{action} may run at its full speed while the array serves I/O"),
    )
    .with(evidence)
    .with(progress.iter().cloned());
    let Some((min, _)) = a.sync_speed_min else {
        return f;
    };
    if min >= SUGGESTED_SYNC_MIN / 5 {
        return f;
    }
    let left = a.remaining_bytes().map_or(String::new(), |b| {
        format!("{} per device left", units::bytes(b))
    });
    let now = match (a.sync_speed, a.seconds_at(a.sync_speed.unwrap_or(0))) {
        (Some(s), Some(t)) => format!(
            "at the {} it runs now, {}; ",
            units::mbytes_per_s(s as f64 * 1024.0),
            units::duration(t)
        ),
        _ => String::new(),
    };
    let floor = a.seconds_at(min).map_or(String::new(), |t| {
        format!(
            "held to sync_speed_min ({min} KiB/s) while clients use the array, {}",
            units::duration(t)
        )
    });
    let fixed = a.seconds_at(SUGGESTED_SYNC_MIN).map_or(String::new(), |t| {
        format!(
            "; with sync_speed_min {SUGGESTED_SYNC_MIN}, at most {} if the disks keep up",
            units::duration(t)
        )
    });
    f.severity = Severity::Warn;
    f.why = format!(
        "md gives a {action} only {min} KiB/s when other I/O is present, so serving volumes \
         stretches it: {left}{}{now}{floor}{fixed}",
        if left.is_empty() { "" } else { ": " }
    );
    f.fix(Fix::Run(format!("echo {SUGGESTED_SYNC_MIN} > {min_path}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reshaping() -> MdArray {
        MdArray {
            name: "md0".into(),
            dir: "/sys/block/md0/md".into(),
            level: "raid5".into(),
            raid_disks: Some(4),
            chunk_bytes: Some(512 * 1024),
            degraded: Some(0),
            sync_action: Some("reshape".into()),
            // 2 TB disks, 2.1% done.
            sync_completed: Some((82_069_504, 3_906_764_800)),
            sync_speed: Some(3729),
            sync_speed_min: Some((1000, false)),
            sync_speed_max: Some((200_000, false)),
            stripe_cache_size: Some(256),
            bitmap: Some("none".into()),
            ..MdArray::default()
        }
    }

    #[test]
    fn rebuild_arithmetic() {
        let a = reshaping();
        assert_eq!(
            a.remaining_bytes(),
            Some((3_906_764_800 - 82_069_504) * 512)
        );
        let days_at_min = a.seconds_at(1000).unwrap() / 86400.0;
        assert!((22.0..23.0).contains(&days_at_min), "{days_at_min}");
        let hours_fixed = a.seconds_at(SUGGESTED_SYNC_MIN).unwrap() / 3600.0;
        assert!((10.0..11.5).contains(&hours_fixed), "{hours_fixed}");
        assert_eq!(a.stripe_cache_bytes(8192), 128 << 20);
        assert_eq!(a.data_disks(), Some(3));
    }

    #[test]
    fn defaults_warn_with_the_cost_and_tuned_settings_do_not() {
        let a = reshaping();
        let f = check(&a, Some(24 << 30));
        let by = |c: &str| f.iter().find(|x| x.check == c).unwrap();
        assert_eq!(by("md-stripe-cache").severity, Severity::Warn);
        assert_eq!(
            by("md-stripe-cache").fix,
            Some(Fix::Run(
                "echo 32768 > /sys/block/md0/md/stripe_cache_size".into()
            ))
        );
        let s = by("md-sync-speed");
        assert_eq!(s.severity, Severity::Warn);
        assert!(s.why.contains("22.") && s.why.contains("days"), "{}", s.why);
        assert_eq!(by("md-bitmap").severity, Severity::Warn);
        // A small host gets a smaller cache.
        let small = check(&a, Some(2 << 30));
        let sc = small.iter().find(|x| x.check == "md-stripe-cache").unwrap();
        assert_eq!(
            sc.fix,
            Some(Fix::Run(
                "echo 4096 > /sys/block/md0/md/stripe_cache_size".into()
            ))
        );

        let tuned = MdArray {
            stripe_cache_size: Some(8192),
            sync_speed_min: Some((50_000, true)),
            bitmap: Some("+8".into()),
            ..reshaping()
        };
        assert!(check(&tuned, None)
            .iter()
            .all(|f| f.severity == Severity::Ok));
    }

    #[test]
    fn mdstat_lines_of_one_array() {
        let text = "Personalities : [raid6] [raid5] [raid4]\nmd1 : active raid6 sdf[0]\n      1 blocks\nmd0 : active raid5 sdb[0]\n      [>....]  reshape =  2.1% (1/2) finish=1.0min speed=3729K/sec\n\nunused devices: <none>\n";
        let l = mdstat_lines(text, "md0");
        assert_eq!(l.len(), 2);
        assert!(l[1].starts_with("[>"));
    }
}

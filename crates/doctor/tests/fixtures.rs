//! The storage-host checks over captured `/sys` and `/proc` trees
//! (`fixtures/`, see its README): each misconfiguration the kernel here
//! cannot make (md RAID, link speed and duplex, bonds) is found with the
//! values in its files, and the healthy tree gives no warning.

use std::path::PathBuf;

use braid_doctor::serve::{self, ServeScope};
use braid_doctor::{ExportRef, Finding, Report, Root, Severity, Subject};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

fn check(name: &str, exports: &[&str]) -> Report {
    let scope = ServeScope {
        exports: exports
            .iter()
            .map(|e| e.parse().unwrap())
            .collect::<Vec<ExportRef>>(),
        portal_ifaces: Vec::new(),
        portals: Vec::new(),
    };
    serve::check(&Root::at(fixture(name)), &scope)
}

/// The one finding of `check` about `subject`.
fn found<'a>(r: &'a Report, check: &str, subject: Subject) -> &'a Finding {
    let all: Vec<&Finding> = r
        .findings
        .iter()
        .filter(|f| f.check == check && f.subject == subject)
        .collect();
    assert_eq!(all.len(), 1, "{check} on {subject}: {:#?}", r.findings);
    all[0]
}

/// The evidence value read from `source`, which must be the fixture
/// file's content.
fn value(f: &Finding, fixture_name: &str, source: &str) -> String {
    let e = f
        .evidence
        .iter()
        .find(|e| e.source == source)
        .unwrap_or_else(|| panic!("{} has no evidence from {source}: {f:#?}", f.check));
    let on_disk =
        std::fs::read_to_string(fixture(fixture_name).join(source.trim_start_matches('/')))
            .unwrap();
    assert_eq!(e.value, on_disk.trim(), "{source}");
    e.value.clone()
}

#[test]
fn raid5_mid_reshape_with_the_default_stripe_cache() {
    let r = check("raid5-reshape", &["vol=/srv/vol.img"]);
    let md0 = Subject::Device("md0".into());
    let sc = found(&r, "md-stripe-cache", md0.clone());
    assert_eq!(sc.severity, Severity::Warn);
    assert_eq!(
        value(sc, "raid5-reshape", "/sys/block/md0/md/stripe_cache_size"),
        "256"
    );
    assert!(sc.why.contains("reshape"), "{}", sc.why);
    let fix = sc.fix.as_ref().unwrap().runnable().unwrap();
    assert!(
        fix.ends_with("> /sys/block/md0/md/stripe_cache_size"),
        "{fix}"
    );

    let sp = found(&r, "md-sync-speed", md0.clone());
    assert_eq!(sp.severity, Severity::Warn);
    assert_eq!(
        value(sp, "raid5-reshape", "/sys/block/md0/md/sync_action"),
        "reshape"
    );
    assert_eq!(
        value(sp, "raid5-reshape", "/sys/block/md0/md/sync_speed_min"),
        "1000 (system)"
    );
    value(sp, "raid5-reshape", "/sys/block/md0/md/sync_completed");
    // What it costs: 1.8 TiB per device at 1000 KiB/s is 22 days.
    assert!(sp.why.contains("22.1 days"), "{}", sp.why);
    assert!(sp
        .evidence
        .iter()
        .any(|e| e.source == "/proc/mdstat" && e.value.contains("reshape =")));

    assert_eq!(found(&r, "md-bitmap", md0.clone()).severity, Severity::Warn);
    assert_eq!(found(&r, "md-degraded", md0).severity, Severity::Ok);
    // The export sits on the array, found through mountinfo.
    let e = found(&r, "export-backing", Subject::Export("vol".into()));
    assert_eq!(e.severity, Severity::Ok);
    assert!(e.why.contains("xfs (/dev/md0)"), "{}", e.why);
    // Every member disk's queue is checked, and is fine.
    for d in ["sdb", "sdc", "sdd", "sde"] {
        assert_eq!(
            found(&r, "io-scheduler", Subject::Device(d.into())).severity,
            Severity::Ok
        );
    }
}

#[test]
fn raid6_resyncing_at_sync_speed_min_1000() {
    let r = check("raid6-resync", &[]);
    let md1 = Subject::Device("md1".into());
    let sp = found(&r, "md-sync-speed", md1.clone());
    assert_eq!(sp.severity, Severity::Warn);
    assert_eq!(
        value(sp, "raid6-resync", "/sys/block/md1/md/sync_action"),
        "resync"
    );
    assert_eq!(
        value(sp, "raid6-resync", "/sys/block/md1/md/sync_speed_min"),
        "1000 (system)"
    );
    assert_eq!(
        value(sp, "raid6-resync", "/sys/block/md1/md/sync_speed"),
        "1012"
    );
    assert_eq!(
        sp.fix.as_ref().unwrap().runnable(),
        Some("echo 50000 > /sys/block/md1/md/sync_speed_min")
    );
    // Its stripe cache was raised already, and it has a bitmap.
    assert_eq!(
        found(&r, "md-stripe-cache", md1.clone()).severity,
        Severity::Ok
    );
    assert_eq!(found(&r, "md-bitmap", md1).severity, Severity::Ok);
    assert_eq!(
        r.problems().count(),
        1,
        "{:#?}",
        r.problems().collect::<Vec<_>>()
    );
}

#[test]
fn nic_at_100_half_duplex_and_bonds_that_hold_one_client_to_one_link() {
    let r = check("nics", &[]);
    let eth1 = Subject::Interface("eth1".into());
    let speed = found(&r, "link-speed", eth1.clone());
    assert_eq!(speed.severity, Severity::Warn);
    assert_eq!(value(speed, "nics", "/sys/class/net/eth1/speed"), "100");
    let duplex = found(&r, "duplex", eth1);
    assert_eq!(duplex.severity, Severity::Fail);
    assert_eq!(value(duplex, "nics", "/sys/class/net/eth1/duplex"), "half");
    assert_eq!(
        found(&r, "link-speed", Subject::Interface("eth0".into())).severity,
        Severity::Ok
    );

    let rr = found(&r, "bond-mode", Subject::Interface("bond0".into()));
    assert_eq!(rr.severity, Severity::Warn);
    assert_eq!(
        value(rr, "nics", "/sys/class/net/bond0/bonding/mode"),
        "balance-rr 0"
    );
    assert!(rr.why.contains("out of order"), "{}", rr.why);

    let lacp = found(&r, "bond-mode", Subject::Interface("bond1".into()));
    assert_eq!(lacp.severity, Severity::Warn);
    assert_eq!(
        value(lacp, "nics", "/sys/class/net/bond1/bonding/mode"),
        "802.3ad 4"
    );
    assert_eq!(
        value(
            lacp,
            "nics",
            "/sys/class/net/bond1/bonding/xmit_hash_policy"
        ),
        "layer2 0"
    );
    assert!(lacp.why.contains("one link"), "{}", lacp.why);
    assert_eq!(
        lacp.fix.as_ref().unwrap().runnable(),
        Some("echo layer3+4 > /sys/class/net/bond1/bonding/xmit_hash_policy")
    );
    // Both slaves joined the aggregator (from /proc/net/bonding/bond1).
    assert_eq!(
        found(&r, "bond-lacp", Subject::Interface("bond1".into())).severity,
        Severity::Ok
    );
    // Slaves are checked as NICs of their own.
    assert_eq!(
        found(&r, "duplex", Subject::Interface("eth5".into())).severity,
        Severity::Ok
    );
}

#[test]
fn tmpfs_export_and_a_disk_queue_set_against_itself() {
    let r = check(
        "tmpfs-export",
        &["ram=/srv/ram/vol.img", "disk=/data/vol.img"],
    );
    let ram = found(&r, "export-backing", Subject::Export("ram".into()));
    assert_eq!(ram.severity, Severity::Fail);
    assert!(ram
        .evidence
        .iter()
        .any(|e| e.source == "/proc/self/mountinfo" && e.value.contains("tmpfs")));
    assert!(
        ram.fix.as_ref().unwrap().runnable().is_none(),
        "moving data is by hand"
    );

    let sdb = || Subject::Device("sdb".into());
    let wc = found(&r, "write-cache", sdb());
    assert_eq!(wc.severity, Severity::Fail);
    assert_eq!(
        value(wc, "tmpfs-export", "/sys/block/sdb/queue/write_cache"),
        "write through"
    );
    assert_eq!(
        value(
            wc,
            "tmpfs-export",
            "/sys/block/sdb/device/scsi_disk/1:0:0:0/cache_type"
        ),
        "write back"
    );
    let sched = found(&r, "io-scheduler", sdb());
    assert_eq!(sched.severity, Severity::Warn);
    assert_eq!(
        sched.fix.as_ref().unwrap().runnable(),
        Some("echo mq-deadline > /sys/block/sdb/queue/scheduler")
    );
    let nr = found(&r, "nr-requests", sdb());
    assert_eq!(
        value(nr, "tmpfs-export", "/sys/block/sdb/queue/nr_requests"),
        "4"
    );
    assert_eq!(nr.severity, Severity::Warn);
    let ra = found(&r, "read-ahead", sdb());
    assert_eq!(
        value(ra, "tmpfs-export", "/sys/block/sdb/queue/read_ahead_kb"),
        "8"
    );
    assert_eq!(ra.severity, Severity::Warn);
}

#[test]
fn a_healthy_host_gives_no_warning() {
    let r = check("healthy", &["vol=/srv/vol.img"]);
    assert!(r.findings.len() > 10, "{:#?}", r.findings);
    let problems: Vec<&Finding> = r.problems().collect();
    assert!(problems.is_empty(), "{problems:#?}");
    // It did look at what the others flag.
    for check in [
        "md-stripe-cache",
        "md-bitmap",
        "export-backing",
        "link-speed",
        "duplex",
    ] {
        assert!(
            r.findings.iter().any(|f| f.check == check),
            "{check} not run"
        );
    }
}

#[test]
fn kernel_path_nbd_timeouts_dm_multipath_and_nic_interrupts() {
    use braid_doctor::client::{self, ClientScope};
    let r = client::check(
        &Root::at(fixture("kernel-path")),
        &ClientScope {
            volumes: Vec::new(),
            probe_budget: None,
        },
    );
    // The module is there to load.
    let m = found(&r, "nbd-module", Subject::Host);
    assert_eq!(m.severity, Severity::Ok);
    assert!(m.why.contains("modprobe nbd"), "{}", m.why);
    // nbd0 gives up after 30 s, before braid's default 60 s no-path wait.
    let t = found(&r, "nbd-timeout", Subject::Device("nbd0".into()));
    assert_eq!(t.severity, Severity::Fail);
    assert!(t
        .evidence
        .iter()
        .any(|e| e.source == "/proc/4242/cmdline" && e.value.ends_with("-timeout 30")));
    assert_eq!(
        t.fix.as_ref().unwrap().runnable(),
        Some("echo 90000 > /sys/block/nbd0/queue/io_timeout")
    );
    assert_eq!(
        found(&r, "nbd-timeout", Subject::Device("nbd1".into())).severity,
        Severity::Ok
    );
    // nbd1 is also a path of a dm-multipath map.
    let mp = found(&r, "dm-multipath", Subject::Device("nbd1".into()));
    assert_eq!(mp.severity, Severity::Warn);
    assert_eq!(
        value(mp, "kernel-path", "/sys/block/dm-3/dm/uuid"),
        "mpath-36001405e2f3c9a41b2d4d1b8c0f1a2b3"
    );
    // eth0's interrupts all on CPU0; eth1 has one queue and no RPS.
    let irq = found(&r, "irq-spread", Subject::Interface("eth0".into()));
    assert_eq!(irq.severity, Severity::Warn);
    assert!(irq.why.contains("CPU0"), "{}", irq.why);
    let rps = found(&r, "rps", Subject::Interface("eth1".into()));
    assert_eq!(rps.severity, Severity::Warn);
    assert_eq!(
        rps.fix.as_ref().unwrap().runnable(),
        Some("echo f > /sys/class/net/eth1/queues/rx-0/rps_cpus")
    );
    assert_eq!(
        found(&r, "irq-spread", Subject::Interface("eth1".into())).severity,
        Severity::Ok
    );
}

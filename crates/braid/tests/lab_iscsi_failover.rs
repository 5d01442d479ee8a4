//! Failover over iSCSI on real links, against tgt and against braid's own
//! target: under a verified write-then-read workload, a link goes down, a
//! path turns into a silent blackhole, a path flaps, every path is cut for
//! less than the no-path timeout and then for more. Nothing but the last
//! outage may fail I/O, and what was acknowledged is read back intact.
//!
//! One workload per target walks through every fault in turn (one lab,
//! one session set), so the suite costs a lab's setup once per target;
//! the two targets' runs go at once, each in its own lab.
//! Against tgt, failed paths are fenced by session reinstatement and
//! LOGICAL UNIT RESET (the default for tgt); against braid's target by persistent reservation
//! (`--persistent-reservations`): there the failed sessions' keys must have
//! been preempted, and closing the volume must leave no key registered.
//!
//! The same links cut under a load through `braid attach`'s socket, as the
//! kernel and qemu reach an iSCSI volume (`attachload::cut_each_path`).

mod attachload;
mod common;
mod failkit;
mod iscsikit;
mod iscsilab;
mod labkit;
mod tgtkit;

use braid_test_needs::needs;

use std::time::{Duration, Instant};

use braid_lab::{Cut, Lab, LabConfig, Rate, Side};
use failkit::Workload;
use iscsilab::{Kind, Target};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn sleep_until(t: Instant) {
    std::thread::sleep(t.saturating_duration_since(Instant::now()));
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// What the fault script did, in the workload's time.
#[derive(Default)]
struct Moments {
    link_down: Duration,
    link_up: Duration,
    blackhole: Duration,
    blackhole_gone: Duration,
    short_outage_end: Duration,
    long_outage: Duration,
    long_outage_end: Duration,
}

/// The no-path timeout: longer than the short outage, shorter than the
/// long one.
const NO_PATH: Duration = Duration::from_secs(3);

/// Every fault in turn on `lab`, times from `start`.
fn faults(lab: &Lab, start: Instant) -> Moments {
    let mut m = Moments::default();
    let at = |s: f64| sleep_until(start + secs(s));
    at(1.5);
    lab.cut(1, Cut::LinkDown).unwrap();
    m.link_down = start.elapsed();
    at(3.5);
    lab.restore(1).unwrap();
    m.link_up = start.elapsed();
    at(5.5);
    lab.cut(2, Cut::Blackhole).unwrap();
    m.blackhole = start.elapsed();
    at(7.5);
    lab.restore(2).unwrap();
    m.blackhole_gone = start.elapsed();
    // Flapping: down and up every half second, four times.
    for i in 0..8 {
        at(9.5 + 0.5 * f64::from(i));
        if i % 2 == 0 {
            lab.cut(1, Cut::LinkDown).unwrap();
        } else {
            lab.restore(1).unwrap();
        }
    }
    // Every path, for half the no-path timeout.
    at(14.0);
    lab.cut(1, Cut::Blackhole).unwrap();
    lab.cut(2, Cut::Blackhole).unwrap();
    at(15.5);
    lab.restore(1).unwrap();
    lab.restore(2).unwrap();
    m.short_outage_end = start.elapsed();
    // Every path, for well past it.
    at(17.5);
    lab.cut(1, Cut::Blackhole).unwrap();
    lab.cut(2, Cut::Blackhole).unwrap();
    m.long_outage = start.elapsed();
    at(22.0);
    lab.restore(1).unwrap();
    lab.restore(2).unwrap();
    m.long_outage_end = start.elapsed();
    m
}

const WORK: Workload = Workload {
    blocks: 128,
    bs: 256 * 1024,
    depth: 8,
    duration: Duration::from_secs(25),
};

fn every_fault_over(kind: Kind) {
    let lab = Lab::up(LabConfig::new([Rate::GBIT, Rate::GBIT])).unwrap();
    let target = Target::start(&lab, kind, 3260);
    let uri = target.uri();
    let portals = target.named_portals();
    let start = Instant::now();
    let mut m = Moments::default();
    let (log, bad, preempts, leftover_tasks) = std::thread::scope(|s| {
        s.spawn(|| m = faults(&lab, start));
        lab.enter(Side::Client, || {
            let rt = rt();
            let out = rt.block_on(async {
                let vol = failkit::open(&uri, |c| {
                    c.portals = portals;
                    c.no_path_timeout = Some(NO_PATH);
                    c.persistent_reservations = kind == Kind::Braid;
                })
                .await;
                assert_eq!(vol.report().paths.len(), 2, "both portals are paths");
                let log = failkit::run(vol.clone(), WORK, start).await;
                // The links are back: what was acknowledged reads back.
                let bad = failkit::check_acknowledged(&vol, &log, WORK.bs).await;
                // Fences while the volume was open (closing preempts too).
                let preempts = target.log().matches("PREEMPT AND ABORT").count();
                vol.close().await;
                (log, bad, preempts)
            });
            // Reconnects, fences and ALUA watchers end by themselves.
            let deadline = Instant::now() + Duration::from_secs(5);
            while rt.metrics().num_alive_tasks() > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            (out.0, out.1, out.2, rt.metrics().num_alive_tasks())
        })
        .unwrap()
    });
    let context = format!("{kind:?}\n{}", target.log());
    if kind == Kind::Braid {
        assert!(
            preempts > 0,
            "no failed path was fenced by PREEMPT AND ABORT\n{context}"
        );
        let keys = lab
            .enter(Side::Client, || {
                iscsikit::Initiator::login(target.portals[0], iscsilab::BRAID_IQN).registered_keys()
            })
            .unwrap();
        assert!(
            keys.is_empty(),
            "keys left registered after the volume closed: {keys:x?}\n{context}"
        );
    }
    assert!(log.mismatches.is_empty(), "{:?}\n{context}", log.mismatches);
    assert!(bad.is_empty(), "acknowledged data lost: {bad:?}\n{context}");
    assert_eq!(leftover_tasks, 0, "tasks left running in the initiator");

    // Only the outage longer than the no-path timeout may fail I/O, and
    // only with the no-path error.
    let early: Vec<&String> = log
        .errors
        .iter()
        .filter(|e| !e.contains("no path"))
        .collect();
    assert!(early.is_empty(), "errors: {early:?}\n{context}");
    let failed: Vec<&failkit::OpRecord> = log.ops.iter().filter(|o| !o.ok).collect();
    assert!(
        !failed.is_empty(),
        "nothing failed in a {:?} outage with a {NO_PATH:?} no-path timeout",
        m.long_outage_end - m.long_outage
    );
    for o in &failed {
        assert!(
            // Until a path is back (within the 2 s failback promise), the
            // volume still has none.
            o.end >= m.long_outage + NO_PATH
                && o.start < m.long_outage_end + Duration::from_secs(2),
            "an I/O failed outside the long outage: {o:?} (outage {:?}..{:?})",
            m.long_outage,
            m.long_outage_end
        );
    }

    let link = log.failover_time(m.link_down).expect("I/O in flight");
    let hole = log.failover_time(m.blackhole).expect("I/O in flight");
    let back1 = log.failback_time(1, m.link_up).expect("path 1 came back");
    let back2 = log
        .failback_time(2, m.blackhole_gone)
        .expect("path 2 came back");
    let resumed = |t: Duration| log.ops.iter().any(|o| o.ok && o.start > t);
    eprintln!(
        "{kind:?}: link down: I/O completed elsewhere in {:.0} ms, path back {:.0} ms after the restore; \
         blackhole: {:.0} ms and {:.0} ms; {} I/Os failed in the long outage",
        link.as_secs_f64() * 1e3,
        back1.as_secs_f64() * 1e3,
        hole.as_secs_f64() * 1e3,
        back2.as_secs_f64() * 1e3,
        failed.len()
    );
    assert!(link < Duration::from_secs(1), "{kind:?}: failover {link:?}");
    assert!(hole < Duration::from_secs(1), "{kind:?}: failover {hole:?}");
    assert!(
        back1 < Duration::from_secs(2),
        "{kind:?}: failback {back1:?}"
    );
    assert!(
        back2 < Duration::from_secs(2),
        "{kind:?}: failback {back2:?}"
    );
    assert!(resumed(m.short_outage_end), "no I/O after the short outage");
    assert!(resumed(m.long_outage_end), "no I/O after the long outage");
}

#[needs("root", "ip", "tc")]
fn every_fault_over_iscsi_to_braids_target_costs_no_acknowledged_write() {
    if braid_lab::require_or_skip("every_fault_over_iscsi_to_braids_target") {
        every_fault_over(Kind::Braid);
    }
}

#[needs("root", "ip", "tc", "tgtd")]
fn every_fault_over_iscsi_to_tgt_costs_no_acknowledged_write() {
    if braid_lab::require_or_skip("every_fault_over_iscsi_to_tgt") {
        every_fault_over(Kind::Tgt);
    }
}

/// Link down and blackhole under a load through `braid attach` of the
/// iSCSI volume.
fn through_the_attach_socket(kind: Kind) {
    let lab = Lab::up(LabConfig::new([Rate::GBIT, Rate::GBIT])).unwrap();
    let target = Target::start(&lab, kind, 3260);
    let portals = target.portal_args();
    let args: Vec<&str> = portals.iter().map(String::as_str).collect();
    let attach = labkit::Attach::start(Some(&lab), &target.uri(), "vol", &args);
    attachload::cut_each_path(&lab, &attach, iscsilab::SIZE / 4096);
}

#[needs("root", "ip", "tc", "nbdsh")]
fn through_the_attach_socket_cuts_over_iscsi_to_braids_target_cost_no_io_error() {
    if braid_lab::require_or_skip("through_the_attach_socket_cuts_over_iscsi_to_braids_target") {
        through_the_attach_socket(Kind::Braid);
    }
}

#[needs("root", "ip", "tc", "tgtd", "nbdsh")]
fn through_the_attach_socket_cuts_over_iscsi_to_tgt_cost_no_io_error() {
    if braid_lab::require_or_skip("through_the_attach_socket_cuts_over_iscsi_to_tgt") {
        through_the_attach_socket(Kind::Tgt);
    }
}

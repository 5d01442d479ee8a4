//! Fencing across gateways on a real throwaway Ceph cluster (`cephkit`):
//! a gateway stalled (SIGSTOP) with a client's write held inside it is
//! fenced by a surviving gateway when the client fails over, and after
//! SIGCONT the held write does not land over the newer one: the survivor
//! blocklisted the stalled gateway's RADOS client (with that step removed,
//! the same test sees the stale write land). A gateway that stops cleanly
//! with a write of its own still in flight keeps its record until the
//! write ended, so that the newer write a client sent elsewhere stays. A
//! Ceph user that may not blocklist serves an image alone, and no gateway
//! joins it; of two gateways that must serve alone and join at once, one
//! serves. A gateway's metrics count the fences, blocklists and barriers,
//! and its status lists its live peers. Lease renewals are heartbeats in
//! the barrier object's map, and leave the image's metadata alone. A
//! gateway that cannot get OSD maps from the monitors stops serving rather
//! than hold up the fences of its image.

#![cfg(feature = "rbd")]

mod cephkit;
mod common;
mod failkit;

use braid_test_needs::needs;

use std::process::Command;
use std::time::{Duration, Instant};

use braid_initiator::PathRule;
use common::{output, signal, Serve};

/// Waits until A lists B's portal, then opens the volume through A's URI
/// with the failover policy, B first: every write goes to B while it works.
async fn open_b_first(a: &Serve, b_portal: &str) -> std::sync::Arc<braid_initiator::Volume> {
    let (uri, b) = (a.uri("vol"), b_portal.to_owned());
    let announced = tokio::task::spawn_blocking(move || {
        common::wait_until(Duration::from_secs(20), || announces(&uri, &b))
    })
    .await
    .unwrap();
    assert!(
        announced,
        "A never listed B's portal {b_portal} in 20 s; A:\n{}",
        a.log()
    );
    let rules: Vec<PathRule> = [
        format!("{b_portal},priority=0"),
        format!("{},priority=1", a.addr()),
    ]
    .iter()
    .map(|r| r.parse().unwrap())
    .collect();
    failkit::open(&a.uri("vol"), |cfg| {
        cfg.policy = Some("failover".into());
        cfg.paths = rules;
    })
    .await
}

/// Whether the gateway at `uri` answers `x-braid:portal` with `portal`
/// (not if it does not answer at all: the caller says why with its log).
fn announces(uri: &str, portal: &str) -> bool {
    let out = output(
        common::cmd("nbdinfo").args(["--list", uri]),
        common::TOOL_TIMEOUT,
    );
    String::from_utf8_lossy(&out.stdout).contains(&format!("x-braid:portal={portal}"))
}

/// Two gateways A and B; a client writes block 0 through B (version 1),
/// B stalls (SIGSTOP) with version 2 of the block sent to it, the client
/// fails over to A (which fences B), writes version 3 through A, then B
/// resumes. Returns the version the cluster holds in the end, and both
/// gateways' logs. `env` goes to A (a test hook that removes the
/// blocklist step from its fences).
fn stalled_gateway(c: &cephkit::Cluster, env: &[(&str, &str)]) -> (u64, String, String, String) {
    let img = c.image("stall", "16M", Some("layering"));
    // Leases long enough that only the client's fence acts on B here. The
    // client waits 30 s for a stalled peer whose TCP stack still answers
    // (slow is not dead), and B's watch of the barrier object would break
    // after 30 s too, making B drop its connections by itself on SIGCONT:
    // kept for longer, so that only the blocklist stands between B's held
    // write and the cluster.
    let metrics_port = common::free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let a = c.gateway_env(
        &img,
        &["--gateway-lease", "120", "--metrics", &metrics],
        env,
    );
    let lease = ["--gateway-lease", "120"];
    let watch = c.conf_with("long-watch", "osd client watch timeout = 120");
    let watch = watch.display().to_string();
    let b = c.gateway(&img, &[&lease[..], &["--ceph-conf", &watch]].concat());
    let b_portal = b.addr().to_string();
    let bs = 64 * 1024;
    let block = |v| failkit::block_data(0, v, bs);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let vol = open_b_first(&a, &b_portal).await;
        vol.write(0, block(1), false).await.expect("version 1");
        common::stop(b.pid());
        // Sent to B, which holds it; the client gives up on B, has A fence
        // B's connections, and writes it again through A.
        vol.write(0, block(2), false)
            .await
            .expect("version 2, after failover");
        vol.write(0, block(3), false).await.expect("version 3");
        let r = vol.report();
        let to_b = cephkit::path_to(&r, &b_portal);
        assert!(
            to_b.figures.counters.resent > 0,
            "version 2 never went to B: {r:?}"
        );
        vol.close().await;
    });
    signal(b.pid(), libc::SIGCONT);
    // B now reads version 2 from its socket and hands it to librbd. Wait
    // until it is done with it: refused (B then drains its old
    // connections and says so) or landed.
    let deadline = Instant::now() + Duration::from_secs(20);
    let version = loop {
        let data = img.export();
        let got = (1..=3).find(|v| data[..bs] == block(*v)[..]).unwrap_or(0);
        if got == 2 || b.log().contains("old connections drained") || Instant::now() > deadline {
            break got;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    (version, a.log(), b.log(), common::scrape(metrics_port))
}

/// The value of the sample `name{export="vol"}` in a scrape.
fn metric(scrape: &str, name: &str) -> f64 {
    let prefix = format!("{name}{{export=\"vol\"}} ");
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix}in:\n{scrape}"))
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[needs("ceph-mon", "nbdinfo")]
fn a_stalled_gateways_held_write_does_not_land_after_the_client_failed_over() {
    let Some(c) = cephkit::ceph() else { return };
    let (version, a, b, scrape) = stalled_gateway(c, &[]);
    assert_eq!(
        version, 3,
        "the cluster must hold the newest write\nA:\n{a}\nB:\n{b}"
    );
    assert!(a.contains("gateway fenced: blocklisted"), "A:\n{a}");
    assert!(b.contains("lost its right to write"), "B:\n{b}");
    // A's metrics count the client's fence, the blocklist and the barrier.
    assert!(
        metric(&scrape, "braid_gateway_fences_asked_total") >= 1.0,
        "{scrape}"
    );
    assert!(
        metric(&scrape, "braid_gateway_fences_given_total") >= 1.0,
        "{scrape}"
    );
    assert_eq!(
        metric(&scrape, "braid_gateway_blocklists_total"),
        1.0,
        "{scrape}"
    );
    assert!(
        metric(&scrape, "braid_gateway_barrier_duration_seconds_count") >= 1.0,
        "{scrape}"
    );
}

#[needs("ceph-mon", "nbdinfo")]
fn without_the_blocklist_the_stalled_gateways_held_write_lands() {
    let Some(c) = cephkit::ceph() else { return };
    // What the blocklist prevents: proof that the test above can fail. The
    // hook also leaves out the request that B drop the connection: queued
    // while B is stopped, it could close the connection before B reads
    // version 2 from it, and the write would not land for that reason.
    let (version, a, b, scrape) = stalled_gateway(c, &[("BRAID_DANGER_NO_BLOCKLIST", "1")]);
    assert!(a.contains("TEST HOOK: not blocklisting"), "A:\n{a}");
    assert_eq!(
        metric(&scrape, "braid_gateway_blocklists_total"),
        0.0,
        "{scrape}"
    );
    assert_eq!(version, 2, "the stale write should land\nA:\n{a}\nB:\n{b}");
}

#[needs("ceph-mon")]
fn a_user_that_may_not_blocklist_serves_an_image_alone() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("nocap", "16M", Some("layering"));
    // May read and write the pool, and nothing on the monitors but read.
    let keyring = c.dir.join("nocap.keyring");
    c.ok(
        "ceph",
        &[
            "auth",
            "get-or-create",
            "client.nocap",
            "mon",
            "allow r",
            "osd",
            "allow rwx pool=rbd",
            "-o",
            &keyring.display().to_string(),
        ],
    );
    let conf = c.conf_with("nocap", &format!("keyring = {}", keyring.display()));
    let conf = conf.display().to_string();
    let nocap = [
        "--ceph-conf",
        &conf,
        "--ceph-id",
        "nocap",
        "--gateway-lease",
        "2",
    ];
    let alone = c.gateway(&img, &nocap);
    assert!(alone.log().contains("may not blocklist"), "{}", alone.log());
    let records = img.gateways();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["alone"], true, "{records:?}");
    // A gateway that may blocklist does not join it: the record keeps
    // being renewed, so its gateway is alive.
    let refused = |args: &[&str]| {
        let scratch = tempfile::tempdir().unwrap();
        let out = output(
            Command::new(env!("CARGO_BIN_EXE_braid"))
                .args(["serve", "--listen", "127.0.0.1:0", "--control"])
                .arg(scratch.path().join("ctl.sock"))
                .args(args)
                .arg(format!("vol={}", img.spec())),
            Duration::from_secs(60),
        );
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let cluster_conf = c.conf.display().to_string();
    let err = refused(&["--ceph-conf", &cluster_conf, "--gateway-lease", "2"]);
    assert!(err.contains("serves this image alone"), "{err}");
    // Nor does another that may not blocklist.
    let err = refused(&nocap);
    assert!(err.contains("may only serve the image alone"), "{err}");
    assert!(err.contains("rbd image-meta remove"), "{err}");
    drop(alone);
    // The other way round: beside a gateway that may blocklist, it is
    // refused at once.
    let capable: Serve = c.gateway(&img, &[]);
    let err = refused(&nocap);
    assert!(err.contains("may only serve the image alone"), "{err}");
    drop(capable);
    assert!(img.gateways().is_empty(), "clean stops leave no record");
}

#[needs("ceph-mon", "nbdinfo")]
fn a_stopping_gateway_keeps_its_record_while_a_write_of_it_is_in_flight() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("stop", "16M", Some("layering"));
    // Leases long enough that no gateway is fenced for going silent here.
    let lease = ["--gateway-lease", "60"];
    let a = c.gateway(&img, &lease);
    let scratch = tempfile::tempdir().unwrap();
    let hold = scratch.path().join("hold");
    let hold_env = hold.display().to_string();
    let mut b = c.gateway_env(&img, &lease, &[("BRAID_TEST_HOLD_RBD_WRITES", &hold_env)]);
    let b_portal = b.addr().to_string();
    const BS: usize = 64 * 1024;
    let block = |v| failkit::block_data(0, v, BS);
    let b_has_record = |img: &cephkit::Image| {
        img.gateways()
            .iter()
            .any(|g| g["portals"][0] == b_portal.as_str())
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let vol = open_b_first(&a, &b_portal).await;
        vol.write(0, block(1), false).await.expect("version 1");
        // Version 2 reaches B and is held inside it (as a write waiting
        // on a monitor that does not answer would be) while B stops
        // cleanly: B's connections get the 10 s a stop gives them to
        // finish, then B leaves the image's gateways.
        std::fs::write(&hold, b"").unwrap();
        let mut second = tokio::spawn({
            let vol = vol.clone();
            async move { vol.write(0, block(2), false).await }
        });
        cephkit::eventually(Duration::from_secs(10), "B holds version 2", || {
            b.log().contains("TEST HOOK: holding a write")
        });
        signal(b.pid(), libc::SIGTERM);
        let stopped = Instant::now();
        while b_has_record(&img) && stopped.elapsed() < Duration::from_secs(12) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Without its record, a fence of B's connections blocklists
        // nothing: the client fails over to A and writes version 3 there
        // while version 2 is still inside B. With it, B has not answered
        // and the client waits.
        let answered = tokio::time::timeout(Duration::from_secs(5), &mut second).await;
        let failed_over = answered.is_ok();
        if let Ok(done) = answered {
            done.unwrap().expect("version 2, after failover");
            vol.write(0, block(3), false).await.expect("version 3");
        }
        std::fs::remove_file(&hold).unwrap();
        if !failed_over {
            tokio::time::timeout(Duration::from_secs(30), second)
                .await
                .expect("version 2 answered once B's write ended")
                .unwrap()
                .expect("version 2");
            vol.write(0, block(3), false).await.expect("version 3");
        }
        vol.close().await;
    });
    let status = b.stop();
    let data = img.export();
    let version = (1..=3).find(|v| data[..BS] == block(*v)[..]).unwrap_or(0);
    assert_eq!(
        version,
        3,
        "the cluster must hold the newest write (B exited {status})\nA:\n{}\nB:\n{}",
        a.log(),
        b.log()
    );
    assert!(!b_has_record(&img), "B's record went once its write ended");
}

#[needs("ceph-mon")]
fn of_two_gateways_that_must_serve_alone_joining_at_once_one_serves() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("alone2", "16M", Some("layering"));
    let scratch = tempfile::tempdir().unwrap();
    let pause = scratch.path().join("pause");
    std::fs::write(&pause, b"").unwrap();
    let pause_env = pause.display().to_string();
    let env = [("BRAID_TEST_JOIN_PAUSE", pause_env.as_str())];
    // With its cache on, a gateway serves its images alone.
    let args = ["--rbd-cache", "--gateway-lease", "3"];
    let mut gws = [
        c.spawn_gateway(&img, &args, &env),
        c.spawn_gateway(&img, &args, &env),
    ];
    // Both have read the registry, empty, and wait before writing their
    // records: the two joins overlap.
    cephkit::eventually(Duration::from_secs(30), "both joins paused", || {
        gws.iter()
            .all(|g| g.log().contains("TEST HOOK: join paused"))
    });
    std::fs::remove_file(&pause).unwrap();
    let outcomes: Vec<cephkit::Outcome> = gws
        .iter_mut()
        .map(|g| g.outcome(Duration::from_secs(30)))
        .collect();
    let serving = outcomes
        .iter()
        .filter(|o| **o == cephkit::Outcome::Serving)
        .count();
    assert_eq!(
        serving,
        1,
        "exactly one of them may serve the image alone:\nfirst:\n{}\nsecond:\n{}",
        gws[0].log(),
        gws[1].log()
    );
    let refused = outcomes
        .iter()
        .find_map(|o| match o {
            cephkit::Outcome::Refused(log) => Some(log),
            cephkit::Outcome::Serving => None,
        })
        .expect("the other refused");
    assert!(refused.contains("serves this image alone"), "{refused}");
    assert_eq!(img.gateways().len(), 1, "{:?}", img.gateways());
}

/// `braid status --json` of one serve, as JSON.
fn status_json(control: &std::path::Path) -> serde_json::Value {
    let out = output(
        Command::new(env!("CARGO_BIN_EXE_braid"))
            .args(["status", "--json", "--control"])
            .arg(control),
        Duration::from_secs(10),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

#[needs("ceph-mon")]
fn a_gateways_status_shows_its_peers_and_its_metrics_the_live_gateways_and_fences() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("figures", "16M", Some("layering"));
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("a.sock");
    let port = common::free_port();
    let metrics = format!("127.0.0.1:{port}");
    let lease = ["--gateway-lease", "2"];
    let a = c.gateway(
        &img,
        &[
            &lease[..],
            &[
                "--metrics",
                &metrics,
                "--control",
                control.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    let b = c.gateway(&img, &lease);
    let b_portal = b.addr().to_string();
    let peers = || status_json(&control)["processes"][0]["exports"][0]["peers"].clone();
    cephkit::eventually(Duration::from_secs(20), "A's status lists B", || {
        peers().as_array().is_some_and(|p| !p.is_empty())
    });
    let seen = peers();
    assert_eq!(seen[0]["portals"], serde_json::json!([b_portal]), "{seen}");
    assert_eq!(seen[0]["pid"], b.pid(), "{seen}");
    let text = output(
        Command::new(env!("CARGO_BIN_EXE_braid"))
            .args(["status", "--control"])
            .arg(&control),
        Duration::from_secs(10),
    );
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.contains(&format!("pid {}) portals {b_portal}", b.pid())),
        "{text}"
    );
    let scrape = common::scrape(port);
    assert_eq!(
        metric(&scrape, "braid_gateway_live_gateways"),
        2.0,
        "{scrape}"
    );
    assert!(
        metric(
            &scrape,
            "braid_gateway_lease_renewal_duration_seconds_count"
        ) >= 1.0,
        "{scrape}"
    );

    // B dies; A fences it once its lease ran out.
    signal(b.pid(), libc::SIGKILL);
    // The blocklist is counted when it is issued, the barrier after every
    // live gateway has the new map, and B leaves the live ones once its
    // record is removed, in that order: wait for the last.
    cephkit::eventually(Duration::from_secs(30), "A fenced B", || {
        let s = common::scrape(port);
        metric(&s, "braid_gateway_blocklists_total") == 1.0
            && metric(&s, "braid_gateway_barrier_duration_seconds_count") >= 1.0
            && metric(&s, "braid_gateway_live_gateways") == 1.0
    });
    let scrape = common::scrape(port);
    assert_eq!(
        metric(&scrape, "braid_gateway_live_gateways"),
        1.0,
        "{scrape}"
    );
    assert!(
        metric(&scrape, "braid_gateway_barrier_duration_seconds_count") >= 1.0,
        "{scrape}"
    );
    assert_eq!(
        metric(&scrape, "braid_gateway_fences_asked_total"),
        0.0,
        "{scrape}"
    );
    assert_eq!(peers(), serde_json::json!([]), "B is no peer once fenced");
    drop((a, b));
}

/// The keys and values of the barrier object's map (`rados
/// listomapvals`), where heartbeats go.
fn heartbeats(c: &cephkit::Cluster, img: &cephkit::Image) -> String {
    let barrier = format!("braid_gateways.{}", img.id);
    let out = c.ok("rados", &["-p", &img.pool, "listomapvals", &barrier]);
    String::from_utf8_lossy(&out).into_owned()
}

#[needs("ceph-mon")]
fn lease_renewals_leave_the_images_metadata_alone_and_keep_the_gateways_alive() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("beats", "16M", Some("layering"));
    let lease = ["--gateway-lease", "2"];
    let a = c.gateway(&img, &lease);
    let b = c.gateway(&img, &lease);
    let (uri, b_portal) = (a.uri("vol"), b.addr().to_string());
    cephkit::eventually(Duration::from_secs(20), "A lists B", || {
        announces(&uri, &b_portal)
    });
    let records = img.meta();
    assert_eq!(img.gateways().len(), 2, "{records:?}");
    let beats = heartbeats(c, &img);
    // Over three leases each gateway renews nine times.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        img.meta(),
        records,
        "a renewal changed the image's metadata (every change of it is announced to every \
         client of the image)"
    );
    assert_ne!(heartbeats(c, &img), beats, "no heartbeat was renewed");
    assert!(announces(&uri, &b_portal), "B is still alive to A");
    assert!(
        !a.log().contains("ran out") && !b.log().contains("ran out"),
        "a live gateway's lease ran out:\n{}\n{}",
        a.log(),
        b.log()
    );
    drop((a, b));
}

#[needs("ceph-mon")]
fn a_gateway_cut_off_from_the_monitors_stops_serving_instead_of_holding_up_fences() {
    let Some(c) = cephkit::ceph() else { return };
    let img = c.image("cutoff", "16M", Some("layering"));
    let scratch = tempfile::tempdir().unwrap();
    let cut = scratch.path().join("cut");
    let cut_env = cut.display().to_string();
    let lease = ["--gateway-lease", "2"];
    let a = c.gateway(&img, &lease);
    // B's OSD map fetches wait while the file exists, as they do when the
    // monitors cannot be reached and the OSDs can.
    let b = c.gateway_env(&img, &lease, &[("BRAID_TEST_NO_OSDMAP", &cut_env)]);
    let s = c.gateway(&img, &lease);
    cephkit::eventually(Duration::from_secs(20), "three records", || {
        img.gateways().len() == 3
    });
    std::fs::write(&cut, b"").unwrap();
    // S dies: A fences it once its lease ran out, and every live gateway
    // must confirm the barrier, B too, which cannot.
    signal(s.pid(), libc::SIGKILL);
    let started = Instant::now();
    cephkit::eventually(
        Duration::from_secs(40),
        "S fenced (its record removed once the barrier passed)",
        || img.gateways().iter().all(|g| g["pid"] != s.pid()),
    );
    let took = started.elapsed();
    assert!(b.log().contains("cut off from the monitors"), "{}", b.log());
    std::fs::remove_file(&cut).unwrap();
    cephkit::eventually(Duration::from_secs(30), "B rejoined", || {
        b.log().contains("rejoined as a new RADOS client")
    });
    eprintln!("S fenced {took:?} after it died");
    drop((a, b, s));
}

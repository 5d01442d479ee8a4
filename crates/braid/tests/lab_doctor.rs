//! `braid doctor` in the lab: each misconfiguration is made for real in the
//! client's namespace (or the storage host's, for its portals), the doctor
//! run there names it with the right subject, `--apply` runs the fix it suggests, and a second run finds it
//! gone. Without `--apply` (or when the question is answered no) nothing
//! changes: every sysctl, MTU, route, rule and qdisc of the namespace is
//! the same before and after.

mod common;
mod labkit;

use braid_test_needs::needs;

use std::process::Command;
use std::time::Duration;

use braid_doctor::{Finding, Report, Severity, Subject};
use braid_lab::{Addressing, Lab, LabConfig, Rate, Side};
use labkit::{braid_bin, LabServe};

/// A lab with `braid serve` of a memory volume on every portal, each
/// bound to its interface.
fn lab(rates: &[Rate], addressing: Addressing) -> (Lab, LabServe) {
    serve_lab(rates, addressing, |p| p.storage_iface.clone())
}

fn serve_lab(
    rates: &[Rate],
    addressing: Addressing,
    listen: impl Fn(&braid_lab::PathInfo) -> String,
) -> (Lab, LabServe) {
    let lab = Lab::up(LabConfig::new(rates.iter().copied()).addressing(addressing)).unwrap();
    let mut args = vec!["vol=mem:64MiB".to_owned()];
    for p in lab.paths() {
        args.extend(["--listen".to_owned(), listen(&p)]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let serve = LabServe::start(&lab, &args, 1);
    (lab, serve)
}

/// `braid doctor ARGS --json` in the client namespace, through `sh -c` so
/// that `stdin` can answer its question; the report, and stderr.
fn doctor_with(lab: &Lab, args: &[&str], stdin: &str) -> (Report, String) {
    doctor_on(lab, Side::Client, args, stdin)
}

fn doctor_on(lab: &Lab, side: Side, args: &[&str], stdin: &str) -> (Report, String) {
    let mut line = format!("printf '{stdin}' | {} doctor --json", braid_bin());
    for a in args {
        line.push(' ');
        line.push_str(a);
    }
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &line]).env("NO_COLOR", "1");
    let out = lab
        .output(side, cmd, Duration::from_secs(60))
        .expect("run braid doctor");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "braid doctor {args:?}: {}\n{stderr}",
        out.status
    );
    let report: Report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not a report ({e}):\n{}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (report, stderr)
}

fn doctor(lab: &Lab, args: &[&str]) -> Report {
    doctor_with(lab, args, "").0
}

/// The finding of `check` about `subject` (a path by its number).
fn found<'a>(r: &'a Report, check: &str, subject: &Subject) -> &'a Finding {
    let matches = |f: &&Finding| {
        f.check == check
            && match (&f.subject, subject) {
                (Subject::Path { index: a, .. }, Subject::Path { index: b, .. }) => a == b,
                (a, b) => a == b,
            }
    };
    r.findings
        .iter()
        .find(matches)
        .unwrap_or_else(|| panic!("no {check} finding on {subject}: {:#?}", r.findings))
}

fn path(index: usize) -> Subject {
    Subject::Path {
        index,
        via: String::new(),
    }
}

fn iface(name: &str) -> Subject {
    Subject::Interface(name.into())
}

/// Runs a command in the client namespace, asserting success.
fn client(lab: &Lab, program: &str, args: &[&str]) {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let out = lab
        .output(Side::Client, cmd, Duration::from_secs(15))
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Everything of the client namespace a fix could change: sysctls of
/// every interface and TCP, every MTU, routes of every table, rules and
/// qdiscs. `ip netns exec` gives the namespace's own /sys.
fn snapshot(lab: &Lab) -> String {
    let script = "grep -r . /proc/sys/net/ipv4/conf/ /proc/sys/net/ipv4/tcp_rmem \
                  /proc/sys/net/ipv4/tcp_wmem /proc/sys/net/ipv4/tcp_congestion_control; \
                  for i in /sys/class/net/*; do echo \"$i $(cat $i/mtu) $(cat $i/queues/rx-0/rps_cpus)\"; done; \
                  ip route show table all; ip rule show; tc qdisc show";
    let out = Command::new("ip")
        .args(["netns", "exec", lab.ns(Side::Client), "sh", "-c", script])
        .output()
        .expect("snapshot");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("arp_ignore") && text.contains("brc1"),
        "{text}"
    );
    text
}

/// Fails with the lines that differ.
fn unchanged(before: &str, after: &str, what: &str) {
    let gone: Vec<&str> = before.lines().filter(|l| !after.contains(l)).collect();
    let new: Vec<&str> = after.lines().filter(|l| !before.contains(l)).collect();
    assert!(
        gone.is_empty() && new.is_empty(),
        "{what} changed the host:\nbefore: {gone:#?}\nafter: {new:#?}"
    );
}

macro_rules! lab_test {
    ($(#[$m:meta])* fn $name:ident() $body:block) => {
        #[needs("root", "ip", "tc", "sysctl")]
        $(#[$m])*
        fn $name() {
            if !braid_lab::require_or_skip(stringify!($name)) {
                return;
            }
            $body
        }
    };
}

lab_test! {
    fn two_nics_in_one_subnet_with_default_sysctls_are_arp_flux() {
        let (lab, _serve) = lab(&[Rate::GBIT, Rate::GBIT], Addressing::SameSubnetFlux);
        let args = ["nbd://10.77.0.1/vol", "--local", "brc1", "--local", "brc2", "--no-probe"];
        let r = doctor(&lab, &args);
        for nic in ["brc1", "brc2"] {
            let f = found(&r, "arp-flux", &iface(nic));
            assert_eq!(f.severity, Severity::Warn, "{f:#?}");
            let ev = |k: &str| {
                f.evidence
                    .iter()
                    .find(|e| e.source == format!("/proc/sys/net/ipv4/conf/{nic}/{k}"))
                    .map(|e| e.value.clone())
            };
            assert_eq!(ev("arp_ignore").as_deref(), Some("0"));
            assert_eq!(ev("arp_announce").as_deref(), Some("0"));
        }
        // The second address leaves by the first NIC unless bound.
        let sr = found(&r, "source-routing", &path(2));
        assert_eq!(sr.severity, Severity::Warn);
        assert!(sr.why.contains("leaves by brc1"), "{}", sr.why);
        assert_eq!(found(&r, "source-routing", &path(1)).severity, Severity::Ok);

        // Answered on stdin, as a person at the terminal would.
        let mut with_apply = args.to_vec();
        with_apply.push("--apply");
        let (_, said) = doctor_with(&lab, &with_apply, "y\\n");
        assert!(said.contains("done: sysctl -w net.ipv4.conf.brc2.arp_ignore=1"), "{said}");
        let after = doctor(&lab, &args);
        for nic in ["brc1", "brc2"] {
            assert_eq!(found(&after, "arp-flux", &iface(nic)).severity, Severity::Ok);
        }
        assert_eq!(found(&after, "source-routing", &path(2)).severity, Severity::Ok);
    }
}

lab_test! {
    fn jumbo_frames_on_one_end_of_a_path_only() {
        let (lab, _serve) = lab(&[Rate::GBIT], Addressing::Split);
        client(&lab, "ip", &["link", "set", "brc1", "mtu", "9000"]);
        let r = doctor(&lab, &["nbd://10.77.1.1/vol"]);
        let f = found(&r, "mtu", &path(1));
        assert_eq!(f.severity, Severity::Fail, "{f:#?}");
        assert!(f.evidence.iter().any(|e| e.source == "/sys/class/net/brc1/mtu" && e.value == "9000"));
        assert!(
            f.evidence.iter().any(|e| e.source.starts_with("ICMP echo") && e.value.contains("9000: lost") && e.value.contains("1500: back")),
            "{f:#?}"
        );
        // The other end announced a segment size that fits 1500 bytes.
        assert!(f.evidence.iter().any(|e| e.value.contains("MTU 1500 at the smaller end")), "{f:#?}");
        doctor(&lab, &["nbd://10.77.1.1/vol", "--no-probe", "--apply", "--yes"]);
        let after = doctor(&lab, &["nbd://10.77.1.1/vol", "--no-probe"]);
        assert_eq!(found(&after, "mtu", &path(1)).severity, Severity::Ok);
    }
}

lab_test! {
    fn a_100mbit_path_beside_a_1gbit_one_is_found_by_the_probe() {
        let (lab, _serve) = lab(&[Rate::GBIT, Rate::MBIT_100], Addressing::Split);
        let r = doctor(&lab, &["nbd://10.77.1.1/vol"]);
        let slow = found(&r, "path-balance", &path(2));
        assert_eq!(slow.severity, Severity::Warn, "{slow:#?}");
        assert!(slow.why.contains("brc2 is shaped to"), "{}", slow.why);
        assert_eq!(found(&r, "path-balance", &path(1)).severity, Severity::Ok);
        // Each path carries what its own link should.
        for i in [1, 2] {
            assert_eq!(found(&r, "path-throughput", &path(i)).severity, Severity::Ok);
        }
        // The cure is outside this host (a cable, a switch port): here,
        // the lab's link is brought to 1gbit.
        lab.set_rate(2, Rate::GBIT).unwrap();
        let after = doctor(&lab, &["nbd://10.77.1.1/vol"]);
        assert_eq!(found(&after, "path-balance", &path(2)).severity, Severity::Ok);
    }
}

lab_test! {
    fn tcp_buffers_below_the_bdp_of_a_delayed_path() {
        // Portals by address: a socket bound to its device would bypass
        // the delay's route.
        let (lab, _serve) = serve_lab(&[Rate::GBIT], Addressing::Split, |p| p.storage_addr.to_string());
        let _delay = lab.delay(1, Side::Storage, Duration::from_millis(20)).unwrap();
        client(&lab, "sysctl", &["-w", "net.ipv4.tcp_rmem=4096 131072 1048576"]);
        client(&lab, "sysctl", &["-w", "net.ipv4.tcp_wmem=4096 16384 1048576"]);
        let r = doctor(&lab, &["nbd://10.77.1.1/vol"]);
        let f = found(&r, "tcp-buffers", &path(1));
        assert_eq!(f.severity, Severity::Warn, "{f:#?}");
        assert!(f.evidence.iter().any(|e| e.source.ends_with("tcp_rmem") && e.value == "4096 131072 1048576"));
        // Computed from the measured round trip (20 ms added) and the
        // link's rate (its tbf).
        let rtt = f.evidence.iter().find(|e| e.source.starts_with("ICMP echo")).expect("rtt");
        let ms: f64 = rtt.value.trim_end_matches(" ms").parse().unwrap();
        assert!(ms >= 20.0, "{ms}");
        assert!(f.evidence.iter().any(|e| e.value.starts_with("tbf rate")), "{f:#?}");
        // And the probe sees the cost.
        let t = found(&r, "path-throughput", &path(1));
        assert_eq!(t.severity, Severity::Warn, "{t:#?}");
        assert!(t.why.contains("receive window"), "{}", t.why);

        doctor(&lab, &["nbd://10.77.1.1/vol", "--no-probe", "--apply", "--yes"]);
        let after = doctor(&lab, &["nbd://10.77.1.1/vol", "--no-probe"]);
        assert_eq!(found(&after, "tcp-buffers", &path(1)).severity, Severity::Ok);
    }
}

lab_test! {
    fn both_paths_routed_out_of_one_nic_by_a_wrong_route() {
        let (lab, _serve) = lab(&[Rate::GBIT, Rate::GBIT], Addressing::Split);
        client(&lab, "ip", &["route", "replace", "10.77.2.0/24", "dev", "brc1", "src", "10.77.1.2"]);
        let r = doctor(&lab, &["nbd://10.77.1.1/vol", "--no-probe"]);
        let f = found(&r, "shared-link", &path(2));
        assert_eq!(f.severity, Severity::Fail, "{f:#?}");
        assert!(f.why.contains("brc1"), "{}", f.why);
        assert!(f.evidence.iter().any(|e| e.value.starts_with("dev brc1")), "{f:#?}");
        assert_eq!(found(&r, "shared-link", &path(1)).severity, Severity::Ok);
        doctor(&lab, &["nbd://10.77.1.1/vol", "--no-probe", "--apply", "--yes"]);
        let after = doctor(&lab, &["nbd://10.77.1.1/vol", "--no-probe"]);
        assert_eq!(found(&after, "shared-link", &path(2)).severity, Severity::Ok);
        assert!(found(&after, "route", &path(2)).why.contains("brc2"));
    }
}

lab_test! {
    fn nothing_changes_without_apply_or_when_the_answer_is_no() {
        let (lab, _serve) = lab(&[Rate::GBIT, Rate::GBIT], Addressing::SameSubnetFlux);
        client(&lab, "ip", &["link", "set", "brc1", "mtu", "9000"]);
        client(&lab, "sysctl", &["-w", "net.ipv4.tcp_rmem=4096 8192 16384"]);
        let before = snapshot(&lab);
        let args = ["nbd://10.77.0.1/vol", "--local", "brc1", "--local", "brc2"];
        let r = doctor(&lab, &args);
        // There was something to fix, with commands to do it.
        assert!(
            r.problems().filter(|f| f.fix.as_ref().and_then(|x| x.runnable()).is_some()).count() >= 3,
            "{:#?}",
            r.findings
        );
        unchanged(&before, &snapshot(&lab), "braid doctor without --apply");
        let mut asked = args.to_vec();
        asked.push("--apply");
        let (_, said) = doctor_with(&lab, &asked, "n\\n");
        assert!(said.contains("nothing changed"), "{said}");
        unchanged(&before, &snapshot(&lab), "braid doctor --apply answered no");
    }
}

lab_test! {
    fn a_storage_host_nic_without_a_portal_and_its_arp_settings() {
        let (lab, _serve) = serve_lab(
            &[Rate::GBIT, Rate::GBIT],
            Addressing::SameSubnetFlux,
            |_| "brs1".to_owned(),
        );
        let args = ["--serve", "vol=mem:64MiB", "--listen", "brs1"];
        let (r, _) = doctor_on(&lab, Side::Storage, &args, "");
        let idle = found(&r, "portal-per-nic", &iface("brs2"));
        assert_eq!(idle.severity, Severity::Warn, "{idle:#?}");
        assert!(idle.evidence.iter().any(|e| e.value.contains("10.77.0.2")));
        assert_eq!(found(&r, "portal-per-nic", &iface("brs1")).severity, Severity::Ok);
        assert_eq!(found(&r, "arp-flux", &iface("brs1")).severity, Severity::Warn);
        let mut apply = args.to_vec();
        apply.extend(["--apply", "--yes"]);
        doctor_on(&lab, Side::Storage, &apply, "");
        let (after, _) = doctor_on(&lab, Side::Storage, &args, "");
        assert_eq!(found(&after, "arp-flux", &iface("brs1")).severity, Severity::Ok);
    }
}

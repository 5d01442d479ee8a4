//! `braid serve --listen all` on a storage host that also carries what no
//! client can reach (a link-local address, a container bridge and a port
//! enslaved to it, a tun device): only the lab's NIC is served, the rest is
//! named at startup with its reason, and only the served portal is
//! advertised to clients.

mod common;
mod labkit;

use braid_test_needs::needs;

use std::process::Command;
use std::time::Duration;

use braid_lab::{Lab, LabConfig, Rate, Side};
use labkit::LabServe;

/// Runs `ip ARGS` in the storage namespace; panics with its output if it
/// fails.
fn ip(lab: &Lab, args: &[&str]) {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    let out = lab
        .output(Side::Storage, cmd, Duration::from_secs(10))
        .expect("ip runs");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[needs("root", "ip", "tc")]
fn listen_all_leaves_out_what_clients_cannot_reach() {
    if !braid_lab::require_or_skip("listen_all_leaves_out_what_clients_cannot_reach") {
        return;
    }
    let lab = Lab::up(LabConfig::new([Rate::GBIT])).unwrap();
    let path = lab.paths()[0].clone();
    let nic = path.storage_iface.clone();
    // Everything below lives in the lab's storage namespace and goes with it.
    ip(&lab, &["addr", "add", "169.254.9.1/16", "dev", &nic]);
    ip(&lab, &["link", "add", "docker0", "type", "bridge"]);
    ip(&lab, &["addr", "add", "172.31.0.1/16", "dev", "docker0"]);
    ip(&lab, &["link", "set", "docker0", "up"]);
    ip(
        &lab,
        &[
            "link", "add", "vethc0", "type", "veth", "peer", "name", "vethc1",
        ],
    );
    ip(&lab, &["link", "set", "vethc0", "master", "docker0"]);
    ip(&lab, &["addr", "add", "172.31.0.9/16", "dev", "vethc0"]);
    ip(&lab, &["link", "set", "vethc0", "up"]);
    ip(&lab, &["link", "set", "vethc1", "up"]);
    ip(&lab, &["tuntap", "add", "dev", "tun7", "mode", "tun"]);
    ip(&lab, &["addr", "add", "10.201.0.1/24", "dev", "tun7"]);
    ip(&lab, &["link", "set", "tun7", "up"]);

    let serve = LabServe::start(&lab, &["--listen", "all:10809", "vol=mem:16MiB"], 1);
    let log = serve.log();
    let served: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split(" portal ").nth(1))
        .collect();
    assert_eq!(
        served.len(),
        1,
        "exactly the lab's NIC should be served:\n{log}"
    );
    assert!(
        served[0].starts_with(&format!("{}:10809", path.storage_addr)),
        "{log}"
    );
    for (addr, iface, why) in [
        ("169.254.9.1", nic.as_str(), "link-local"),
        ("172.31.0.1", "docker0", "container runtime"),
        ("172.31.0.9", "vethc0", "enslaved to docker0"),
        ("10.201.0.1", "tun7", "tun"),
    ] {
        let line = log
            .lines()
            .find(|l| l.contains(&format!("leaves out {addr} on {iface}:")))
            .unwrap_or_else(|| panic!("{addr} on {iface} not reported as left out:\n{log}"));
        assert!(line.contains(why), "{line}");
    }

    // What a client is told: the served portal only.
    let mut list = Command::new("nbdinfo");
    list.args(["--list", "--json", &format!("nbd://{}", path.storage_addr)]);
    let out = lab
        .output(Side::Client, list, Duration::from_secs(20))
        .expect("nbdinfo runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "nbdinfo: {text}");
    let advertised: Vec<&str> = text
        .split('"')
        .filter(|s| s.starts_with("x-braid:portal="))
        .collect();
    assert_eq!(
        advertised,
        vec![format!("x-braid:portal={}:10809", path.storage_addr).as_str()],
        "{text}"
    );
}

//! iSCSI discovery on a storage host that also carries what no client can
//! reach (a link-local address, a container bridge, a tun device): with
//! `--listen all` and with a wildcard address, SendTargets names only the
//! lab's NIC, so an initiator is never sent to a portal it cannot use.

mod common;
mod labkit;

use braid_test_needs::needs;

use std::process::Command;
use std::time::Duration;

use braid_lab::{Lab, LabConfig, Rate, Side};
use labkit::LabServe;

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

#[needs("root", "ip", "tc", "iscsi-ls")]
fn send_targets_names_only_portals_a_client_can_reach() {
    if !braid_lab::require_or_skip("send_targets_names_only_portals_a_client_can_reach") {
        return;
    }
    let lab = Lab::up(LabConfig::new([Rate::GBIT])).unwrap();
    let path = lab.paths()[0].clone();
    let nic = path.storage_iface.clone();
    ip(&lab, &["addr", "add", "169.254.9.1/16", "dev", &nic]);
    ip(&lab, &["link", "add", "docker0", "type", "bridge"]);
    ip(&lab, &["addr", "add", "172.31.0.1/16", "dev", "docker0"]);
    ip(&lab, &["link", "set", "docker0", "up"]);
    ip(&lab, &["tuntap", "add", "dev", "tun7", "mode", "tun"]);
    ip(&lab, &["addr", "add", "10.201.0.1/24", "dev", "tun7"]);
    ip(&lab, &["link", "set", "tun7", "up"]);

    // The namespace is the lab's own, so any port is free in it.
    let port = common::free_port().to_string();
    for listen in ["0.0.0.0:0", "all:0"] {
        let serve = LabServe::start(
            &lab,
            &["--listen", listen, "--iscsi", &port, "vol=mem:16MiB"],
            1,
        );
        let mut ls = Command::new("iscsi-ls");
        ls.args(["-s", &format!("iscsi://{}:{port}", path.storage_addr)]);
        let out = lab
            .output(Side::Client, ls, Duration::from_secs(30))
            .expect("iscsi-ls runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "iscsi-ls: {text}{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            serve.log()
        );
        // One line per portal: "Target:NAME Portal:ADDR:PORT,TAG".
        let portals: Vec<&str> = text
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("Portal:"))
            .collect();
        assert_eq!(
            portals,
            [format!("{}:{port},1", path.storage_addr)],
            "--listen {listen}:\n{text}\n{}",
            serve.log()
        );
    }
}

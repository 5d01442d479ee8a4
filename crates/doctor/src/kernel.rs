//! The kernel's side of an attached volume: whether the `nbd` module is
//! there for `nbd-client`, whether a connected `/dev/nbdX` gives up on a
//! request before braid stops waiting for a path, and whether
//! dm-multipath has also claimed an nbd device.

use std::time::Duration;

use crate::finding::{Finding, Fix, Severity, Subject};
use crate::root::Root;

/// All kernel-path checks. `no_path_timeout` is how long braid attach
/// waits for a path (`None`: forever, `--no-path-timeout queue`).
pub fn check(root: &Root, no_path_timeout: Option<Duration>) -> Vec<Finding> {
    let mut out = vec![module(root)];
    for dev in root
        .list("/sys/block")
        .into_iter()
        .filter(|d| d.starts_with("nbd"))
    {
        out.extend(nbd_timeout(root, &dev, no_path_timeout));
    }
    out.extend(multipath(root));
    out
}

fn module(root: &Root) -> Finding {
    let f = Finding::ok("nbd-module", Subject::Host, "the nbd module is loaded")
        .read("/sys/module/nbd", "present");
    if root.exists("/sys/module/nbd") {
        return f;
    }
    let release = root.read("/proc/sys/kernel/osrelease").unwrap_or_default();
    let dir = format!("/lib/modules/{release}");
    let listed = ["modules.builtin", "modules.dep"].iter().any(|file| {
        root.read_raw(&format!("{dir}/{file}"))
            .is_some_and(|t| t.lines().any(|l| l.contains("/nbd.ko")))
    });
    let f = Finding {
        evidence: Vec::new(),
        ..f
    }
    .read("/sys/module/nbd", "absent")
    .read("/proc/sys/kernel/osrelease", release.clone());
    if listed {
        return Finding {
            why: "the nbd module is not loaded, but this kernel has it: modprobe nbd before \
                  nbd-client"
                .into(),
            ..f
        }
        .read(format!("{dir}/modules.dep"), "lists nbd.ko");
    }
    Finding {
        severity: Severity::Warn,
        why: format!(
            "kernel {release} has no nbd module, so no /dev/nbdX: braid attach still serves \
             qemu, nbdfuse and libnbd tools, but nbd-client cannot make a block device"
        ),
        ..f
    }
    .read(format!("{dir}/modules.dep"), "no nbd.ko")
    .fix(Fix::Manual(
        "install the kernel's extra modules (Debian: the linux-image package of this kernel \
         has nbd), or put a loop device on nbdfuse's file"
            .into(),
    ))
}

/// `-timeout N`, `-t N` or `--timeout N` from nbd-client's arguments.
pub fn timeout_arg(args: &[String]) -> Option<u64> {
    args.iter().enumerate().find_map(|(i, a)| match a.as_str() {
        "-t" | "-timeout" | "--timeout" => args.get(i + 1)?.parse().ok(),
        _ => a
            .strip_prefix("--timeout=")
            .or_else(|| a.strip_prefix("-timeout="))
            .and_then(|v| v.parse().ok()),
    })
}

fn nbd_timeout(root: &Root, dev: &str, no_path: Option<Duration>) -> Option<Finding> {
    let pid_path = format!("/sys/block/{dev}/pid");
    let pid = root.read(&pid_path)?;
    let cmdline_path = format!("/proc/{pid}/cmdline");
    let args: Vec<String> = root
        .read_raw(&cmdline_path)?
        .split('\0')
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect();
    let subject = Subject::Device(dev.to_owned());
    let io_path = format!("/sys/block/{dev}/queue/io_timeout");
    let mut f = Finding::ok(
        "nbd-timeout",
        subject,
        "nbd-client set no timeout: the kernel waits as long as braid does",
    )
    .read(pid_path, pid.clone())
    .read(cmdline_path, args.join(" "));
    let Some(t) = timeout_arg(&args) else {
        return Some(f);
    };
    if let Some(v) = root.read(&io_path) {
        f = f.read(&io_path, v);
    }
    let wait = no_path.map_or("forever (queue)".to_owned(), |d| {
        format!("{} s", d.as_secs())
    });
    if no_path.is_some_and(|d| t > d.as_secs()) {
        f.why = format!(
            "{dev} fails a request after {t} s, longer than braid waits for a path ({wait})"
        );
        return Some(f);
    }
    let want = no_path.map_or(0, |d| d.as_secs() + 30);
    f.severity = Severity::Fail;
    f.why = format!(
        "{dev} fails a request after {t} s (nbd-client -timeout), but braid attach waits \
         {wait} for a path to come back: an outage braid would ride out becomes an I/O error \
         in the file system"
    );
    f.fix = Some(if want > 0 {
        Fix::Run(format!("echo {} > {io_path}", want * 1000))
    } else {
        Fix::Manual(format!(
            "connect {dev} again without -timeout (braid attach waits forever)"
        ))
    });
    Some(f)
}

/// dm-multipath maps (`dm/uuid` starting `mpath-`) with an nbd device
/// among their paths.
fn multipath(root: &Root) -> Vec<Finding> {
    let mut out = Vec::new();
    for dm in root
        .list("/sys/block")
        .into_iter()
        .filter(|d| d.starts_with("dm-"))
    {
        let uuid_path = format!("/sys/block/{dm}/dm/uuid");
        let Some(uuid) = root.read(&uuid_path).filter(|u| u.starts_with("mpath-")) else {
            continue;
        };
        let name = root
            .read(&format!("/sys/block/{dm}/dm/name"))
            .unwrap_or_else(|| dm.clone());
        for nbd in root
            .list(&format!("/sys/block/{dm}/slaves"))
            .into_iter()
            .filter(|s| s.starts_with("nbd"))
        {
            out.push(
                Finding::new(
                    "dm-multipath",
                    Severity::Warn,
                    Subject::Device(nbd.clone()),
                    format!(
                        "multipathd made {nbd} a path of {name}: two multipath layers each \
                         queue and retry on their own timers, so a path failure that braid \
                         hides can still stall or fail I/O above it; braid already is the \
                         multipath layer"
                    ),
                )
                .read(&uuid_path, uuid.clone())
                .read(format!("/sys/block/{dm}/slaves"), nbd.clone())
                .fix(Fix::Manual(format!(
                    "add devnode \"^nbd\" to the blacklist section of /etc/multipath.conf, \
                     then multipath -f {name}"
                ))),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_arguments() {
        let a = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            timeout_arg(&a("nbd-client -unix /s /dev/nbd0 -timeout 30")),
            Some(30)
        );
        assert_eq!(timeout_arg(&a("nbd-client -t 5 host /dev/nbd0")), Some(5));
        assert_eq!(timeout_arg(&a("nbd-client --timeout=7")), Some(7));
        assert_eq!(
            timeout_arg(&a("nbd-client -unix /s /dev/nbd0 -N vol")),
            None
        );
        assert_eq!(timeout_arg(&a("nbd-client -t")), None);
    }
}

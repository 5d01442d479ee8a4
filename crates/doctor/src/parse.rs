//! Parsers for the kernel's text files, as the kernel writes them: no I/O,
//! never a panic on odd input (proptests below), `None` for what does not
//! parse. Each cites the kernel function that prints the format.

use std::collections::BTreeMap;

/// `/sys/block/mdX/md/sync_speed_min` and `_max`: `1000 (system)` or
/// `50000 (local)` (md.c `sync_min_show`): the value in KiB/s, and whether
/// it is the array's own or the system default
/// (`/proc/sys/dev/raid/speed_limit_*`).
pub fn sync_speed(text: &str) -> Option<(u64, bool)> {
    let mut words = text.split_whitespace();
    let value = words.next()?.parse().ok()?;
    let local = match words.next() {
        Some("(local)") => true,
        Some("(system)") | None => false,
        Some(_) => return None,
    };
    Some((value, local))
}

/// `/sys/block/mdX/md/sync_completed`: `done / total` in 512-byte sectors
/// (md.c `sync_completed_show`), or `none` / `delayed`.
pub fn sync_completed(text: &str) -> Option<(u64, u64)> {
    let (done, total) = text.split_once('/')?;
    let done = done.trim().parse().ok()?;
    let total: u64 = total.trim().parse().ok()?;
    (total > 0 && done <= total).then_some((done, total))
}

/// `/sys/block/X/queue/scheduler`: `[mq-deadline] kyber bfq none`, the
/// active one in brackets (elevator.c `elv_iosched_show`); a queue without
/// a choice prints `none`.
pub fn scheduler(text: &str) -> Option<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    if let Some(active) = words
        .iter()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
    {
        return Some(active.to_owned());
    }
    match words.as_slice() {
        [only] => Some((*only).to_owned()),
        _ => None,
    }
}

/// Three numbers, as `tcp_rmem` and `tcp_wmem` hold them (min, default,
/// max, in bytes).
pub fn triple(text: &str) -> Option<[u64; 3]> {
    let v: Vec<u64> = text
        .split_whitespace()
        .map(|w| w.parse().ok())
        .collect::<Option<_>>()?;
    v.try_into().ok()
}

/// The first word of a sysfs value that names a mode and its number
/// (`balance-rr 0`, `layer2 0`, bonding's sysfs).
pub fn first_word(text: &str) -> Option<String> {
    text.split_whitespace().next().map(str::to_owned)
}

/// `MemTotal` of `/proc/meminfo`, in KiB.
pub fn mem_total_kib(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix("MemTotal:")?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// One mount of `/proc/self/mountinfo` (proc(5); fs/proc_namespace.c
/// `show_mountinfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// `major:minor` of the mounted device.
    pub dev: (u32, u32),
    pub mount_point: String,
    pub options: String,
    pub fstype: String,
    pub source: String,
    pub super_options: String,
}

impl Mount {
    /// Whether an option is set, in the per-mount or the super block
    /// options.
    pub fn has_option(&self, name: &str) -> bool {
        self.options
            .split(',')
            .chain(self.super_options.split(','))
            .any(|o| o == name)
    }
}

/// Every mount of a mountinfo file; lines that do not parse are skipped.
pub fn mountinfo(text: &str) -> Vec<Mount> {
    text.lines().filter_map(mount_line).collect()
}

fn mount_line(line: &str) -> Option<Mount> {
    let (left, right) = line.split_once(" - ")?;
    let l: Vec<&str> = left.split(' ').collect();
    let r: Vec<&str> = right.split(' ').collect();
    let (major, minor) = l.get(2)?.split_once(':')?;
    Some(Mount {
        dev: (major.parse().ok()?, minor.parse().ok()?),
        mount_point: unescape(l.get(4)?),
        options: (*l.get(5)?).to_owned(),
        fstype: (*r.first()?).to_owned(),
        source: unescape(r.get(1)?),
        super_options: r.get(2).map_or(String::new(), |s| (*s).to_owned()),
    })
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|o| o.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(o) if b[i] == b'\\' => {
                let v = o.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount holding `path`: the longest mount point that is `path` or a
/// directory above it (a later mount on the same point hides an earlier
/// one).
pub fn mount_of<'a>(mounts: &'a [Mount], path: &str) -> Option<&'a Mount> {
    mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            let mp = m.mount_point.trim_end_matches('/');
            path == m.mount_point
                || mp.is_empty()
                || path.strip_prefix(mp).is_some_and(|r| r.starts_with('/'))
        })
        .max_by_key(|(i, m)| (m.mount_point.len(), *i))
        .map(|(_, m)| m)
}

/// A bond as `/proc/net/bonding/bondX` describes it (bond_procfs.c
/// `bond_info_show_master` and `_slave`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BondInfo {
    /// `Bonding Mode:` as printed (`load balancing (round-robin)`).
    pub mode: String,
    /// `Transmit Hash Policy:` name (`layer2`), for the modes that hash.
    pub hash_policy: Option<String>,
    /// 802.3ad: ports in the active aggregator.
    pub aggregator_ports: Option<u32>,
    /// Each slave: name, `Speed:` in Mb/s when known, `Duplex:`.
    pub slaves: Vec<BondSlave>,
}

/// One slave of a bond.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BondSlave {
    pub name: String,
    pub mii_up: bool,
    pub speed_mbps: Option<u32>,
    pub duplex: Option<String>,
}

/// Parses `/proc/net/bonding/bondX`.
pub fn bonding(text: &str) -> BondInfo {
    let mut info = BondInfo::default();
    let mut slave: Option<BondSlave> = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "Bonding Mode" => info.mode = value.to_owned(),
            "Transmit Hash Policy" => info.hash_policy = first_word(value),
            "Number of ports" if slave.is_none() => info.aggregator_ports = value.parse().ok(),
            "Slave Interface" => {
                info.slaves.extend(slave.take());
                slave = Some(BondSlave {
                    name: value.to_owned(),
                    ..BondSlave::default()
                });
            }
            "MII Status" => {
                if let Some(s) = slave.as_mut() {
                    s.mii_up = value == "up";
                }
            }
            "Speed" => {
                if let Some(s) = slave.as_mut() {
                    s.speed_mbps = value.strip_suffix(" Mbps").and_then(|v| v.parse().ok());
                }
            }
            "Duplex" => {
                if let Some(s) = slave.as_mut() {
                    s.duplex = Some(value.to_owned());
                }
            }
            _ => {}
        }
    }
    info.slaves.extend(slave);
    info
}

/// `/proc/interrupts` (proc(5); kernel/irq/proc.c `show_interrupts`): for
/// every line whose name mentions `needle`, its counts per CPU, summed.
/// `None` when no line does.
pub fn interrupts_of(text: &str, needle: &str) -> Option<(Vec<u64>, usize)> {
    let mut lines = text.lines();
    let cpus = lines.next()?.split_whitespace().count();
    let mut sum = vec![0u64; cpus];
    let mut found = 0;
    for line in lines {
        let Some((irq, rest)) = line.split_once(':') else {
            continue;
        };
        if irq.trim().parse::<u32>().is_err() {
            continue;
        }
        let words: Vec<&str> = rest.split_whitespace().collect();
        if words.len() <= cpus {
            continue;
        }
        let name_matches = words[cpus..]
            .iter()
            .any(|w| w.split(['-', '@', ':']).any(|part| part == needle) || *w == needle);
        if !name_matches {
            continue;
        }
        found += 1;
        for (s, w) in sum.iter_mut().zip(&words[..cpus]) {
            *s += w.parse::<u64>().unwrap_or(0);
        }
    }
    (found > 0).then_some((sum, found))
}

/// A CPU mask as sysfs prints it (`00000000,0000000f`, bitmap_print_to_pagebuf):
/// the CPUs set, or `None` for a malformed mask.
pub fn cpumask(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    let mut bit = 0usize;
    for word in text.trim().rsplit(',') {
        let v = u32::from_str_radix(word, 16).ok()?;
        for i in 0..32 {
            if v & (1 << i) != 0 {
                cpus.push(bit + i);
            }
        }
        bit += 32;
    }
    Some(cpus)
}

/// `key = value` lines, as `/etc/sysctl.conf` or a TOML-ish file hold them.
pub fn key_values(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            Some((k.trim().to_owned(), v.trim().to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn md_sysfs_values() {
        assert_eq!(sync_speed("1000 (system)"), Some((1000, false)));
        assert_eq!(sync_speed("50000 (local)\n"), Some((50000, true)));
        assert_eq!(sync_speed("fast"), None);
        assert_eq!(
            sync_completed("123 / 3907029168"),
            Some((123, 3_907_029_168))
        );
        assert_eq!(sync_completed("none"), None);
        assert_eq!(sync_completed("5 / 0"), None);
    }

    #[test]
    fn schedulers() {
        assert_eq!(
            scheduler("[mq-deadline] kyber bfq none").as_deref(),
            Some("mq-deadline")
        );
        assert_eq!(
            scheduler("mq-deadline kyber [none]").as_deref(),
            Some("none")
        );
        assert_eq!(scheduler("none").as_deref(), Some("none"));
        assert_eq!(scheduler("a b"), None);
    }

    #[test]
    fn mounts_with_escapes_and_the_innermost_wins() {
        let text = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
30 22 0:27 / /srv/ram rw,nosuid,nodev shared:9 - tmpfs tmpfs rw,size=8388608k,mode=755
31 22 9:0 / /srv/my\\040data rw,noatime - xfs /dev/md0 rw,attr2,inode64,nobarrier
garbage line
";
        let m = mountinfo(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[2].mount_point, "/srv/my data");
        assert_eq!(m[2].dev, (9, 0));
        assert!(m[2].has_option("nobarrier") && m[2].has_option("noatime"));
        assert_eq!(mount_of(&m, "/srv/ram/vol.img").unwrap().fstype, "tmpfs");
        assert_eq!(mount_of(&m, "/srv/ramdisk.img").unwrap().fstype, "ext4");
        assert_eq!(mount_of(&m, "/srv/my data/v").unwrap().source, "/dev/md0");
        assert_eq!(mount_of(&m, "/").unwrap().fstype, "ext4");
    }

    #[test]
    fn bond_proc_file() {
        let text = "\
Ethernet Channel Bonding Driver: v6.1.0

Bonding Mode: IEEE 802.3ad Dynamic link aggregation
Transmit Hash Policy: layer2 (0)
MII Status: up

802.3ad info
LACP rate: slow
Active Aggregator Info:
\tAggregator ID: 1
\tNumber of ports: 1
\tActor Key: 9

Slave Interface: eth4
MII Status: up
Speed: 1000 Mbps
Duplex: full

Slave Interface: eth5
MII Status: down
Speed: Unknown
Duplex: Unknown
";
        let b = bonding(text);
        assert_eq!(b.mode, "IEEE 802.3ad Dynamic link aggregation");
        assert_eq!(b.hash_policy.as_deref(), Some("layer2"));
        assert_eq!(b.aggregator_ports, Some(1));
        assert_eq!(b.slaves.len(), 2);
        assert_eq!(b.slaves[0].speed_mbps, Some(1000));
        assert!(!b.slaves[1].mii_up && b.slaves[1].speed_mbps.is_none());
    }

    #[test]
    fn interrupts_summed_per_cpu() {
        let text = "\
           CPU0       CPU1
  24:    100000          0  PCI-MSIX-0000:03:00.0    0-edge      eth1-TxRx-0
  25:     50000          0  PCI-MSIX-0000:03:00.0    1-edge      eth1-TxRx-1
  26:         3          4  PCI-MSIX-0000:04:00.0    0-edge      eth10-TxRx-0
 NMI:          0          0   Non-maskable interrupts
";
        let (sum, n) = interrupts_of(text, "eth1").unwrap();
        assert_eq!((sum, n), (vec![150000, 0], 2));
        assert!(interrupts_of(text, "eth2").is_none());
    }

    #[test]
    fn masks_and_triples() {
        assert_eq!(cpumask("00000000,00000005"), Some(vec![0, 2]));
        assert_eq!(cpumask("0"), Some(vec![]));
        assert_eq!(cpumask("zz"), None);
        assert_eq!(triple("4096 131072 6291456"), Some([4096, 131072, 6291456]));
        assert_eq!(triple("4096 131072"), None);
        assert_eq!(
            mem_total_kib("MemTotal:       24576000 kB\n"),
            Some(24576000)
        );
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in "\\PC*") {
            let _ = sync_speed(&s);
            let _ = sync_completed(&s);
            let _ = scheduler(&s);
            let _ = triple(&s);
            let _ = mountinfo(&s);
            let _ = bonding(&s);
            let _ = interrupts_of(&s, "eth0");
            let _ = cpumask(&s);
            let _ = mem_total_kib(&s);
            let _ = unescape(&s);
        }

        #[test]
        fn escaped_mount_points_come_back(name in "[a-z \\\\]{1,12}") {
            let escaped = name.replace('\\', "\\134").replace(' ', "\\040");
            let line = format!("1 0 8:1 / /{escaped} rw - ext4 /dev/sda1 rw");
            prop_assert_eq!(&mountinfo(&line)[0].mount_point, &format!("/{name}"));
        }
    }
}

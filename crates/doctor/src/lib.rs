//! `braid doctor`: finds what holds a host's paths and disks back, and says
//! how to fix it.
//!
//! Checks are functions over what was read: the reading goes through a
//! [`Root`] (the live `/` or a captured tree of `/sys` and `/proc`, so the
//! fixtures in `fixtures/` stand in for hardware this kernel cannot make),
//! and each check turns the values into [`Finding`]s with the evidence
//! (value and where it was read), why it matters for multipath storage, and
//! the command that fixes it. Nothing here changes the host: fixes are text
//! until the caller runs them ([`apply`]).
//!
//! What each part reads:
//!
//! | part | reads |
//! |---|---|
//! | [`export`] | `/proc/self/mountinfo` |
//! | [`block`] | `/sys/block/X/{dev,slaves/,queue/*,device/queue_depth,device/scsi_disk/*/cache_type}` |
//! | [`md`] | `/sys/block/mdX/md/*`, `/proc/mdstat`, `/proc/meminfo` |
//! | [`nic`] | `/sys/class/net/IF/{speed,duplex,operstate,mtu,device,bonding/*,queues/rx-*/rps_cpus}`, `/proc/net/bonding/*`, `/proc/interrupts`, `/sys/devices/system/cpu/online` |
//! | [`kernel`] | `/sys/module/nbd`, `/lib/modules/RELEASE/modules.{dep,builtin}`, `/sys/block/nbdX/{pid,queue/io_timeout}`, `/proc/PID/cmdline`, `/sys/block/dm-X/{dm/uuid,dm/name,slaves/}` |
//! | [`gather`] | rtnetlink (`RTM_GETLINK`, `RTM_GETROUTE`, `RTM_GETQDISC`), getifaddrs, the ethtool ioctl, `/proc/sys/net/ipv4/{tcp_rmem,tcp_wmem,tcp_adv_win_scale,tcp_congestion_control,conf/*/{arp_ignore,arp_announce,rp_filter}}` |
//! | [`icmp`] | ICMP echo with don't-fragment from each path's source and device |
//! | [`probe`] | NBD READs over each path with braid's connection code, `TCP_INFO` |
//!
//! The deciding functions ([`md::check`], [`paths`], [`tcp`], [`subnet`],
//! [`nic::check_link`], ...) take what was read and return findings; the
//! live parts ([`gather`], [`icmp`], [`probe`], [`netns`]) only read.

pub mod apply;
pub mod block;
pub mod client;
pub mod export;
pub mod finding;
pub mod gather;
pub mod icmp;
pub mod kernel;
pub mod md;
pub mod netns;
pub mod nic;
pub mod parse;
pub mod paths;
pub mod probe;
pub mod render;
pub mod root;
pub mod serve;
pub mod subnet;
pub mod tcp;
pub mod units;

pub use client::ClientScope;
pub use export::ExportRef;
pub use finding::{Evidence, Finding, Fix, Report, Severity, Subject};
pub use root::Root;
pub use serve::ServeScope;

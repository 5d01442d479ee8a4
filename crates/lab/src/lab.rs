//! [`Lab`]: two namespaces joined by shaped veth paths, with the operations
//! tests and benchmarks need (cut, restore, re-rate, run things inside,
//! read counters). It owns its namespaces: dropping it removes them.

use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::cmd::{self, run_ok, tool, ChildGuard};
use crate::config::{check_name, Addressing, Cut, LabConfig, Rate, Shaping, Side, MAX_PATHS};
use crate::counters::{parse_net_dev, Counters};
use crate::delay::Delay;
use crate::netns;
use crate::topo::{self, LabSpec, PathInfo};
use crate::LabError;

/// A running lab. Dropping it (also while unwinding from a panic) stops
/// every process inside its namespaces and deletes them, which deletes the
/// veths and nftables tables with them.
#[derive(Debug)]
pub struct Lab {
    spec: LabSpec,
    rates: Mutex<Vec<Rate>>,
    /// False once the namespaces are deleted or handed over by [`Lab::keep`].
    armed: bool,
}

impl Lab {
    /// Builds a lab: removes leftovers of crashed test runs, then creates
    /// the storage and client namespaces and one shaped veth pair per rate.
    ///
    /// # Errors
    /// [`LabError::InvalidConfig`] for no paths, too many, or a bad or taken
    /// name; [`LabError::NotRoot`] / [`LabError::ToolMissing`] when the lab
    /// cannot run here; [`LabError::Command`] when a step fails (whatever
    /// was built is removed again).
    pub fn up(cfg: LabConfig) -> Result<Lab, LabError> {
        let started = Instant::now();
        if cfg.rates.is_empty() || cfg.rates.len() > MAX_PATHS {
            return Err(LabError::InvalidConfig {
                reason: format!("a lab has 1 to {MAX_PATHS} paths, not {}", cfg.rates.len()),
            });
        }
        crate::available()?;
        netns::clean_leftovers();
        let tag = match &cfg.name {
            None => netns::test_tag(),
            Some(name) => {
                check_name(name)?;
                format!("{}{name}", netns::NAMED_PREFIX)
            }
        };
        let spec = LabSpec {
            storage_ns: format!("{tag}-s"),
            client_ns: format!("{tag}-c"),
            tag,
            name: cfg.name.clone(),
            addressing: cfg.addressing,
            shaping: cfg.shaping,
            paths: (cfg.rates.iter().enumerate())
                .map(|(i, &rate)| PathInfo::new(cfg.addressing, i + 1, rate))
                .collect(),
        };
        for ns in [&spec.storage_ns, &spec.client_ns] {
            if netns::exists(ns) {
                return Err(LabError::InvalidConfig {
                    reason: format!(
                        "namespace {ns} already exists; remove that lab first \
                         (braid-lab down --name {})",
                        cfg.name.as_deref().unwrap_or("NAME")
                    ),
                });
            }
        }
        let lab = Lab {
            rates: Mutex::new(cfg.rates.clone()),
            spec,
            armed: true,
        };
        // From here on an early return drops `lab`, which removes whatever
        // part of it exists.
        lab.build()?;
        tracing::info!(
            lab = %lab.spec.tag,
            paths = lab.spec.paths.len(),
            addressing = %lab.spec.addressing,
            shaping = %lab.spec.shaping,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "lab up"
        );
        Ok(lab)
    }

    /// Takes charge of a lab that already exists (one kept by
    /// [`Lab::keep`], e.g. by the CLI in an earlier process). Dropping the
    /// result deletes it, unless it is kept again.
    ///
    /// # Errors
    /// [`LabError::InvalidConfig`] if its namespaces are gone.
    pub fn adopt(spec: LabSpec) -> Result<Lab, LabError> {
        for side in [Side::Storage, Side::Client] {
            if !netns::exists(spec.ns(side)) {
                return Err(LabError::InvalidConfig {
                    reason: format!(
                        "namespace {} does not exist; bring the lab up again",
                        spec.ns(side)
                    ),
                });
            }
        }
        Ok(Lab {
            rates: Mutex::new(spec.paths.iter().map(|p| p.rate).collect()),
            spec,
            armed: true,
        })
    }

    /// Leaves the lab running after this value is gone and returns its
    /// description, for [`Lab::adopt`] later.
    pub fn keep(mut self) -> LabSpec {
        self.armed = false;
        self.spec()
    }

    /// Tears the lab down now, reporting failures that `Drop` can only log.
    ///
    /// # Errors
    /// [`LabError::Command`] if a namespace could not be deleted.
    pub fn down(mut self) -> Result<(), LabError> {
        self.teardown()
    }

    /// The lab's description, with the current rates.
    pub fn spec(&self) -> LabSpec {
        let mut spec = self.spec.clone();
        for (p, r) in spec.paths.iter_mut().zip(self.rates().iter()) {
            p.rate = *r;
        }
        spec
    }

    /// The namespace of one side, e.g. for `ip netns exec`.
    pub fn ns(&self, side: Side) -> &str {
        self.spec.ns(side)
    }

    /// Every path, path 1 first, with its current rate.
    pub fn paths(&self) -> Vec<PathInfo> {
        self.spec().paths
    }

    /// One path (1-based).
    ///
    /// # Errors
    /// [`LabError::NoSuchPath`] outside `1..=paths`.
    pub fn path(&self, index: usize) -> Result<PathInfo, LabError> {
        let mut p = self.path_ref(index)?.clone();
        p.rate = self.rates()[index - 1];
        Ok(p)
    }

    /// Cuts path `index` (1-based) until [`Lab::restore`].
    ///
    /// # Errors
    /// [`LabError::NoSuchPath`]; [`LabError::Command`] if `ip` or `nft`
    /// fails.
    pub fn cut(&self, index: usize, how: Cut) -> Result<(), LabError> {
        let p = self.path_ref(index)?;
        tracing::info!(lab = %self.spec.tag, path = index, ?how, "cutting path");
        match how {
            Cut::LinkDown => self.ip(Side::Client, &[format!("link set {} down", p.client_iface)]),
            Cut::Blackhole => {
                let script = topo::blackhole_script(&self.spec.nft_table(index), &p.client_iface);
                run_ok(self.nft(["-f", "-"]), Some(&script)).map(drop)
            }
        }
    }

    /// Undoes any cut of path `index`: removes its blackhole, brings the
    /// link up and puts back the routes a link-down removed. Harmless on a
    /// path that is not cut.
    ///
    /// # Errors
    /// [`LabError::NoSuchPath`]; [`LabError::Command`] if a tool fails.
    pub fn restore(&self, index: usize) -> Result<(), LabError> {
        let p = self.path_ref(index)?;
        tracing::info!(lab = %self.spec.tag, path = index, "restoring path");
        let table = self.spec.nft_table(index);
        match run_ok(self.nft(["delete", "table", "inet", &table]), None) {
            // The usual case: the path was not blackholed.
            Err(LabError::Command { stderr, .. }) if stderr.contains("No such file") => {}
            other => other.map(drop)?,
        }
        self.ip(Side::Client, &[format!("link set {} up", p.client_iface)])?;
        for side in [Side::Client, Side::Storage] {
            self.ip(side, &topo::route_lines(&self.spec, side, p))?;
        }
        Ok(())
    }

    /// How path `index` is cut right now, as the system says (so it also
    /// sees cuts made by another process, e.g. the CLI); `None` if it is up.
    /// A blackhole is reported before a link-down when both apply.
    ///
    /// # Errors
    /// [`LabError::NoSuchPath`]; [`LabError::Command`] if `ip` fails.
    pub fn cut_state(&self, index: usize) -> Result<Option<Cut>, LabError> {
        let p = self.path_ref(index)?;
        let table = self.spec.nft_table(index);
        if run_ok(self.nft(["list", "table", "inet", &table]), None).is_ok() {
            return Ok(Some(Cut::Blackhole));
        }
        let link = run_ok(
            tool(
                "ip",
                [
                    "-n",
                    self.ns(Side::Client),
                    "-o",
                    "link",
                    "show",
                    "dev",
                    &p.client_iface,
                ],
            ),
            None,
        )?;
        // `ip -o link` prints the flags as <BROADCAST,MULTICAST,UP,LOWER_UP>.
        let flags = link
            .split_once('<')
            .and_then(|(_, r)| r.split_once('>'))
            .map(|(f, _)| f);
        let up = flags.is_some_and(|f| f.split(',').any(|f| f == "UP"));
        Ok((!up).then_some(Cut::LinkDown))
    }

    /// Re-shapes path `index` (both directions) to `rate`.
    ///
    /// # Errors
    /// [`LabError::NoSuchPath`]; [`LabError::Command`] if `tc` fails.
    pub fn set_rate(&self, index: usize, rate: Rate) -> Result<(), LabError> {
        let p = self.path_ref(index)?;
        for side in [Side::Client, Side::Storage] {
            let dev = p.iface(side);
            let segs = topo::gso_max_segs(rate, self.spec.shaping);
            self.ip(side, &[format!("link set {dev} gso_max_segs {segs}")])?;
            shape(self.ns(side), dev, rate, self.spec.shaping)?;
        }
        self.rates()[index - 1] = rate;
        tracing::info!(lab = %self.spec.tag, path = index, %rate, "rate set");
        Ok(())
    }

    /// Delays every packet that `side` sends on path `index` by `delay`,
    /// until the returned guard is dropped: the path's round trip grows by
    /// `delay` for every protocol, and its rate stays shaped (see
    /// `delay.rs` for how, on a kernel without netem). Split addressing
    /// only; a socket bound to the path's device (SO_BINDTODEVICE) is not
    /// routed through the delay.
    ///
    /// # Errors
    /// [`LabError::NoSuchPath`]; [`LabError::InvalidConfig`] for another
    /// addressing; [`LabError::Io`] / [`LabError::Command`] if the device or
    /// its route cannot be made.
    pub fn delay(&self, index: usize, side: Side, delay: Duration) -> Result<Delay, LabError> {
        let p = self.path_ref(index)?;
        if self.spec.addressing != Addressing::Split {
            return Err(LabError::InvalidConfig {
                reason: format!(
                    "a delay needs split addressing (this lab's is {})",
                    self.spec.addressing
                ),
            });
        }
        let peer = match side {
            Side::Client => Side::Storage,
            Side::Storage => Side::Client,
        };
        let link = |side: Side| {
            run_ok(
                tool(
                    "ip",
                    [
                        "-n",
                        self.ns(side),
                        "-o",
                        "link",
                        "show",
                        "dev",
                        p.iface(side),
                    ],
                ),
                None,
            )
        };
        let peer_link = link(peer)?;
        let peer_mac = peer_link
            .split_once("link/ether ")
            .and_then(|(_, r)| crate::delay::parse_mac(r.split_whitespace().next()?))
            .ok_or_else(|| LabError::Parse {
                what: format!("`ip link show {}`", p.iface(peer)),
                detail: "no link/ether address".into(),
            })?;
        let own_link = link(side)?;
        let mtu = own_link
            .split_once(" mtu ")
            .and_then(|(_, r)| r.split_whitespace().next()?.parse::<u32>().ok())
            .unwrap_or(1500);
        let tun = format!("brd{index}");
        let guard = crate::delay::start(crate::delay::Line {
            ns: self.ns(side).to_owned(),
            tun: tun.clone(),
            veth: p.iface(side).to_owned(),
            peer_mac,
            delay,
        })?;
        self.ip(
            side,
            &[
                format!("link set {tun} up mtu {mtu}"),
                format!(
                    "route replace {}/32 dev {tun} src {} congctl cubic",
                    p.addr(peer),
                    p.addr(side)
                ),
            ],
        )?;
        tracing::info!(lab = %self.spec.tag, path = index, ?side, ?delay, "delay added");
        Ok(guard)
    }

    /// Starts `cmd` inside one side's namespace. The caller's stdio, env
    /// and working directory settings are kept. The guard stops the process
    /// (SIGTERM, then SIGKILL) when dropped.
    ///
    /// # Errors
    /// [`LabError::ToolMissing`] / [`LabError::Spawn`] if it cannot start.
    pub fn spawn(&self, side: Side, mut cmd: Command) -> Result<ChildGuard, LabError> {
        let command = cmd::describe(&cmd);
        self.in_ns(side, &mut cmd)?;
        Ok(ChildGuard::new(cmd::spawn(&mut cmd)?, command))
    }

    /// Runs `cmd` inside one side's namespace to completion, capturing its
    /// output; killed after `timeout`. The exit status is not checked.
    ///
    /// # Errors
    /// [`LabError::Timeout`] if it runs too long; spawn errors as
    /// [`Lab::spawn`].
    pub fn output(
        &self,
        side: Side,
        mut cmd: Command,
        timeout: Duration,
    ) -> Result<Output, LabError> {
        self.in_ns(side, &mut cmd)?;
        cmd::run(cmd, None, timeout)
    }

    /// Runs `f` on a fresh thread inside one side's namespace and returns
    /// its result: sockets it creates (for example by a tokio runtime built
    /// inside `f`) belong to that namespace. A panic in `f` resumes in the
    /// caller.
    ///
    /// # Errors
    /// [`LabError::Io`] if the namespace cannot be entered.
    pub fn enter<F, R>(&self, side: Side, f: F) -> Result<R, LabError>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        netns::enter(self.ns(side), f)
    }

    /// Traffic counters of path `index`'s client-side veth.
    ///
    /// # Errors
    /// [`LabError::NoSuchPath`]; [`LabError::Parse`] if the interface is
    /// missing from `/proc/net/dev`.
    pub fn counters(&self, index: usize) -> Result<Counters, LabError> {
        let iface = &self.path_ref(index)?.client_iface;
        // /proc/thread-self, not /proc/self: only this thread is in the lab.
        let text = self
            .enter(Side::Client, || {
                std::fs::read_to_string("/proc/thread-self/net/dev")
            })?
            .map_err(|e| LabError::io("reading /proc/net/dev in the client namespace", e))?;
        parse_net_dev(&text, iface).ok_or_else(|| LabError::Parse {
            what: "/proc/net/dev".into(),
            detail: format!("no line for {iface}"),
        })
    }

    /// iperf3 over `paths` (1-based) at once for `seconds`: a server per
    /// path in the storage namespace, a client per path bound to the path's
    /// client address. Returns each path's goodput in MB/s (10^6 bytes/s),
    /// in the order given. `reverse` measures storage-to-client (reads).
    ///
    /// # Errors
    /// [`LabError::ToolMissing`] without iperf3; [`LabError::Command`] or
    /// [`LabError::Parse`] if a run fails.
    pub fn iperf3(
        &self,
        paths: &[usize],
        seconds: u32,
        reverse: bool,
    ) -> Result<Vec<f64>, LabError> {
        let paths = (paths.iter())
            .map(|&i| self.path_ref(i).cloned())
            .collect::<Result<Vec<_>, _>>()?;
        crate::iperf::run(self, &paths, seconds, reverse)
    }

    fn path_ref(&self, index: usize) -> Result<&PathInfo, LabError> {
        index
            .checked_sub(1)
            .and_then(|i| self.spec.paths.get(i))
            .ok_or(LabError::NoSuchPath {
                index,
                paths: self.spec.paths.len(),
            })
    }

    fn rates(&self) -> MutexGuard<'_, Vec<Rate>> {
        // A panic while holding the lock cannot leave a Vec<Rate> half-made.
        self.rates.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn build(&self) -> Result<(), LabError> {
        let spec = &self.spec;
        for side in [Side::Storage, Side::Client] {
            let ns = spec.ns(side);
            netns::add(ns)?;
            // Before any veth exists, so that every veth inherits them: no
            // IPv6 (its neighbour discovery would move counters on idle
            // paths) and no reverse-path filter (source-routed replies may
            // legitimately arrive on another path's veth).
            for (key, value) in [
                ("net/ipv6/conf/all/disable_ipv6", "1"),
                ("net/ipv6/conf/default/disable_ipv6", "1"),
                ("net/ipv4/conf/all/rp_filter", "0"),
                ("net/ipv4/conf/default/rp_filter", "0"),
            ] {
                netns::sysctl(ns, key, value)?;
            }
            // Only allowed where the host allows cubic; routes carry
            // `congctl cubic` anyway (see topo::route_lines).
            if let Err(e) = netns::sysctl(ns, "net/ipv4/tcp_congestion_control", "cubic") {
                tracing::debug!(error = %e, "namespace default stays the host's; routes set cubic");
            }
        }
        let mut client = vec!["link set lo up".to_owned()];
        let mut storage = client.clone();
        for p in &spec.paths {
            client.extend(topo::veth_lines(spec, p));
            client.extend(topo::addr_lines(spec, Side::Client, p));
            storage.extend(topo::addr_lines(spec, Side::Storage, p));
        }
        self.ip(Side::Client, &client)?;
        self.ip(Side::Storage, &storage)?;
        for side in [Side::Client, Side::Storage] {
            let routes: Vec<String> = (spec.paths.iter())
                .flat_map(|p| topo::route_lines(spec, side, p))
                .collect();
            self.ip(side, &routes)?;
            let shaping: Vec<String> = (spec.paths.iter())
                .filter_map(|p| topo::tbf_line(p.iface(side), p.rate, spec.shaping))
                .collect();
            if !shaping.is_empty() {
                run_ok(
                    tool("tc", ["-n", self.ns(side), "-batch", "-"]),
                    Some(&lines(&shaping)),
                )?;
            }
        }
        Ok(())
    }

    fn teardown(&mut self) -> Result<(), LabError> {
        if !std::mem::replace(&mut self.armed, false) {
            return Ok(());
        }
        let started = Instant::now();
        let client = netns::delete(&self.spec.client_ns);
        let storage = netns::delete(&self.spec.storage_ns);
        tracing::info!(
            lab = %self.spec.tag,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "lab down"
        );
        client.and(storage)
    }

    /// Runs `ip -batch` lines inside one side's namespace.
    fn ip(&self, side: Side, batch: &[String]) -> Result<(), LabError> {
        run_ok(
            tool("ip", ["-n", self.ns(side), "-batch", "-"]),
            Some(&lines(batch)),
        )
        .map(drop)
    }

    /// `nft` inside the client namespace (nft has no netns option).
    fn nft<const N: usize>(&self, args: [&str; N]) -> Command {
        let mut c = tool("ip", ["netns", "exec", self.ns(Side::Client), "nft"]);
        c.args(args);
        c
    }

    /// Makes `cmd` join the side's namespace between fork and exec.
    fn in_ns(&self, side: Side, cmd: &mut Command) -> Result<(), LabError> {
        let ns = netns::open(self.ns(side))?;
        // SAFETY: the closure runs in the forked child before exec and only
        // makes the setns(2) system call, which is async-signal-safe. The
        // fd stays open in the child until exec (it is O_CLOEXEC), because
        // `ns` itself moves into the closure and lives as long as `cmd`.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        Ok(())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::warn!(lab = %self.spec.tag, error = %e, "lab teardown failed");
            // Not eprintln!: a panic here, while a failing test unwinds,
            // would abort the process and leave the lab behind; and the
            // harness would hide the line in a passing test.
            let _ = writeln!(
                std::io::stderr(),
                "braid-lab: teardown of {} failed: {e}",
                self.spec.tag
            );
        }
    }
}

/// Shapes one veth end; unlimited removes the shaping.
fn shape(ns: &str, dev: &str, rate: Rate, shaping: Shaping) -> Result<(), LabError> {
    match topo::tbf_line(dev, rate, shaping) {
        Some(line) => {
            run_ok(tool("tc", ["-n", ns, "-batch", "-"]), Some(&lines(&[line]))).map(drop)
        }
        None => match run_ok(
            tool("tc", ["-n", ns, "qdisc", "del", "dev", dev, "root"]),
            None,
        ) {
            // Already unshaped: veth's default has no root qdisc to delete.
            Err(LabError::Command { stderr, .. }) if stderr.contains("handle of zero") => Ok(()),
            other => other.map(drop),
        },
    }
}

fn lines(batch: &[String]) -> String {
    let mut s = batch.join("\n");
    s.push('\n');
    s
}

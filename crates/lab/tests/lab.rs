//! The lab against the real kernel: paths carry traffic on their own veths,
//! cuts and restores work, and nothing is left behind. Needs root; skips
//! (loudly) without it, except under CI. No timing thresholds: every wait is
//! bounded, but how fast is measured by the CLI and benchmarks, not here.

use braid_test_needs::needs;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use braid_lab::{Addressing, Counters, Cut, Lab, LabConfig, Rate, Side};
use socket2::{Domain, Socket, Type};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Enough to stand out from any stray control traffic on an idle path.
const PAYLOAD: usize = 256 * 1024;
/// What an idle path may carry meanwhile (ARP and the like), far below PAYLOAD.
const IDLE_NOISE: u64 = 16 * 1024;

fn up_lab(rates: &[&str], addressing: Addressing) -> Lab {
    let rates = rates.iter().map(|r| r.parse().unwrap());
    Lab::up(LabConfig::new(rates).addressing(addressing)).expect("lab up")
}

fn netns_list() -> String {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A listener in the storage namespace on `addr`, any port.
fn listen(lab: &Lab, addr: Ipv4Addr) -> TcpListener {
    lab.enter(Side::Storage, move || TcpListener::bind((addr, 0)))
        .unwrap()
        .expect("bind in storage namespace")
}

/// A connection from the client namespace, optionally bound to a source
/// address and/or an interface.
fn connect(
    lab: &Lab,
    src: Option<Ipv4Addr>,
    device: Option<&str>,
    dst: SocketAddr,
    timeout: Duration,
) -> io::Result<TcpStream> {
    lab.enter(Side::Client, move || {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
        if let Some(dev) = device {
            s.bind_device(Some(dev.as_bytes()))?;
        }
        if let Some(src) = src {
            s.bind(&SocketAddr::from((src, 0)).into())?;
        }
        s.connect_timeout(&dst.into(), timeout)?;
        Ok(s.into())
    })
    .unwrap()
}

/// The next connection on `listener`, waiting at most IO_TIMEOUT.
fn accept(listener: &TcpListener) -> TcpStream {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + IO_TIMEOUT;
    let server = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    server.set_nonblocking(false).unwrap();
    server
}

/// Sends PAYLOAD bytes client -> storage and back storage -> client over
/// an established connection, checking that all of it arrived.
fn exchange(listener: &TcpListener, mut client: TcpStream) {
    let mut server = accept(listener);
    for s in [&server, &client] {
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    }
    let echo = thread::spawn(move || -> io::Result<usize> {
        let mut buf = vec![0; PAYLOAD];
        server.read_exact(&mut buf)?;
        server.write_all(&buf)?;
        Ok(buf.len())
    });
    client.write_all(&vec![7u8; PAYLOAD]).unwrap();
    let mut back = vec![0; PAYLOAD];
    client.read_exact(&mut back).unwrap();
    assert_eq!(echo.join().unwrap().unwrap(), PAYLOAD);
    assert!(back.iter().all(|&b| b == 7));
}

fn counters(lab: &Lab) -> Vec<Counters> {
    (1..=lab.paths().len())
        .map(|i| lab.counters(i).unwrap())
        .collect()
}

/// Asserts that between `before` and now, path `busy` carried the exchange
/// both ways and every other path stayed idle.
fn assert_carried_by(lab: &Lab, before: &[Counters], busy: usize) {
    for (i, (b, a)) in before.iter().zip(counters(lab)).enumerate() {
        let (tx, rx) = (a.tx_bytes - b.tx_bytes, a.rx_bytes - b.rx_bytes);
        if i + 1 == busy {
            assert!(
                tx >= PAYLOAD as u64 && rx >= PAYLOAD as u64,
                "path {busy} carried only tx {tx} rx {rx}"
            );
        } else {
            assert!(
                tx < IDLE_NOISE && rx < IDLE_NOISE,
                "path {} moved tx {tx} rx {rx}, expected path {busy}",
                i + 1
            );
        }
    }
}

fn storage_port(lab: &Lab, index: usize, listener: &TcpListener) -> SocketAddr {
    SocketAddr::from((
        lab.path(index).unwrap().storage_addr,
        listener.local_addr().unwrap().port(),
    ))
}

#[needs("root", "ip", "tc")]
fn each_path_carries_its_own_traffic() {
    if !braid_lab::require_or_skip("each_path_carries_its_own_traffic") {
        return;
    }
    let lab = up_lab(&["1gbit", "100mbit"], Addressing::Split);
    for p in lab.paths() {
        let listener = listen(&lab, p.storage_addr);
        let before = counters(&lab);
        let stream = connect(
            &lab,
            None,
            None,
            storage_port(&lab, p.index, &listener),
            CONNECT_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("path {}: {e}", p.index));
        exchange(&listener, stream);
        assert_carried_by(&lab, &before, p.index);
    }
    lab.down().unwrap();
}

#[needs("root", "ip", "tc")]
fn link_down_fails_fast_and_restore_heals() {
    if !braid_lab::require_or_skip("link_down_fails_fast_and_restore_heals") {
        return;
    }
    let lab = up_lab(&["1gbit", "1gbit"], Addressing::Split);
    let l1 = listen(&lab, lab.path(1).unwrap().storage_addr);
    let l2 = listen(&lab, lab.path(2).unwrap().storage_addr);
    lab.cut(1, Cut::LinkDown).unwrap();
    assert_eq!(lab.cut_state(1).unwrap(), Some(Cut::LinkDown));
    assert_eq!(lab.cut_state(2).unwrap(), None);
    // The kernel knows: the route is gone, so this fails at once rather
    // than after the timeout (not asserted: no timing in tests).
    let err = connect(
        &lab,
        None,
        None,
        storage_port(&lab, 1, &l1),
        CONNECT_TIMEOUT,
    )
    .unwrap_err();
    eprintln!("connect over a downed link: {err}");
    let s2 = connect(
        &lab,
        None,
        None,
        storage_port(&lab, 2, &l2),
        CONNECT_TIMEOUT,
    )
    .unwrap();
    exchange(&l2, s2);

    lab.restore(1).unwrap();
    assert_eq!(lab.cut_state(1).unwrap(), None);
    let before = counters(&lab);
    let s1 = connect(
        &lab,
        None,
        None,
        storage_port(&lab, 1, &l1),
        CONNECT_TIMEOUT,
    )
    .unwrap();
    exchange(&l1, s1);
    assert_carried_by(&lab, &before, 1);
}

#[needs("root", "ip", "tc")]
fn blackhole_drops_silently_and_restore_heals() {
    if !braid_lab::require_or_skip("blackhole_drops_silently_and_restore_heals") {
        return;
    }
    let lab = up_lab(&["1gbit", "1gbit"], Addressing::Split);
    let l1 = listen(&lab, lab.path(1).unwrap().storage_addr);
    let l2 = listen(&lab, lab.path(2).unwrap().storage_addr);
    // A connection made before the cut...
    let mut early = connect(
        &lab,
        None,
        None,
        storage_port(&lab, 1, &l1),
        CONNECT_TIMEOUT,
    )
    .unwrap();
    let mut early_server = accept(&l1);
    lab.cut(1, Cut::Blackhole).unwrap();
    // ...stays "up" but carries nothing.
    early.write_all(b"during").unwrap();
    early_server
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 6];
    let err = early_server.read(&mut buf).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{err}"
    );
    assert_eq!(lab.cut_state(1).unwrap(), Some(Cut::Blackhole));
    let err = connect(
        &lab,
        None,
        None,
        storage_port(&lab, 1, &l1),
        Duration::from_millis(500),
    )
    .unwrap_err();
    // Nothing answers, nothing refuses: only the timeout notices.
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    let s2 = connect(
        &lab,
        None,
        None,
        storage_port(&lab, 2, &l2),
        CONNECT_TIMEOUT,
    )
    .unwrap();
    exchange(&l2, s2);

    lab.restore(1).unwrap();
    assert_eq!(lab.cut_state(1).unwrap(), None);
    // TCP's retransmission delivers what was held back.
    early_server.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    early_server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"during");
    let s1 = connect(
        &lab,
        None,
        None,
        storage_port(&lab, 1, &l1),
        CONNECT_TIMEOUT,
    )
    .unwrap();
    exchange(&l1, s1);
    // Restoring an intact path is harmless.
    lab.restore(2).unwrap();
}

#[needs("root", "ip", "tc")]
fn same_subnet_routes_by_source_address() {
    if !braid_lab::require_or_skip("same_subnet_routes_by_source_address") {
        return;
    }
    let lab = up_lab(&["1gbit", "1gbit"], Addressing::SameSubnet);
    let paths = lab.paths();
    assert_eq!(
        paths[0].client_addr.octets()[..3],
        paths[1].client_addr.octets()[..3]
    );
    for p in &paths {
        // To the other path's portal as well: the source address alone
        // decides the veth, which is what policy routing is for.
        for dst in &paths {
            let listener = listen(&lab, dst.storage_addr);
            let before = counters(&lab);
            let s = connect(
                &lab,
                Some(p.client_addr),
                None,
                storage_port(&lab, dst.index, &listener),
                CONNECT_TIMEOUT,
            )
            .unwrap();
            exchange(&listener, s);
            let after = counters(&lab);
            let tx = after[p.index - 1].tx_bytes - before[p.index - 1].tx_bytes;
            assert!(
                tx >= PAYLOAD as u64,
                "from {} to {}: path {} sent only {tx}",
                p.client_addr,
                dst.storage_addr,
                p.index
            );
            if dst.index == p.index {
                assert_carried_by(&lab, &before, p.index);
            }
        }
    }
}

#[needs("root", "ip", "tc")]
fn flux_uses_one_veth_unless_bound_to_an_interface() {
    if !braid_lab::require_or_skip("flux_uses_one_veth_unless_bound_to_an_interface") {
        return;
    }
    let lab = up_lab(&["1gbit", "1gbit"], Addressing::SameSubnetFlux);
    let p2 = lab.path(2).unwrap();
    let listener = listen(&lab, p2.storage_addr);
    let to = storage_port(&lab, 2, &listener);
    // Bound to path 2's address, yet sent out of path 1's veth.
    let before = counters(&lab);
    exchange(
        &listener,
        connect(&lab, Some(p2.client_addr), None, to, CONNECT_TIMEOUT).unwrap(),
    );
    let after = counters(&lab);
    assert!(
        after[0].tx_bytes - before[0].tx_bytes >= PAYLOAD as u64,
        "flux did not use path 1"
    );
    // Bound to path 2's interface: path 2 both ways.
    let before = counters(&lab);
    exchange(
        &listener,
        connect(&lab, None, Some(&p2.client_iface), to, CONNECT_TIMEOUT).unwrap(),
    );
    assert_carried_by(&lab, &before, 2);
}

#[needs("root", "ip", "tc")]
fn spawn_output_and_enter_run_inside() {
    if !braid_lab::require_or_skip("spawn_output_and_enter_run_inside") {
        return;
    }
    let lab = up_lab(&["100mbit"], Addressing::Split);
    let p = lab.path(1).unwrap();
    let mut c = Command::new("ip");
    c.args(["-br", "addr"]);
    let out = lab
        .output(Side::Client, c, Duration::from_secs(10))
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&p.client_addr.to_string()), "{text}");
    // Only the lab's client namespace has this address.
    let addr = p.client_addr;
    lab.enter(Side::Client, move || TcpListener::bind((addr, 0)).map(drop))
        .unwrap()
        .unwrap();

    let mut sleeper = Command::new("sleep");
    sleeper.arg("600");
    let guard = lab.spawn(Side::Storage, sleeper).unwrap();
    let pid = guard.id();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    let status = guard.stop().unwrap();
    assert!(!status.success(), "sleep 600 ended by itself?");

    lab.set_rate(1, Rate::Unlimited).unwrap();
    assert_eq!(lab.path(1).unwrap().rate, Rate::Unlimited);
    lab.set_rate(1, Rate::GBIT).unwrap();
    let mut c = Command::new("tc");
    c.args(["qdisc", "show", "dev", &p.storage_iface]);
    let out = lab
        .output(Side::Storage, c, Duration::from_secs(10))
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("tbf"));
}

#[needs("root", "ip", "tc")]
fn drop_removes_namespaces_and_processes() {
    if !braid_lab::require_or_skip("drop_removes_namespaces_and_processes") {
        return;
    }
    let lab = up_lab(&["1gbit", "1gbit"], Addressing::Split);
    let names = [
        lab.ns(Side::Client).to_owned(),
        lab.ns(Side::Storage).to_owned(),
    ];
    assert!(names.iter().all(|n| netns_list().contains(n.as_str())));
    let mut sleeper = Command::new("sleep");
    sleeper.arg("600");
    let mut guard = lab.spawn(Side::Client, sleeper).unwrap();
    drop(lab);
    let list = netns_list();
    assert!(
        names.iter().all(|n| !list.contains(n.as_str())),
        "left behind: {list}"
    );
    // Stopped by the lab, not by its guard.
    assert!(guard
        .wait_timeout(Duration::from_secs(5))
        .unwrap()
        .is_some());

    // Also when a test panics while holding the lab.
    let names = std::sync::Mutex::new(Vec::new());
    let panicked = std::panic::catch_unwind(|| {
        let lab = up_lab(&["1gbit"], Addressing::Split);
        names.lock().unwrap().push(lab.ns(Side::Client).to_owned());
        panic!("test failure while the lab is up");
    });
    assert!(panicked.is_err());
    let name = names.lock().unwrap().pop().unwrap();
    assert!(!netns_list().contains(name.as_str()));
}

/// Removes the fake leftover if the test fails before `up` does.
struct FakeLeftover(String);
impl Drop for FakeLeftover {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .output();
    }
}

#[needs("root", "ip", "tc")]
fn up_removes_leftovers_of_dead_runs() {
    if !braid_lab::require_or_skip("up_removes_leftovers_of_dead_runs") {
        return;
    }
    // A PID that just ended: the owner of a "crashed" run.
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let fake = FakeLeftover(format!("brl-{dead}-9999-s"));
    let ok = Command::new("ip")
        .args(["netns", "add", &fake.0])
        .status()
        .unwrap();
    assert!(ok.success());
    // A process the crashed run left inside.
    let child = Command::new("ip")
        .args(["netns", "exec", &fake.0, "sleep", "600"])
        .spawn()
        .unwrap();
    let mut orphan = braid_lab::ChildGuard::new(child, "sleep 600");
    // Let it enter the namespace before looking for it.
    thread::sleep(Duration::from_millis(200));

    let lab = up_lab(&["1gbit"], Addressing::Split);
    assert!(
        !netns_list().contains(fake.0.as_str()),
        "leftover {} survived",
        fake.0
    );
    assert!(
        orphan
            .wait_timeout(Duration::from_secs(5))
            .unwrap()
            .is_some(),
        "orphan still runs"
    );
    // A live run's namespaces are not leftovers.
    let other = up_lab(&["1gbit"], Addressing::Split);
    assert!(netns_list().contains(lab.ns(Side::Client)));
    drop(other);
}

/// The smallest round trip the kernel saw on a TCP connection, in µs.
fn min_rtt_us(s: &TcpStream) -> u32 {
    use std::os::fd::AsRawFd;
    let mut info = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the zeroed struct.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "TCP_INFO");
    // SAFETY: zeroed and filled by the kernel; plain integers.
    unsafe { info.assume_init() }.tcpi_min_rtt
}

#[needs("root", "ip", "tc")]
fn a_delay_lengthens_one_path_round_trip_and_ends_with_its_guard() {
    if !braid_lab::require_or_skip("a_delay_lengthens_one_path_round_trip") {
        return;
    }
    let lab = up_lab(&["100mbit", "100mbit"], Addressing::Split);
    let delay = Duration::from_millis(20);
    let guard = lab.delay(1, Side::Storage, delay).unwrap();
    let rtt = |index: usize| {
        let listener = listen(&lab, lab.path(index).unwrap().storage_addr);
        let stream = connect(
            &lab,
            None,
            None,
            storage_port(&lab, index, &listener),
            CONNECT_TIMEOUT,
        )
        .unwrap();
        let kept = stream.try_clone().unwrap();
        // Data still arrives whole, both ways, through the delay line.
        exchange(&listener, stream);
        min_rtt_us(&kept)
    };
    // A packet held for 20 ms cannot come back sooner: this bound is what
    // the delay guarantees, not a measure of speed.
    let delayed = rtt(1);
    assert!(
        delayed >= 20_000,
        "path 1 round trip {delayed} µs with a 20 ms delay"
    );
    let other = rtt(2);
    assert!(other < 20_000, "path 2 is not delayed, yet {other} µs");
    drop(guard);
    let after = rtt(1);
    assert!(after < 20_000, "the delay outlived its guard: {after} µs");
    lab.down().unwrap();
}

"""What bench/aggregate's measuring stands on: the processes it starts and
the commands it runs (bounded, stopped by PID), how busy the machine is
besides, and the lab with what its veths carried.

Only glue, imported by bench/aggregate (which sets LAB from --bin-dir).
"""

import json
import os
import re
import resource
import subprocess
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# braid-lab; bench/aggregate sets it from --bin-dir.
LAB = os.path.join(ROOT, "target", "release", "braid-lab")
STATE_DIR = "/run/braid-lab"


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Failed(Exception):
    """A measurement failed; the message goes into the table."""


# ---------------------------------------------------------------- processes


class Procs:
    """Every long-running process this script starts, stopped by PID."""

    def __init__(self):
        self.live = {}

    def spawn(self, argv, logfile, append=True):
        """Starts argv with stdout and stderr into logfile (a JSON output
        file is truncated instead: a repeated run must not append)."""
        out = open(logfile, "ab" if append else "wb")
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.DEVNULL if not append else subprocess.STDOUT)
        finally:
            out.close()
        self.live[p.pid] = p
        return p

    def stop(self, p, grace=3.0):
        if p is None:
            return
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    log(f"warning: pid {p.pid} did not exit after SIGKILL")
        self.live.pop(p.pid, None)

    def stop_all(self):
        for p in list(self.live.values()):
            self.stop(p, grace=2.0)


PROCS = Procs()


def run(argv, timeout, check=True, stdin=None):
    """Runs argv to completion (killed after `timeout` s); returns (rc, out, err)."""
    try:
        r = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failed(f"{os.path.basename(argv_tool(argv))} timed out after {timeout:.0f} s")
    except FileNotFoundError as e:
        raise Failed(f"{argv[0]} not found ({e})")
    out = r.stdout.decode(errors="replace")
    err = r.stderr.decode(errors="replace")
    if check and r.returncode != 0:
        raise Failed(f"{os.path.basename(argv_tool(argv))} exit {r.returncode}: {last_line(err or out)}")
    return r.returncode, out, err


def argv_tool(argv):
    """The tool's name in `ip netns exec NS [mptcpize run] TOOL ...`."""
    a = list(argv)
    if a[:3] == ["ip", "netns", "exec"]:
        a = a[4:]
    if a[:2] == ["mptcpize", "run"]:
        a = a[2:]
    return a[0] if a else "?"


def last_line(text):
    lines = [strip_ansi(l).strip() for l in text.strip().splitlines() if l.strip()]
    return lines[-1][:200] if lines else "(no output)"


def strip_ansi(s):
    return re.sub(r"\x1b\[[0-9;]*m", "", s)


def busy_compilers():
    """How many rustc or cargo processes run on this machine (read from
    /proc rather than by forking pgrep: it is sampled during measurements)."""
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    n += f.read().strip() in ("rustc", "cargo")
            except OSError:
                pass
    return n


# Seconds the whole run may spend waiting for other people's compilers;
# once spent, measurements go ahead and are marked instead.
WAIT_BUDGET = [600.0]
RETRIES_WHEN_BUSY = 2
# Seconds the whole run may spend repeating disturbed measurements, so that
# a host that steals CPU throughout cannot triple the run's length. A run
# from a fresh checkout takes about 13 min here (release build 2 min
# included); this keeps it under 15 however much the host steals.
REPEAT_BUDGET = [60.0]


CLK_TCK = os.sysconf("SC_CLK_TCK")
# Other people's processes may use this much of one core during a
# measurement before it counts as disturbed.
FOREIGN_CPU_MAX = 0.10


def stat_ticks(pid):
    """(ppid, utime + stime ticks) of one process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces.
    fields = text[text.rfind(")") + 2:].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


def process_ticks():
    """{pid: (ppid, utime + stime ticks)} of every process."""
    res = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            t = stat_ticks(pid)
            if t is not None:
                res[int(pid)] = t
    return res


def with_cpu(fn, pids, child):
    """Runs fn() -> figures (with "bytes" moved) and adds "cpu_s_gib": the
    CPU seconds per GiB moved of each daemon in `pids` ({name: PID}, read
    from /proc) and, named `child`, of the commands fn ran to completion
    (getrusage of the children reaped meanwhile: the client tool)."""
    def daemons():
        return {k: stat_ticks(p) for k, p in pids.items()}

    def reaped():
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime
    d0, r0 = daemons(), reaped()
    res = fn()
    d1, r1 = daemons(), reaped()
    gib = res.get("bytes", 0) / (1 << 30)
    if gib > 0:
        cpu = {k: (d1[k][1] - d0[k][1]) / CLK_TCK / gib for k in pids if d0[k] and d1[k]}
        cpu[child] = (r1 - r0) / gib
        res["cpu_s_gib"] = cpu
    return res


def foreign_cpu(before, after, seconds):
    """Cores used between two process_ticks() samples by user processes that
    are not this script or its descendants (kernel threads, such as the
    softirq work of the lab's own traffic, are left out)."""
    mine = {os.getpid()}
    changed = True
    while changed:
        changed = False
        for pid, (ppid, _) in after.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                changed = True
    ticks = 0
    for pid, (ppid, t) in after.items():
        if pid in mine or pid == 2 or ppid == 2:
            continue
        # A process started since `before` counts all its ticks.
        ticks += t - before.get(pid, (ppid, 0))[1]
    return ticks / CLK_TCK / max(seconds, 1e-3)


def others_busy(window=0.3):
    """(compilers running, cores used by others over `window` seconds).
    Steal time is not waited for: it comes and goes with the host's other
    tenants, and waiting here only lengthened runs without making them
    cleaner; measurements that saw it are marked and repeated instead."""
    a = process_ticks()
    time.sleep(window)
    return busy_compilers(), foreign_cpu(a, process_ticks(), window)


def wait_idle(max_s):
    """Waits (bounded) until no rustc/cargo runs and other processes use
    under FOREIGN_CPU_MAX of a core; returns a description of what still
    ran, or "" when idle."""
    max_s = min(max_s, WAIT_BUDGET[0])
    started = time.monotonic()
    deadline = started + max_s
    said = False
    while True:
        what = describe_busy(*others_busy())
        if not what or time.monotonic() >= deadline:
            break
        if not said:
            log(f"waiting up to {max_s:.0f} s for an idle machine ({what})")
            said = True
        time.sleep(1)
    WAIT_BUDGET[0] -= time.monotonic() - started
    return what


def describe_busy(compilers, cores, steal=0.0):
    parts = []
    if compilers:
        parts.append(f"{compilers} rustc/cargo")
    if cores > FOREIGN_CPU_MAX:
        parts.append(f"other processes used {cores:.2f} cores")
    if steal > STEAL_MAX:
        parts.append(f"the hypervisor took {steal:.0%} of the CPUs (steal time)")
    return ", ".join(parts)


# On a virtual machine the host's other tenants can take CPU time that no
# process here shows: /proc/stat counts it as steal. Above this share of the
# machine a measurement counts as disturbed (seen: 15% steal for minutes,
# iperf3 on one 1gbit path 79 MB/s instead of 117).
STEAL_MAX = 0.05


def cpu_ticks():
    """(total, idle, steal) jiffies of the whole machine."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v[:8]), v[3] + v[4], v[7]


def steal_share(t0, t1):
    total = t1[0] - t0[0]
    return (t1[2] - t0[2]) / total if total > 0 else 0.0


# ---------------------------------------------------------------------- lab


class Lab:
    """A persistent braid-lab lab, driven through its CLI."""

    def __init__(self, name, rates, addressing, shaping):
        self.name, self.rates, self.addressing, self.shaping = name, rates, addressing, shaping
        self.spec = None

    def up(self):
        self.clean()
        run([LAB, "--name", self.name, "up", "--rates", self.rates,
             "--addressing", self.addressing, "--shaping", self.shaping], timeout=60)
        with open(os.path.join(STATE_DIR, f"{self.name}.json")) as f:
            self.spec = json.load(f)
        self.ns_c, self.ns_s = self.spec["client_ns"], self.spec["storage_ns"]
        self.paths = self.spec["paths"]

    def clean(self):
        """Removes a leftover lab of this name (ours: the name says so)."""
        if os.path.exists(os.path.join(STATE_DIR, f"{self.name}.json")):
            run([LAB, "--name", self.name, "down"], timeout=60, check=False)
            try:
                os.remove(os.path.join(STATE_DIR, f"{self.name}.json"))
            except FileNotFoundError:
                pass
        for side in ("s", "c"):
            ns = f"braid-{self.name}-{side}"
            if os.path.exists(f"/run/netns/{ns}"):
                run(["ip", "netns", "del", ns], timeout=30, check=False)

    def down(self):
        if self.spec is not None:
            run([LAB, "--name", self.name, "down"], timeout=60, check=False)
            self.spec = None
        self.clean()

    def c(self, *argv):
        return ["ip", "netns", "exec", self.ns_c, *argv]

    def s(self, *argv):
        return ["ip", "netns", "exec", self.ns_s, *argv]

    @property
    def flux(self):
        return self.addressing == "flux"

    def counters(self):
        """{client iface: (rx bytes, tx bytes)} of every path."""
        _, out, _ = run(["ip", "-j", "-s", "-n", self.ns_c, "link", "show"], timeout=10)
        res = {}
        for link in json.loads(out):
            st = link.get("stats64", {})
            res[link["ifname"]] = (st.get("rx", {}).get("bytes", 0), st.get("tx", {}).get("bytes", 0))
        return res

    def wait_listening(self, ports, timeout=10.0, mptcp=False):
        """Until every port listens in the storage namespace (bounded)."""
        deadline = time.monotonic() + timeout
        while True:
            _, out, _ = run(["ip", "netns", "exec", self.ns_s, "ss", "-Hltn"], timeout=5)
            listening = set()
            for line in out.splitlines():
                f = line.split()
                if len(f) >= 4 and ":" in f[3]:
                    port = f[3].rsplit(":", 1)[1]
                    if port.isdigit():
                        listening.add(int(port))
            if all(p in listening for p in ports):
                return
            if time.monotonic() > deadline:
                raise Failed(f"ports {ports} not listening after {timeout:.0f} s")
            time.sleep(0.05)


class Meter:
    """Wire bytes per path (client veth counters), CPU and compiler activity
    around one measurement. Compilers are looked for every 0.5 s: on a
    2-core machine one rustc halves what the lab can carry."""

    def __init__(self, lab, direction):
        self.lab, self.direction = lab, direction

    # Whether the previous measurement saw nobody else: then only the
    # (cheap) compiler check runs before the next, not a sampling window.
    last_clean = False

    def __enter__(self):
        if Meter.last_clean and not busy_compilers():
            self.busy = ""
        else:
            self.busy = wait_idle(30)
        self.compilers = 0
        self.c0 = self.lab.counters()
        self.t0 = cpu_ticks()
        self.p0, self.w0 = process_ticks(), time.monotonic()
        self.done = threading.Event()
        self.sampler = threading.Thread(target=self.sample, daemon=True)
        self.sampler.start()
        return self

    def sample(self):
        while not self.done.wait(0.5):
            self.compilers = max(self.compilers, busy_compilers())

    def __exit__(self, *exc):
        self.done.set()
        self.sampler.join(2)
        cores = foreign_cpu(self.p0, process_ticks(), time.monotonic() - self.w0)
        t1 = cpu_ticks()
        self.busy = describe_busy(max(self.compilers, busy_compilers()), cores, steal_share(self.t0, t1))
        Meter.last_clean = not self.busy
        c1 = self.lab.counters()
        k = 0 if self.direction == "read" else 1
        self.wire = [c1[p["client_iface"]][k] - self.c0[p["client_iface"]][k] for p in self.lab.paths]
        total, idle = t1[0] - self.t0[0], t1[1] - self.t0[1]
        self.cpu = 100.0 * (total - idle) / total if total else None
        # Kept even under STEAL_MAX: at queue depth 1, 2% steal already
        # costs braid about 2% of its throughput on 2 x 1gbit.
        self.steal = 100.0 * steal_share(self.t0, t1)
        return False

    def annotate(self, row):
        total = sum(self.wire)
        row["wire_bytes"] = self.wire
        row["wire_share"] = [w / total for w in self.wire] if total > 0 else None
        row["cpu_pct"] = self.cpu
        row["steal_pct"] = self.steal
        if self.busy:
            row.setdefault("notes", []).append(f"machine not idle: {self.busy}")


# ------------------------------------------------------------- measurements

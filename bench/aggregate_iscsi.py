"""bench/aggregate's iSCSI step: braid's initiator over Debian's tgt.

tgt runs in the lab's storage namespace with a portal on every path's
address and one LUN on a file in /dev/shm (so the disk is not what is
measured). Its SendTargets names only the portal asked, so braid is given
each portal with --portal, as a user of such a target would. Measured:
braid bench (adaptive) 1 MiB sequential write and read at QD1 and QD16,
and libiscsi over path 1 alone as the single-path peer (iscsi-perf for
reads, bench/iscsi-write.c for writes, both QD16 of 1 MiB).

Only glue, called from bench/aggregate with that script's helpers (`ctx`).
"""

import os
import re
import time

IQN = "iqn.2026-11.org.example:aggregate"
PORT = 3260
WORKLOADS = [
    ("seq write 1M QD1", "write", 1, "write"),
    ("seq write 1M QD16", "write", 16, "write"),
    ("seq read 1M QD1", "read", 1, "read"),
    ("seq read 1M QD16", "read", 16, "read"),
]
TOOL = "braid adaptive over tgt (iSCSI)"
PEER_READ = "libiscsi iscsi-perf over tgt, path 1"
PEER_WRITE = "libiscsi write (bench/iscsi-write.c) over tgt, path 1"


def write_client(ctx):
    """bench/iscsi-write.c built once per run (needs gcc and libiscsi-dev)."""
    exe = os.path.join(ctx.WORK, "iscsi-write")
    src = os.path.join(ctx.HERE, "iscsi-write.c")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        os.makedirs(ctx.WORK, exist_ok=True)
        ctx.run(["gcc", "-O2", "-Wall", "-Werror", "-o", exe, src, "-liscsi"], timeout=120)
    return exe


class Tgt:
    """tgtd in the storage namespace, stopped as it must be (targets
    offline and deleted, then the system), then by PID."""

    def __init__(self, ctx, sc, lun_file):
        self.ctx, self.sc = ctx, sc
        self.control = str(20000 + os.getpid() % 10000)
        portals = [p["storage_addr"] for p in sc.paths]
        self.proc = ctx.PROCS.spawn(
            sc.lab.s("tgtd", "-f", "-C", self.control, "--iscsi", f"portal={portals[0]}:{PORT}"),
            sc.rawfile("tgtd.log"))
        deadline = time.monotonic() + 10
        while ctx.run(self.adm("--op", "show", "--mode", "system"), timeout=5, check=False)[0] != 0:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise ctx.Failed("tgtd did not start")
            time.sleep(0.1)
        for a in portals[1:]:
            ctx.run(self.adm("--lld", "iscsi", "--op", "new", "--mode", "portal",
                             "--param", f"portal={a}:{PORT}"), timeout=10)
        iscsi = ("--lld", "iscsi")
        ctx.run(self.adm(*iscsi, "--op", "new", "--mode", "target", "--tid", "1", "-T", IQN), timeout=10)
        ctx.run(self.adm(*iscsi, "--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", "1",
                         "-b", lun_file), timeout=10)
        ctx.run(self.adm(*iscsi, "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL"),
                timeout=10)

    def adm(self, *args):
        return self.sc.lab.s("tgtadm", "-C", self.control, *args)

    def stop(self):
        run = self.ctx.run
        run(self.adm("--op", "update", "--mode", "target", "--tid", "1", "-n", "state", "-v", "offline"),
            timeout=10, check=False)
        run(self.adm("--lld", "iscsi", "--op", "delete", "--mode", "target", "--tid", "1", "--force"),
            timeout=10, check=False)
        run(self.adm("--op", "delete", "--mode", "system"), timeout=10, check=False)
        self.ctx.PROCS.stop(self.proc, grace=5.0)


def step(ctx, sc):
    """Measures every iSCSI row of scenario `sc` (a bench/aggregate Scenario)."""
    lab, o = sc.lab, sc.opts
    span = o.span * ctx.MIB
    lun = os.path.join(sc.tmp, "tgt-lun.img")
    with open(lun, "wb") as f:
        f.truncate(span)
    writer = write_client(ctx)
    tgt = Tgt(ctx, sc, lun)
    try:
        portal_args = [a for p in sc.paths for a in ("--portal", f"{p['storage_addr']}:{PORT}")]
        uri = f"iscsi://{sc.paths[0]['storage_addr']}:{PORT}/{IQN}/1"
        # Reads must read data: fill the LUN once.
        src = sc.random_file(span)
        ctx.run(lab.c(ctx.BRAID, "copy", "--no-progress", "-q", *portal_args, *sc.braid_local_args(), src, uri),
                timeout=span / 5e6 + 60)
        secs = o.time_adaptive
        for name, rw, qd, direction in WORKLOADS:
            sc.measure(TOOL, name, direction,
                       lambda: bench(ctx, sc, uri, portal_args, rw, qd, secs, name),
                       kind="iscsi", policy="adaptive", qd=qd)
        sc.measure(PEER_READ, "seq read 1M QD16", "read",
                   lambda: perf_read(ctx, sc, uri, secs), kind="iscsi-peer", qd=16)
        sc.measure(PEER_WRITE, "seq write 1M QD16", "write",
                   lambda: lib_write(ctx, sc, writer, uri, secs), kind="iscsi-peer", qd=16)
    finally:
        tgt.stop()
        os.remove(lun)


def bench(ctx, sc, uri, portal_args, rw, qd, secs, name):
    argv = sc.lab.c(ctx.BRAID, "bench", uri, *portal_args, "--rw", rw, "--bs", "1M", "--iodepth", str(qd),
                    "--time", str(secs), "--policy", "adaptive", "--json", "-q", *sc.braid_local_args())
    rc, out, err = ctx.run(argv, timeout=secs + 60, check=False)
    return ctx.bench_figures(rc, out, err, len(sc.paths), sc.rawfile(f"iscsi-braid-{name}.json"))


def perf_read(ctx, sc, uri, secs):
    """iscsi-perf: 1 MiB (2048 blocks of 512 bytes) reads, 16 in flight."""
    argv = sc.lab.c("timeout", str(int(secs) + 30), "iscsi-perf", "-b", "2048", "-m", "16", "-t", str(int(secs)),
                    uri)
    rc, out, err = ctx.run(argv, timeout=secs + 40, check=False)
    text = (out + err).replace("\r", "\n")
    with open(sc.rawfile("iscsi-perf.txt"), "w") as f:
        f.write(text)
    for line in reversed(text.splitlines()):
        # The summary, "iops average N (X MB/s)": each op 1 MiB.
        m = re.match(r"\s*iops average (\d+)", line)
        if m:
            iops = float(m.group(1))
            return {"mb_s": iops * ctx.MIB / 1e6, "iops": iops}
    raise ctx.Failed(f"iscsi-perf exit {rc}: {ctx.last_line(text)}")


def lib_write(ctx, sc, writer, uri, secs):
    """bench/iscsi-write.c: sequential 1 MiB WRITEs, 16 in flight."""
    argv = sc.lab.c(writer, uri, str(int(secs)), str(ctx.MIB), "16", "seq")
    rc, out, err = ctx.run(argv, timeout=secs + 40, check=False)
    with open(sc.rawfile("iscsi-write.txt"), "w") as f:
        f.write(out + err)
    try:
        ops, moved, took = out.split()[:3]
        return {"mb_s": float(moved) / float(took) / 1e6, "iops": float(ops) / float(took)}
    except ValueError:
        raise ctx.Failed(f"iscsi-write exit {rc}: {ctx.last_line(err or out)}")

"""bench/aggregate's attach step: the volume as a kernel, qemu or fio sees it.

`braid attach` runs in the client namespace over every path, given the same
URI (and, in flux, the same --local devices) as `braid bench` there, and
serves the volume on a Unix socket in the scenario's temporary directory.
Through that socket, while the step's `braid serve` still runs:

  - fio (ioengine=nbd): 1 MiB sequential write and read at QD16, the figure
    `braid bench` is compared at, and 4 KiB random read at QD32, each for
    as long as `braid bench`'s adaptive runs;
  - nbdcopy (its defaults): the whole volume written from a file of random
    bytes; read to `null:` (`--no-extents`), the shape of the peers' nbdcopy
    rows; then read again into a file and compared with the source byte for
    byte, a row of its own. The two reads differ by what nbdcopy pays to
    write a new 512 MiB tmpfs file, not by what attach does: on the 4 x
    1gbit lab, the first read into a new file cost nbdcopy 1.2-1.9 s of
    system time and took 1.37-1.71 s, where the read to `null:` cost it
    0.15-0.18 s and took 1.15 s (0.98 of the limit), in every round.

Every row carries the CPU seconds per GiB moved of `braid attach` and
`braid serve` (read from /proc by PID) and of the tool itself. `braid
attach` is stopped by PID (SIGTERM: it detaches, flushing first).

Only glue, called from bench/aggregate with that script's helpers (`ctx`).
"""

import json
import os
import re
import time

FIO = "braid attach + fio"
COPY = "braid attach + nbdcopy"
VERIFIED_READ = "seq read into a file (nbdcopy, verified)"
# (name, --rw, --bs, --iodepth, direction): writes first, so that reads
# read what fio wrote.
FIO_WORKLOADS = [
    ("seq write 1M QD16", "write", "1M", 16, "write"),
    ("seq read 1M QD16", "read", "1M", 16, "read"),
    ("randread 4K QD32", "randread", "4k", 32, "read"),
]
EXPORT = "vol"


class Attach:
    """`braid attach` in the client namespace, its socket and control
    socket in `tmp`, up once its log says it serves over every path."""

    def __init__(self, ctx, sc, tmp):
        self.ctx, self.sc = ctx, sc
        self.socket = os.path.join(tmp, "attach.sock")
        self.log = sc.rawfile("braid-attach.log")
        self.proc = ctx.PROCS.spawn(
            sc.lab.c(ctx.BRAID, "attach", sc.braid_uri(), "--name", EXPORT, "--socket", self.socket,
                     "--control", os.path.join(tmp, "attach.ctl"), *sc.braid_local_args()),
            self.log)
        self.paths = self.wait_attached(timeout=30.0)

    def wait_attached(self, timeout):
        """Paths it attached over, read from its `attached "vol": ... over N
        paths` line (bounded wait)."""
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log, errors="replace") as f:
                text = self.ctx.strip_ansi(f.read())
            m = re.search(r'attached "[^"]*": .* over (\d+) paths', text)
            if m and os.path.exists(self.socket):
                return int(m.group(1))
            if self.proc.poll() is not None:
                raise self.ctx.Failed(f"braid attach exited with {self.proc.returncode}: "
                                      f"{self.ctx.last_line(text)}")
            if time.monotonic() > deadline:
                self.stop()
                raise self.ctx.Failed(f"braid attach did not serve {self.socket} in {timeout:.0f} s: "
                                      f"{self.ctx.last_line(text)}")
            time.sleep(0.05)

    @property
    def uri(self):
        return f"nbd+unix:///{EXPORT}?socket={self.socket}"

    def alive(self):
        if self.proc.poll() is not None:
            raise self.ctx.Failed(f"braid attach exited with {self.proc.returncode}")

    def stop(self):
        self.ctx.PROCS.stop(self.proc, grace=10.0)


def step(ctx, sc, serve_pid):
    """Measures every attach row of scenario `sc` (a bench/aggregate
    Scenario) against the `braid serve` whose PID is `serve_pid`."""
    o = sc.opts
    span = o.span * ctx.MIB
    att = Attach(ctx, sc, sc.tmp)
    try:
        notes = [] if att.paths == len(sc.paths) else [f"attach used {att.paths} paths of {len(sc.paths)}"]
        pids = {"attach": att.proc.pid, "serve": serve_pid}
        for name, rw, bs, qd, direction in FIO_WORKLOADS:
            att.alive()
            sc.measure(FIO, name, direction,
                       lambda: ctx.aggregate_host.with_cpu(
                           lambda: fio(ctx, sc, att.uri, rw, bs, qd, o.time_adaptive, span, name), pids, "fio"),
                       kind="attach", qd=qd, notes=list(notes))
        src = unique_file(sc.tmp, span)
        back = os.path.join(sc.tmp, "attach-readback.img")
        note = notes + [f"{o.span} MiB, the whole volume, nbdcopy defaults"]
        att.alive()
        sc.measure(COPY, "seq write (nbdcopy)", "write",
                   lambda: ctx.aggregate_host.with_cpu(
                       lambda: sc.nbdcopy(src, att.uri, span, False, "attach-nbdcopy-write.txt"), pids,
                       "nbdcopy"),
                   kind="attach", notes=list(note))
        att.alive()
        sc.measure(COPY, "seq read (nbdcopy)", "read",
                   lambda: ctx.aggregate_host.with_cpu(
                       lambda: sc.nbdcopy(att.uri, "null:", span, False, "attach-nbdcopy-read.txt"), pids,
                       "nbdcopy"),
                   kind="attach", notes=note + ["to null:, as the peers' rows"])
        att.alive()
        sc.measure(COPY, VERIFIED_READ, "read",
                   lambda: verified(src, back, ctx.aggregate_host.with_cpu(
                       lambda: sc.nbdcopy(att.uri, back, span, False, "attach-nbdcopy-read-verified.txt"),
                       pids, "nbdcopy"), ctx),
                   kind="attach", notes=note + ["into a new file on tmpfs"])
    finally:
        att.stop()
        for f in ("attach-readback.img", f"attach-unique-{span}.img"):
            try:
                os.remove(os.path.join(sc.tmp, f))
            except FileNotFoundError:
                pass


def fio(ctx, sc, uri, rw, bs, qd, secs, size, name):
    out = sc.rawfile(f"attach-fio-{name}.json")
    argv = sc.lab.c("fio", f"--name={rw}", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
                    f"--iodepth={qd}", f"--runtime={secs}", "--time_based", f"--size={size}",
                    "--output-format=json", f"--output={out}")
    ctx.run(argv, timeout=secs + 30)
    with open(out) as f:
        j = json.load(f)
    job = j["jobs"][0]
    if job.get("error"):
        raise ctx.Failed(f"fio error {job['error']}")
    r = job["write" if rw == "write" else "read"]
    return {"mb_s": r["bw_bytes"] / 1e6, "iops": r["iops"], "bytes": r["io_bytes"],
            "lat_us": {"p50": ctx.pct(r, "50.000000"), "p99": ctx.pct(r, "99.000000")}}


def unique_file(tmp, size):
    """`size` bytes of random data with no block repeated anywhere (unlike
    Scenario.random_file's 64 MiB repeated), so that a block read back from
    the wrong place cannot compare equal."""
    path = os.path.join(tmp, f"attach-unique-{size}.img")
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(left, 16 << 20)
            f.write(os.urandom(n))
            left -= n
    return path


def verified(want, got, figures, ctx):
    """The figures of a read into `got`, once it equals `want` byte for
    byte; Failed (with the first offset that differs) otherwise."""
    chunk = 8 << 20
    with open(want, "rb") as a, open(got, "rb") as b:
        offset = 0
        while True:
            x, y = a.read(chunk), b.read(chunk)
            if x != y:
                at = offset + next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
                raise ctx.Failed(f"read back differs from what was written at byte {at}")
            if not x:
                break
            offset += len(x)
    figures.setdefault("notes", []).append(f"read back equal to what was written ({offset >> 20} MiB)")
    return figures

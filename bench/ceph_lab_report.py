"""bench/ceph-lab's results file, from the rows the run collected.

  ceph_lab_report.py ROWS OUT COMMAND DESCRIBE CPUS RATE VERSIONS KILL_AT RUN LOAD0 LOAD

LOAD0 and LOAD are /proc/loadavg at the start and at the end.

ROWS holds one line a measurement: `WHO CASE FIGURES...` (MB/s, IOPS,
paths used, MB/s by path), `iperf3-N read|write MB/s`, or `kill LABEL JSON`.
"""

import datetime
import json
import sys

rows, out, command, describe, cpus, rate, versions, kill_at, run, load0, load = sys.argv[1:12]
r = {}
for line in open(rows):
    f = line.split(None, 2)
    if f[0] == "kill":
        r[("kill", f[1])] = json.loads(f[2])
    else:
        r[(f[0], f[1])] = line.split()[2:]

names = ["read-4M-seq", "write-4M-seq", "read-4K-rand", "write-4K-rand"]
clients = [
    ("braid-1", "braid over NBD, 1 gateway", "iperf3-1"),
    ("braid-2", "braid over NBD, 2 gateways (one URI)", "iperf3-2"),
    ("libiscsi-2", "libiscsi, a session to each of 2 gateways (two processes, summed)", "iperf3-2"),
    ("braid-iscsi-2", "braid's iSCSI initiator, 2 gateways (both portals)", "iperf3-2"),
]


def mb(who, n):
    v = r.get((who, n))
    return float(v[0]) if v else None


L = ["# braid gateways on Ceph RBD, a link to each", "",
     f"Written by `{command}` at braid {describe}, "
     f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}, on a {cpus}-CPU machine "
     f"shared with other work (load average {load0.split()[0]} at the start, "
     f"{load.split()[0]} at the end); "
     f"{versions.strip().rstrip(',')} (Debian). `braid-lab` with two paths at {rate} (tbf over "
     "GSO, the lab's reference shaping). In the storage namespace: `scripts/ceph-cluster` (one "
     "monitor, one OSD in memory, pool `rbd` with one copy), one image without exclusive-lock "
     "written end to end first, and a `braid serve --iscsi` gateway per path listening only on "
     "its path's address (librbd cache off, so every write is acknowledged once the cluster "
     "has it). In the client namespace: `braid bench` over NBD with one URI naming gateway 1, "
     "which finds gateway 2 from the image's gateway records; libiscsi with a session to each "
     "gateway, two processes at once with half the queue depth each, their figures summed (reads "
     "`iscsi-perf`, writes `bench/iscsi-write.c`, as `iscsi-perf` only reads); `braid bench` "
     "over iSCSI with an `iscsi://` URI and `--portal` for each gateway. QD 16 for 4 MiB, 32 for "
     "4 KiB in all. With two gateways the three clients ran case by case, one after another, "
     "in the same minutes.", "",
     "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
L.append("| librbd directly, no link (rbd bench in the storage namespace) | " + " | ".join(
    f"{r[('librbd', n)][0]} MB/s" if ("librbd", n) in r else "-" for n in names) + " |")
for who, label, _ in clients:
    cells = []
    for n in names:
        v = r.get((who, n))
        cells.append(f"{v[0]} MB/s ({v[1]} IOPS), by path {v[3]}" if v else "-")
    L.append(f"| {label} | " + " | ".join(cells) + " |")

L += ["", "Against iperf3 on the same paths (path 1 alone for one gateway, both paths at "
      "once for two; reads against iperf3 storage-to-client):", "",
      "| | iperf3 read MB/s | iperf3 write MB/s | read-4M-seq | write-4M-seq |",
      "|---|---|---|---|---|"]
for who, label, limit in clients:
    lr, lw = float(r[(limit, "read")][0]), float(r[(limit, "write")][0])
    rd, wr = mb(who, "read-4M-seq"), mb(who, "write-4M-seq")
    ratio = lambda x, lim: "-" if x is None else f"{x / lim:.2f}"
    L.append(f"| {label} | {lr} | {lw} | {ratio(rd, lr)} | {ratio(wr, lw)} |")

two, one = mb("braid-2", "read-4M-seq"), mb("braid-1", "read-4M-seq")
L += ["", f"The second gateway, on a link of its own, takes 4 MiB reads over NBD from {one} to "
      f"{two} MB/s ({two / one:.2f}x). The 4 KiB rows are bound by the cluster and the 2 CPUs "
      "everything here shares (monitor, OSD, both gateways, the clients), not by the links; see "
      "bench/results/ceph.md for the same on loopback.", ""]

L += ["## Gateway 2 killed mid-run", "",
      f"A verified write-then-read load (8 writers of 256 KiB blocks over 64 MiB of a second "
      f"image, each block read back after its write is acknowledged; the failover example "
      f"`crates/braid/examples/gateway_kill`) over both gateways for {run} s; gateway 2 SIGKILLed "
      f"{kill_at} s in and left dead. Afterwards every block acknowledged last is read back "
      "through the volume (so through gateway 1) and compared in `rbd export` of the image. "
      "The gap is the longest time after the kill with no request completing; \"in flight\" "
      "is how long the requests outstanding at the kill took to complete elsewhere: those sent "
      "through gateway 2 wait for its fence, as they must (gateway 1 asks gateway 2, whose lease "
      "is still live, 5 s to answer, over NBD to drop them, over iSCSI to act on the PREEMPT AND "
      "ABORT: `ASK_TIMEOUT` in crates/gateway/src/fence.rs and reservations.rs; then it "
      "blocklists it), while the rest go on through gateway 1. MB/s counts the writes "
      "and the reads back. Over iSCSI "
      "with `--persistent-reservations`: the fence of a dead gateway's path is then a PREEMPT "
      "AND ABORT through the live one (without it braid fences by logging in again through the "
      "dead gateway's portal group, which never answers, and the path's writes wait out the "
      "no-path timeout, 60 s, and fail: `tests/ceph_iscsi_failover.rs`).", "",
      "| client | paths at start | MB/s over the run | longest gap before the kill (ms) | "
      "longest gap after the kill (ms) | "
      "requests in flight at the kill, done after (ms) | I/O errors | read back wrong | "
      "blocks acknowledged | lost through gateway 1 | lost in `rbd export` |",
      "|---|---|---|---|---|---|---|---|---|---|---|"]
for label, who in (("nbd", "braid over NBD (one URI)"),
                   ("iscsi", "braid's iSCSI initiator (both portals, --persistent-reservations)")):
    k = r.get(("kill", label))
    if not k:
        continue
    assert k["killed"], f"gateway 2 was not killed under {label}: the row would show no failover"
    assert k["paths_at_start"] >= 2, f"{label} had no path to gateway 2 to lose: {k}"
    lost = f"{k['lost_blocks']} blocks ({k['lost_bytes']} bytes)"
    L.append(f"| {who} | {k['paths_at_start']} | {k['mb_per_s']:.1f} | {k['longest_gap_before_ms']} | "
             f"{k['longest_gap_ms']} | "
             f"{k['in_flight_done_ms']} | {k['errors']} | {k['mismatches']} | "
             f"{k['acked_blocks']} | {k['bad_through_volume']} | {lost} |")
L.append("")
open(out, "w").write("\n".join(L))
print(f"== wrote {out}")

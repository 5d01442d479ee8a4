"""Renders bench/aggregate's results (a dict, also kept as results.json) as
markdown and one hand-written SVG chart per scenario. No measuring here and
no third-party libraries: `bench/aggregate --render results.json` re-renders
an earlier run."""

import html
import os

# The targets (benchmark figures, not test thresholds).
TARGET_RATIO = 0.97
TARGET_IOPS = 1.2
# Issue 37: through `braid attach`, the fraction `braid bench` reaches.
TARGET_ATTACH = 0.99


def write(results, out_dir, name="aggregate"):
    """Writes NAME-DAY.md, NAME.md and their SVGs; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    day = results["day"]
    written = []
    for stem in (f"{name}-{day}", name):
        for sc in results["scenarios"]:
            path = os.path.join(out_dir, f"{stem}-{sc['key']}.svg")
            with open(path, "w") as f:
                f.write(chart(sc))
            written.append(path)
        path = os.path.join(out_dir, f"{stem}.md")
        with open(path, "w") as f:
            f.write(markdown(results, stem))
        written.append(path)
    return written


# ------------------------------------------------------------------ lookup


def find(sc, tool, workload):
    for r in sc["rows"]:
        if r["tool"] == tool and r["workload"] == workload:
            return r
    return None


def limit(sc, direction):
    return (sc.get("limits", {}).get(direction) or {}).get("all")


def ratio(sc, row):
    lim = limit(sc, row["direction"]) if row else None
    if not row or row.get("error") or not lim or row.get("mb_s") is None:
        return None
    return row["mb_s"] / lim


def fio_one_path(sc):
    r = find(sc, "nbdkit + fio, path 1", "randread 4K QD32")
    return r.get("iops") if r and not r.get("error") else None


def mptcp_row(sc, direction):
    return find(sc, "MPTCP nbdkit + nbdcopy, all paths", f"seq {direction} (nbdcopy)")


# ---------------------------------------------------------------- markdown


def fmt(v, digits=1):
    return "-" if v is None else f"{v:,.{digits}f}"


def share(s):
    return "-" if not s else " / ".join(f"{100 * x:.0f}%" for x in s)


def cell(row, key, digits=1):
    if row is None:
        return "not run"
    if row.get("error"):
        return "failed"
    return fmt(row.get(key), digits)


def esc(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(res, stem):
    v = res["versions"]
    o = res["options"]
    out = [f"# Aggregation over the lab: braid vs the limit and its peers ({res['day']})", ""]
    mins = (res.get("total_seconds") or 0) / 60
    build = res.get("build_seconds")
    out += [
        f"Measured {res['date']} by `{res['command'].strip()}` in {mins:.1f} min"
        + (f" (release build {build:.0f} s included)" if build else " (no build)") + ".",
        f"Raw output: `{res['raw']}/` (not committed).",
        "",
        "| | |", "|---|---|",
    ]
    for k in ("braid", "kernel", "cpu", "nbdkit", "libnbd", "nbdcopy", "fio", "iperf3", "qemu", "mptcpize",
              "rustc", "host congestion control"):
        out.append(f"| {k} | {esc(v.get(k, '?'))} |")
    out += [
        "",
        "How to read this. MB/s are 10^6 bytes/s of payload. Each figure's *ratio* is to the iperf3 "
        "all-paths limit of the same run in the same direction (reads: storage to client; writes: client "
        "to storage). iperf3 runs one cubic stream per path. nbdkit serves its `memory` plugin, written by "
        "nbdcopy before it is read back, so every read moves real (random) data; braid serves `mem:` and "
        f"its {o['span']} MiB span is filled with random data (`braid copy`) before the first run, then "
        "rewritten by every write run, so braid also reads written data. nbdcopy runs with its defaults "
        "(4 connections, 64 requests of 256 KiB each). MPTCP: the storage namespace announces its other "
        "addresses (`ip mptcp endpoint ... signal`), the client accepts them (`ip mptcp limits`), and "
        "nbdkit, nbdcopy and fio run under `mptcpize run`; the subflows seen are noted. "
        "*Path shares*: braid's own per-path byte counts, then (wire) the bytes each client veth "
        "carried in the workload's direction. *CPU* is the whole machine's busy share during the run, "
        "including the time the hypervisor took from it (steal, shown when 1% or more). "
        f"Runs last {o['time_adaptive']} s for adaptive and {o['time_other']} s for other policies; "
        f"iperf3 {o['iperf_alone']} s per path alone and {o['iperf_all']} s for all paths.",
        "",
    ]
    out += summary(res)
    out += iscsi_summary(res)
    out += attach_summary(res)
    notes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "aggregate-notes.md")
    if os.path.exists(notes):
        with open(notes) as f:
            out += [f.read().rstrip(), ""]
    for sc in res["scenarios"]:
        out += scenario_md(sc, stem)
    return "\n".join(out) + "\n"


def summary(res):
    """One line per scenario: ratios to the limit, read / write."""
    out = ["## Summary", "",
           "Ratios to the iperf3 all-paths limit, read / write; sequential runs are 1 MiB "
           "(nbdcopy: its defaults); randread is 4 KiB QD32 IOPS as a multiple of fio over one path. "
           "*Bare QD1* is `bench/qd1floor.c`: two bare programs moving 1 MiB at a time over all paths, "
           "split by the paths' iperf3 rates (a write as 64 KiB requests, as braid sends one), with "
           "nothing but TCP in the way: what queue depth 1 reaches on these links and CPUs.", "",
           "| scenario | limit MB/s | nbdcopy 1 path | MPTCP nbdcopy | adaptive QD1 | bare QD1 | adaptive QD16 "
           "| round-robin QD16 | best policy QD16 (read) | randread: adaptive / round-robin / MPTCP |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for sc in res["scenarios"]:
        def rw(tool, r, w):
            a, b = ratio(sc, find(sc, tool, r)), ratio(sc, find(sc, tool, w))
            return f"{fmt(a, 2)} / {fmt(b, 2)}"
        fio1 = fio_one_path(sc)

        def x(tool):
            row = find(sc, tool, "randread 4K QD32")
            ok = row and not row.get("error") and fio1
            return fmt(row["iops"] / fio1, 2) if ok else "-"
        best, best_v = "-", None
        for r in sc["rows"]:
            if r.get("kind") == "braid" and r["workload"] == "seq read 1M QD16" and not r.get("error"):
                if best_v is None or r["mb_s"] > best_v:
                    best, best_v = r["policy"], r["mb_s"]
        best_cell = f"{best} {fmt(ratio(sc, find(sc, 'braid ' + best, 'seq read 1M QD16')), 2)}" \
            if best_v is not None else "-"
        multi = len(sc.get("paths") or []) > 1
        out.append(
            f"| ({sc['key']}) {sc['title']} | {fmt(limit(sc, 'read'))} / {fmt(limit(sc, 'write'))} | "
            f"{rw('nbdkit + nbdcopy, path 1', 'seq read (nbdcopy)', 'seq write (nbdcopy)')} | "
            + (f"{rw('MPTCP nbdkit + nbdcopy, all paths', 'seq read (nbdcopy)', 'seq write (nbdcopy)')} | "
               if multi else "- | ")
            + f"{rw('braid adaptive', 'seq read 1M QD1', 'seq write 1M QD1')} | "
            + (f"{rw(FLOOR, 'seq read 1M QD1', 'seq write 1M QD1')} | " if multi else "- | ")
            + f"{rw('braid adaptive', 'seq read 1M QD16', 'seq write 1M QD16')} | "
            f"{rw('braid round-robin', 'seq read 1M QD16', 'seq write 1M QD16')} | {best_cell} | "
            f"{x('braid adaptive')} / {x('braid round-robin')} / {x('MPTCP nbdkit + fio, all paths')} |")
    return out + [""]


ISCSI = "braid adaptive over tgt (iSCSI)"
ATTACH_FIO = "braid attach + fio"
ATTACH_COPY = "braid attach + nbdcopy"
FLOOR = "bare program (bench/qd1floor.c), all paths"
ISCSI_PEER_READ = "libiscsi iscsi-perf over tgt, path 1"
ISCSI_PEER_WRITE = "libiscsi write (bench/iscsi-write.c) over tgt, path 1"


def has_rows(res, kind):
    return any(r.get("kind") == kind for sc in res["scenarios"] for r in sc["rows"])


def section(title, text, columns):
    """A summary's heading, its paragraph and its table's header."""
    return [f"## {title}", "", text, "", "| " + " | ".join(columns) + " |",
            "|" + "---|" * len(columns)]


def ratios(sc, tool_r, tool_w, r, w):
    """Ratios to the limit of a read row and a write row, "r / w"."""
    return f"{fmt(ratio(sc, find(sc, tool_r, r)), 2)} / {fmt(ratio(sc, find(sc, tool_w, w)), 2)}"


def iscsi_summary(res):
    """The iSCSI rows: braid's initiator over tgt, against the same limit
    and against libiscsi over one path."""
    if not has_rows(res, "iscsi"):
        return []
    out = section(
        "Summary over iSCSI (tgt)",
        "braid's initiator over Debian's tgt (a portal on every path, named with `--portal`; the LUN on "
        "a file in /dev/shm), 1 MiB sequential, as ratios to the same iperf3 all-paths limit, read / "
        "write; the peer is libiscsi over path 1 alone at QD16 (`iscsi-perf` reads, "
        "`bench/iscsi-write.c` writes); *x peer* is braid QD16 over it.",
        ["scenario", "limit MB/s", "libiscsi 1 path", "braid QD1", "braid QD16", "x peer (read / write)"])
    for sc in res["scenarios"]:
        def rw(tool_r, tool_w, r, w):
            return ratios(sc, tool_r, tool_w, r, w)

        def x(d, peer):
            a, b = find(sc, ISCSI, f"seq {d} 1M QD16"), find(sc, peer, f"seq {d} 1M QD16")
            ok = a and b and not a.get("error") and not b.get("error") and b.get("mb_s")
            return fmt(a["mb_s"] / b["mb_s"], 2) if ok else "-"
        out.append(
            f"| ({sc['key']}) {sc['title']} | {fmt(limit(sc, 'read'))} / {fmt(limit(sc, 'write'))} | "
            f"{rw(ISCSI_PEER_READ, ISCSI_PEER_WRITE, 'seq read 1M QD16', 'seq write 1M QD16')} | "
            f"{rw(ISCSI, ISCSI, 'seq read 1M QD1', 'seq write 1M QD1')} | "
            f"{rw(ISCSI, ISCSI, 'seq read 1M QD16', 'seq write 1M QD16')} | "
            f"{x('read', ISCSI_PEER_READ)} / {x('write', ISCSI_PEER_WRITE)} |")
    return out + [""]


def cpu_gib(row, *names):
    """CPU seconds per GiB of the named processes, "a / b"."""
    c = (row or {}).get("cpu_s_gib") or {}
    return " / ".join(fmt(c.get(n), 2) for n in names)


def attach_summary(res):
    """The volume as a kernel or qemu sees it: through `braid attach`'s
    socket, beside `braid bench` over the same paths in the same run."""
    if not has_rows(res, "attach"):
        return []
    out = section(
        "Summary through `braid attach`",
        "`braid attach` in the client namespace over every path (the URI `braid bench` is given), its local "
        "NBD socket driven by fio (`ioengine=nbd`) and by nbdcopy (the whole volume written from a file of "
        "random bytes, read to `null:` as the peers' rows are, then read again into a file and compared byte "
        "for byte), while the same `braid serve` runs. "
        "Ratios to the same iperf3 all-paths limit, read / write; `braid bench` is adaptive. CPU is seconds "
        "per GiB moved of each process, at 1 MiB QD16 read / write.",
        ["scenario", "limit MB/s", "braid bench QD16", "attach + fio QD16", "attach + nbdcopy",
         "randread 4K QD32 IOPS: attach / bench", "CPU s/GiB attach", "CPU s/GiB bench",
         "CPU s/GiB serve (attach; bench)"])
    for sc in res["scenarios"]:
        def rw(tool, r, w):
            return ratios(sc, tool, tool, r, w)

        def both(tool, name):
            return " / ".join(cpu_gib(find(sc, tool, f"seq {d} 1M QD16"), name) for d in ("read", "write"))
        ar, br = find(sc, ATTACH_FIO, "randread 4K QD32"), find(sc, "braid adaptive", "randread 4K QD32")
        out.append(
            f"| ({sc['key']}) {sc['title']} | {fmt(limit(sc, 'read'))} / {fmt(limit(sc, 'write'))} | "
            f"{rw('braid adaptive', 'seq read 1M QD16', 'seq write 1M QD16')} | "
            f"{rw(ATTACH_FIO, 'seq read 1M QD16', 'seq write 1M QD16')} | "
            f"{rw(ATTACH_COPY, 'seq read (nbdcopy)', 'seq write (nbdcopy)')} | "
            f"{cell(ar, 'iops', 0)} / {cell(br, 'iops', 0)} | {both(ATTACH_FIO, 'attach')} | "
            f"{both('braid adaptive', 'bench')} | {both(ATTACH_FIO, 'serve')}; "
            f"{both('braid adaptive', 'serve')} |")
    return out + [""]


def limit_caveat(sc):
    """Says so when the all-paths limit is well below what the links carry
    (on a small machine the CPU, not the links, then sets it)."""
    try:
        rates = [float(r[:-4]) * {"k": 1e3, "m": 1e6, "g": 1e9}[r[-4]]
                 for r in (x.strip().lower() for x in sc["rates"].split(","))]
    except (KeyError, ValueError, IndexError):
        return []
    nominal = 0.94 * sum(rates) / 8e6
    low, cpus = [], []
    for d in ("read", "write"):
        lim = limit(sc, d)
        if lim and lim < 0.9 * nominal:
            low.append(f"{d} {lim:.0f}")
            row = next((r for r in sc["rows"] if r.get("kind") == "limit" and r["direction"] == d
                        and r["workload"].startswith("all paths") and not r.get("error")), None)
            if row and row.get("cpu_pct") is not None:
                cpus.append(f"{row['cpu_pct']:.0f}%")
    if not low:
        return []
    cpu = f" with the CPU {'/'.join(cpus)} busy" if cpus else ""
    return [f"The all-paths limit ({', '.join(low)} MB/s) is well below the links' goodput "
            f"(~{nominal:.0f} MB/s){cpu}: on this machine the CPU, not the links, sets it, so ratios here "
            f"compare against what the machine can move (and a peer can exceed 1.00)."]


def cpu_note(row):
    c = row.get("cpu_s_gib")
    return ["CPU s/GiB " + ", ".join(f"{k} {v:.2f}" for k, v in c.items())] if c else []


def cpu(row):
    """The CPU column: busy share, and the steal within it when it shows."""
    text = f"{fmt(row.get('cpu_pct'), 0)}%"
    steal = row.get("steal_pct")
    if steal is not None and steal >= 1:
        text += f" ({steal:.0f}% steal)"
    return text


def scenario_md(sc, stem):
    key = sc["key"]
    out = [f"## ({key}) {sc['title']}", "",
           f"`braid-lab up --rates {sc['rates']} --addressing {sc['addressing']}`"
           + (f"; measured in {sc['seconds']:.0f} s" if sc.get("seconds") else "")
           + ("" if sc.get("idle_at_start", True) else "; **the machine was busy at the start**") + ".", ""]
    if sc["addressing"] == "flux":
        out += ["Every address in one /24 and the client keeps the distro's routes, so the kernel sends all "
                "traffic out of path 1's veth (ARP flux). braid serves with `--listen brsN` and benches with "
                "`--local brcN` (sockets bound to each veth); the iperf3 limit binds each stream to its "
                "veth the same way, and the *address-bound only* row shows what unbound sockets get.", ""]
    caveats = limit_caveat(sc)
    if caveats:
        out += ["**" + " ".join(caveats) + "**", ""]
    out += [f"![({key}) {sc['title']}]({stem}-{key}.svg)", ""]
    out += headline(sc)
    out += targets(sc)
    out += full_table(sc)
    if sc.get("problems"):
        out += ["Problems in this scenario:", ""] + [f"- {esc(p)}" for p in sc["problems"]] + [""]
    return out


def headline(sc):
    out = ["| | read MB/s | ratio | write MB/s | ratio | randread 4K QD32 IOPS | x fio 1 path |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    lr, lw = limit(sc, "read"), limit(sc, "write")
    out.append(f"| iperf3 limit, all paths | {fmt(lr)} | 1.00 | {fmt(lw)} | 1.00 | | |")
    per_r = (sc.get("limits", {}).get("read") or {}).get("per_path") or []
    per_w = (sc.get("limits", {}).get("write") or {}).get("per_path") or []
    if len(per_r) > 1:
        out.append(f"| iperf3, path 1 alone | {fmt(per_r[0])} | {fmt(per_r[0] / lr if per_r[0] and lr else None, 2)} "
                   f"| {fmt(per_w[0] if per_w else None)} | "
                   f"{fmt(per_w[0] / lw if per_w and per_w[0] and lw else None, 2)} | | |")
    fio1 = fio_one_path(sc)
    if find(sc, FLOOR, "seq read 1M QD1"):
        r, w = find(sc, FLOOR, "seq read 1M QD1"), find(sc, FLOOR, "seq write 1M QD1")
        out.append(f"| bare program, all paths, 1 MiB QD1 | {cell(r, 'mb_s')} | {fmt(ratio(sc, r), 2)} | "
                   f"{cell(w, 'mb_s')} | {fmt(ratio(sc, w), 2)} | | |")

    def line(label, rrow, wrow, iops_row, with_iops=True):
        iops = iops_row.get("iops") if iops_row and not iops_row.get("error") else None
        x = iops / fio1 if iops and fio1 else None
        tail = f"{cell(iops_row, 'iops', 0)} | {fmt(x, 2)}" if with_iops else " | "
        return (f"| {label} | {cell(rrow, 'mb_s')} | {fmt(ratio(sc, rrow), 2)} | {cell(wrow, 'mb_s')} | "
                f"{fmt(ratio(sc, wrow), 2)} | {tail} |")

    out.append(line("nbdkit + nbdcopy / fio, path 1", find(sc, "nbdkit + nbdcopy, path 1", "seq read (nbdcopy)"),
                    find(sc, "nbdkit + nbdcopy, path 1", "seq write (nbdcopy)"),
                    find(sc, "nbdkit + fio, path 1", "randread 4K QD32")))
    if len(sc.get("paths") or []) > 1:
        out.append(line("MPTCP nbdkit + nbdcopy / fio, all paths", mptcp_row(sc, "read"), mptcp_row(sc, "write"),
                        find(sc, "MPTCP nbdkit + fio, all paths", "randread 4K QD32")))
    for policy in ("adaptive", "round-robin"):
        tool = f"braid {policy}"
        rr = find(sc, tool, "randread 4K QD32")
        for qd in (16, 1):
            out.append(line(f"braid {policy}, 1 MiB QD{qd}", find(sc, tool, f"seq read 1M QD{qd}"),
                            find(sc, tool, f"seq write 1M QD{qd}"), rr, with_iops=qd == 16))
    if find(sc, ATTACH_FIO, "seq read 1M QD16"):
        out.append(line("braid attach + fio, 1 MiB QD16", find(sc, ATTACH_FIO, "seq read 1M QD16"),
                        find(sc, ATTACH_FIO, "seq write 1M QD16"), find(sc, ATTACH_FIO, "randread 4K QD32")))
        out.append(line("braid attach + nbdcopy (read to null:)", find(sc, ATTACH_COPY, "seq read (nbdcopy)"),
                        find(sc, ATTACH_COPY, "seq write (nbdcopy)"), None, with_iops=False))
        back = find(sc, ATTACH_COPY, "seq read into a file (nbdcopy, verified)")
        out.append(f"| braid attach + nbdcopy, read into a new file (verified) | {cell(back, 'mb_s')} | "
                   f"{fmt(ratio(sc, back), 2)} | | | | |")
    if find(sc, ISCSI, "seq read 1M QD16"):
        out.append(line("libiscsi over tgt, path 1, 1 MiB QD16", find(sc, ISCSI_PEER_READ, "seq read 1M QD16"),
                        find(sc, ISCSI_PEER_WRITE, "seq write 1M QD16"), None, with_iops=False))
        for qd in (16, 1):
            out.append(line(f"braid adaptive over tgt (iSCSI), 1 MiB QD{qd}", find(sc, ISCSI, f"seq read 1M QD{qd}"),
                            find(sc, ISCSI, f"seq write 1M QD{qd}"), None, with_iops=False))
    return out + [""]


def judged(x, target):
    """`x` as shown beside `target`, and the verdict: with more decimals
    where two would round a miss up to the target (0.965 against 0.97)."""
    digits = 2
    while x < target <= float(f"{x:.{digits}f}") and digits < 6:
        digits += 1
    verdict = "met" if x >= target else f"**missed by {target - x:.{digits}f}**"
    return f"{x:.{digits}f}", verdict


def targets(sc):
    """The issue's targets, each met or missed by how much."""
    lines = []
    for qd in (1, 16):
        for d in ("read", "write"):
            r = find(sc, "braid adaptive", f"seq {d} 1M QD{qd}")
            x = ratio(sc, r)
            bare = ratio(sc, find(sc, FLOOR, f"seq {d} 1M QD{qd}"))
            beside = f" (a bare program: {bare:.2f})" if bare is not None else ""
            if x is None:
                lines.append(f"- adaptive seq {d} QD{qd} >= {TARGET_RATIO} of the limit: **not measured**")
            else:
                shown, verdict = judged(x, TARGET_RATIO)
                lines.append(f"- adaptive seq {d} QD{qd} >= {TARGET_RATIO} of the limit: {shown}, "
                             f"{verdict}{beside}")
    if len(sc.get("paths") or []) > 1:
        for d in ("read", "write"):
            a = find(sc, "braid adaptive", f"seq {d} 1M QD16")
            m = mptcp_row(sc, d)
            if a and m and not a.get("error") and not m.get("error"):
                ahead = a["mb_s"] / m["mb_s"]
                verdict = "met" if ahead > 1 else "**missed**"
                lines.append(f"- braid adaptive ahead of MPTCP, seq {d} QD16: {a['mb_s']:.1f} vs "
                             f"{m['mb_s']:.1f} MB/s ({ahead:.2f}x), {verdict}")
        a = find(sc, "braid adaptive", "randread 4K QD32")
        fio1 = fio_one_path(sc)
        if a and not a.get("error") and fio1:
            x = a["iops"] / fio1
            shown, verdict = judged(x, TARGET_IOPS)
            lines.append(f"- randread 4K QD32 >= {TARGET_IOPS}x fio over one path: {shown}x, {verdict}")
    for d in ("read", "write"):
        x = ratio(sc, find(sc, ATTACH_FIO, f"seq {d} 1M QD16"))
        if x is not None:
            shown, verdict = judged(x, TARGET_ATTACH)
            bench = ratio(sc, find(sc, "braid adaptive", f"seq {d} 1M QD16"))
            beside = f" (braid bench: {bench:.2f})" if bench is not None else ""
            lines.append(f"- through braid attach (fio), seq {d} QD16 >= {TARGET_ATTACH} of the limit: {shown}, "
                         f"{verdict}{beside}")
    for qd in (1, 16):
        for d in ("read", "write"):
            x = ratio(sc, find(sc, ISCSI, f"seq {d} 1M QD{qd}"))
            if x is not None:
                shown, verdict = judged(x, TARGET_RATIO)
                lines.append(f"- over iSCSI (tgt), seq {d} QD{qd} >= {TARGET_RATIO} of the limit: {shown}, {verdict}")
    if sc["key"] == "b":
        rr = find(sc, "braid round-robin", "seq read 1M QD16")
        slow = (sc.get("limits", {}).get("read") or {}).get("per_path") or []
        if rr and not rr.get("error") and len(slow) > 1 and slow[1]:
            lines.append(f"- round-robin seq read QD16: {rr['mb_s']:.1f} MB/s, {rr['mb_s'] / slow[1]:.1f}x the "
                         f"slow path alone ({slow[1]:.1f} MB/s)")
    return (["Targets (issues 4, 19 and 37):", ""] + lines + [""]) if lines else []


def full_table(sc):
    multi = len(sc.get("paths") or []) > 1
    out = ["<details><summary>Every measurement</summary>", "",
           "| tool / policy | workload | MB/s | IOPS | ratio | p50 / p99 us | path shares (braid; wire) | CPU | notes |",
           "|---|---|---:|---:|---:|---:|---|---:|---|"]
    for r in sc["rows"]:
        if r.get("error"):
            out.append(f"| {esc(r['tool'])} | {esc(r['workload'])} | failed: {esc(r['error'])} | | | | | | |")
            continue
        lat = r.get("lat_us") or {}
        latency = f"{fmt(lat.get('p50'), 0)} / {fmt(lat.get('p99'), 0)}" if lat else ""
        shares = ""
        if multi:
            parts = []
            if r.get("share"):
                parts.append(share(r["share"]))
            parts.append("wire " + share(r.get("wire_share")))
            shares = "; ".join(parts)
        x = ratio(sc, r)
        iops = r.get("iops")
        out.append(f"| {esc(r['tool'])} | {esc(r['workload'])} | {fmt(r.get('mb_s'))} | "
                   f"{fmt(iops, 0) if iops else ''} | {fmt(x, 2) if x is not None else ''} | {latency} | "
                   f"{shares} | {cpu(r)} | {esc('; '.join(cpu_note(r) + (r.get('notes') or [])))} |")
    return out + ["", "</details>", ""]


# --------------------------------------------------------------------- SVG


READ, WRITE = "#3b6ea8", "#e08a2c"


def chart(sc):
    """Grouped bars, read and write MB/s: the limit, the peers, and braid's
    policies at 1 MiB QD16; dashed lines at the iperf3 all-paths limits."""
    groups = []
    lr, lw = limit(sc, "read"), limit(sc, "write")
    groups.append(("iperf3 limit", lr, lw))
    per_r = ((sc.get("limits", {}).get("read") or {}).get("per_path") or [None])[0]
    per_w = ((sc.get("limits", {}).get("write") or {}).get("per_path") or [None])[0]
    if len(sc.get("paths") or []) > 1:
        groups.append(("iperf3 path 1", per_r, per_w))

    def val(row):
        return None if not row or row.get("error") else row.get("mb_s")

    groups.append(("nbdcopy 1 path", val(find(sc, "nbdkit + nbdcopy, path 1", "seq read (nbdcopy)")),
                   val(find(sc, "nbdkit + nbdcopy, path 1", "seq write (nbdcopy)"))))
    if len(sc.get("paths") or []) > 1:
        groups.append(("MPTCP nbdcopy", val(mptcp_row(sc, "read")), val(mptcp_row(sc, "write"))))
    policies = []
    for r in sc["rows"]:
        if r.get("kind") == "braid" and r["policy"] not in policies:
            policies.append(r["policy"])
    for p in policies:
        groups.append((f"braid {p}", val(find(sc, f"braid {p}", "seq read 1M QD16")),
                       val(find(sc, f"braid {p}", "seq write 1M QD16"))))
    if find(sc, ATTACH_FIO, "seq read 1M QD16"):
        groups.append(("braid attach + fio", val(find(sc, ATTACH_FIO, "seq read 1M QD16")),
                       val(find(sc, ATTACH_FIO, "seq write 1M QD16"))))
    if find(sc, ISCSI, "seq read 1M QD16"):
        groups.append(("braid iSCSI", val(find(sc, ISCSI, "seq read 1M QD16")),
                       val(find(sc, ISCSI, "seq write 1M QD16"))))

    values = [v for _, a, b in groups for v in (a, b) if v]
    top = max(values + [1.0]) * 1.12
    step = nice_step(top)
    top = step * (int(top / step) + 1)
    gw, bw = 74, 28  # group width, bar width
    left, right, up, down = 64, 20, 70, 110
    width = max(640, left + right + gw * len(groups))
    gw = (width - left - right) / len(groups)
    height = 420
    ph = height - up - down

    def y(v):
        return up + ph - ph * v / top

    e = html.escape
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
         f'<rect width="{width}" height="{height}" fill="white"/>',
         f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">'
         f'({e(sc["key"])}) {e(sc["title"])}</text>',
         f'<text x="{width / 2}" y="36" text-anchor="middle">MB/s; nbdcopy with its defaults, braid at '
         f'1 MiB QD16 (through attach: fio); dashed lines: iperf3 all-paths limits</text>',
         f'<rect x="{left}" y="46" width="10" height="10" fill="{READ}"/>'
         f'<text x="{left + 14}" y="55">read (storage to client)</text>',
         f'<rect x="{left + 170}" y="46" width="10" height="10" fill="{WRITE}"/>'
         f'<text x="{left + 184}" y="55">write (client to storage)</text>']
    v = 0.0
    while v <= top + 1e-9:
        yy = y(v)
        s.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{width - right}" y2="{yy:.1f}" stroke="#ddd"/>')
        s.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{v:g}</text>')
        v += step
    s.append(f'<text x="14" y="{up + ph / 2}" transform="rotate(-90 14 {up + ph / 2})" '
             f'text-anchor="middle">MB/s (10^6 bytes/s)</text>')
    for i, (label, rv, wv) in enumerate(groups):
        x0 = left + gw * i + (gw - 2 * bw) / 2
        for k, (val_, colour) in enumerate(((rv, READ), (wv, WRITE))):
            x = x0 + k * bw
            if val_ is None:
                s.append(f'<text x="{x + bw / 2:.1f}" y="{up + ph - 4}" text-anchor="middle" font-size="9" '
                         f'transform="rotate(-90 {x + bw / 2:.1f} {up + ph - 4})" fill="#a00">n/a</text>')
                continue
            s.append(f'<rect x="{x:.1f}" y="{y(val_):.1f}" width="{bw - 2}" height="{up + ph - y(val_):.1f}" '
                     f'fill="{colour}"><title>{e(label)}: {val_:.1f} MB/s</title></rect>')
            s.append(f'<text x="{x + bw / 2 - 1:.1f}" y="{y(val_) - 3:.1f}" text-anchor="middle" '
                     f'font-size="9">{val_:.0f}</text>')
        cx = left + gw * i + gw / 2
        s.append(f'<text x="{cx:.1f}" y="{up + ph + 12}" text-anchor="end" '
                 f'transform="rotate(-35 {cx:.1f} {up + ph + 12})">{e(label)}</text>')
    for lim, colour, name in ((lr, READ, "read limit"), (lw, WRITE, "write limit")):
        if lim:
            s.append(f'<line x1="{left}" y1="{y(lim):.1f}" x2="{width - right}" y2="{y(lim):.1f}" '
                     f'stroke="{colour}" stroke-dasharray="6 4"><title>iperf3 {name}: {lim:.1f} MB/s'
                     f'</title></line>')
    s.append(f'<line x1="{left}" y1="{up + ph}" x2="{width - right}" y2="{up + ph}" stroke="black"/>')
    s.append("</svg>")
    return "\n".join(s) + "\n"


def nice_step(top):
    for step in (10, 20, 25, 50, 100, 200, 250, 500, 1000):
        if top / step <= 8:
            return step
    return 2000

"""A verified load through an NBD socket, shaped as real clients send it.

`load`: one connection per worker, each writing versioned blocks of its own
region in writes of the sizes given (128 KiB to 1 MiB as a kernel's
writeback or a hypervisor sends them), reading back one request in five and
checking it against what it had acknowledged, with or without FLUSH. It
runs until the stop file appears, then writes what was acknowledged as
JSON. `check`: reads a whole volume (an NBD URI, or a file) and compares
every block byte for byte with the last version acknowledged.

Each 512-byte sector holds its block number, version and sector number,
repeated: a stale, torn or misplaced sector cannot pass for another.
"""

import json
import os
import random
import struct
import sys
import threading
import time

import nbd

SECTOR = 512
BLOCK = 4096


def block_bytes(block, version):
    if version == 0:
        return bytes(BLOCK)
    out = []
    for s in range(BLOCK // SECTOR):
        head = struct.pack("<QQQ", block, version, s)
        out.append(head * 21 + head[:8])
    return b"".join(out)


def blocks_bytes(first, versions):
    return b"".join(block_bytes(first + i, v) for i, v in enumerate(versions))


def seen(block, data):
    """What a wrong block holds, for the message."""
    if data == bytes(BLOCK):
        return "zeroes"
    b, v, s = struct.unpack("<QQQ", data[:24])
    return "block %d v%d sector %d%s" % (
        b, v, s, "" if data == block_bytes(b, v) else " (torn)")


def connect(uri):
    h = nbd.NBD()
    h.connect_uri(uri)
    return h


def worker(n, args, stop, out):
    rng = random.Random(args["seed"] * 1000 + n)
    conns = args["conns"]
    region = args["blocks"] // conns
    base = n * region
    sizes = [s for s in args["sizes"] if s <= region]
    mine = {b: v for b, v in args["prior"].items() if base <= b < base + region}
    count = 0
    writes = flushes = fua = 0
    h = connect(args["uri"])
    try:
        while not stop.is_set():
            size = rng.choice(sizes)
            first = base + rng.randrange(0, region - size + 1) // size * size
            span = range(first, first + size)
            if rng.randrange(5) == 0:
                data = h.pread(size * BLOCK, first * BLOCK)
                want = blocks_bytes(first, [mine.get(b, 0) for b in span])
                if data != want:
                    for i, b in enumerate(span):
                        got = data[i * BLOCK:(i + 1) * BLOCK]
                        if got != want[i * BLOCK:(i + 1) * BLOCK]:
                            raise AssertionError(
                                "worker %d: a read of block %d saw %s, the last write "
                                "acknowledged was v%d" % (n, b, seen(b, got), mine.get(b, 0)))
                continue
            count += 1
            version = args["version_base"] + count * conns + n
            flags = 0
            if args["fua"] and rng.randrange(8) == 0:
                flags = nbd.CMD_FLAG_FUA
                fua += 1
            h.pwrite(blocks_bytes(first, [version] * size), first * BLOCK, flags)
            writes += 1
            for b in span:
                mine[b] = version
            if args["flush_every"] and writes % args["flush_every"] == 0:
                h.flush()
                flushes += 1
    except Exception as e:  # noqa: BLE001 - every failure is the test's
        out["errors"].append("worker %d: %s: %s" % (n, type(e).__name__, e))
        stop.set()
    finally:
        try:
            h.shutdown()
        except Exception:  # noqa: BLE001 - the connection may be gone
            pass
    with out["lock"]:
        out["acked"].update(mine)
        out["writes"] += writes
        out["flushes"] += flushes
        out["fua"] += fua


def load(args):
    with open(args["prior"]) as f:
        args["prior"] = {int(b): v for b, v in json.load(f).items()}
    stop = threading.Event()
    out = {"lock": threading.Lock(), "acked": {}, "writes": 0, "flushes": 0,
           "fua": 0, "errors": []}
    threads = [threading.Thread(target=worker, args=(n, args, stop, out))
               for n in range(args["conns"])]
    for t in threads:
        t.start()
    deadline = time.monotonic() + args["max_secs"]
    while not os.path.exists(args["stop_file"]) and not stop.is_set():
        if time.monotonic() > deadline:
            out["errors"].append("no stop file within %d s" % args["max_secs"])
            break
        time.sleep(0.02)
    stop.set()
    for t in threads:
        t.join()
    del out["lock"]
    with open(args["out"], "w") as f:
        json.dump(out, f)
    return 1 if out["errors"] else 0


def check(source, acked_file, blocks):
    with open(acked_file) as f:
        acked = {int(b): v for b, v in json.load(f).items()}
    if source.startswith("/"):
        fd = open(source, "rb")
        read = lambda length, offset: os.pread(fd.fileno(), length, offset)
    else:
        h = connect(source)
        read = h.pread
    chunk = 256
    wrong = []
    for first in range(0, blocks, chunk):
        data = read(chunk * BLOCK, first * BLOCK)
        for i in range(chunk):
            b = first + i
            got = data[i * BLOCK:(i + 1) * BLOCK]
            if got != block_bytes(b, acked.get(b, 0)):
                wrong.append("block %d: %s, want v%d" % (b, seen(b, got), acked.get(b, 0)))
    print("checked %d blocks, %d written, %d wrong" % (blocks, len(acked), len(wrong)))
    for w in wrong[:40]:
        print("  " + w)
    return 1 if wrong else 0


if __name__ == "__main__":
    if sys.argv[1] == "load":
        sys.exit(load(json.loads(sys.argv[2])))
    sys.exit(check(sys.argv[2], sys.argv[3], int(sys.argv[4])))

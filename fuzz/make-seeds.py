# Writes the small seed inputs under fuzz/seeds/<target>/ (committed; rerun
# only to change them): python3 fuzz/make-seeds.py fuzz/seeds
import struct, os, sys
root = sys.argv[1]
def w(target, name, data):
    d = os.path.join(root, target); os.makedirs(d, exist_ok=True)
    open(os.path.join(d, name), 'wb').write(data)

IHAVEOPT = b'IHAVEOPT'
def opt(code, data=b''): return IHAVEOPT + struct.pack('>II', code, len(data)) + data
def s32(s): return struct.pack('>I', len(s)) + s
def go(name, infos=(3, 1, 2)): return s32(name) + struct.pack('>H', len(infos)) + b''.join(struct.pack('>H', i) for i in infos)
def meta(export, queries): return s32(export) + struct.pack('>I', len(queries)) + b''.join(s32(q) for q in queries)
REQ = 0x25609513
def req(flags, cmd, cookie, off, length, payload=b''):
    return struct.pack('>IHHQQI', REQ, flags, cmd, cookie, off, length) + payload
flags = struct.pack('>I', 3)
# Option codes: EXPORT_NAME 1, ABORT 2, LIST 3, STARTTLS 5, INFO 6, GO 7,
# STRUCTURED_REPLY 8, LIST_META_CONTEXT 9, SET_META_CONTEXT 10.
reqs = (req(0, 0, 1, 0, 4096) + req(1, 1, 2, 4096, 512, b'\xab' * 512) + req(0, 3, 3, 0, 0)
        + req(0, 7, 4, 0, 65536) + req(0, 4, 5, 0, 4096) + req(0, 6, 6, 8192, 4096)
        + req(0, 2, 7, 0, 0))
w('server_handshake', 'go-with-contexts', flags + opt(8) + opt(3) + opt(9, meta(b'vol', [b'x-braid:'])) +
  opt(10, meta(b'vol', [b'base:allocation', b'x-braid:volume'])) + opt(6, go(b'vol')) + opt(7, go(b'vol')) + reqs)
w('server_handshake', 'starttls-then-go', flags + opt(5) + opt(8) + opt(7, go(b'')) + reqs)
w('server_handshake', 'fence', flags + opt(8) + opt(9, meta(b'vol', [b'x-braid:fence=1,2', b'x-braid:conn'])) + opt(2))
w('server_handshake', 'export-name', struct.pack('>I', 1) + opt(3) + opt(1, b'vol') + reqs)
w('server_handshake', 'refusals', flags + opt(7, go(b'secret')) + opt(6, go(b'nope')) + opt(99, b'x' * 2000) + opt(2))

# Server side of the conversations the client configs in the fuzzing
# module expect.
OPT_REPLY = 0x3e889045565a9
def rep(option, kind, data=b''): return struct.pack('>QIII', OPT_REPLY, option, kind, len(data)) + data
ACK, SERVER, INFO, META = 1, 2, 3, 4
ERR_UNSUP = (1 << 31) + 1
greet = b'NBDMAGIC' + IHAVEOPT + struct.pack('>H', 3)
info_export = struct.pack('>HQH', 0, 1 << 20, 0x0dfd)
info_bs = struct.pack('>HIII', 3, 512, 4096, 1 << 25)
info_name = struct.pack('>H', 1) + b'vol'
w('client_handshake', 'go-with-contexts', greet + rep(8, ACK) + rep(9, META, struct.pack('>I', 0) + b'x-braid:volume=00000000-0000-0000-0000-000000000001')
  + rep(9, META, struct.pack('>I', 0) + b'x-braid:portal=127.0.0.1:10809') + rep(9, ACK)
  + rep(10, META, struct.pack('>I', 1) + b'base:allocation') + rep(10, ACK)
  + rep(7, INFO, info_export) + rep(7, INFO, info_bs) + rep(7, INFO, info_name) + rep(7, ACK))
w('client_handshake', 'list-and-info', greet + rep(3, SERVER, s32(b'vol') + b'a volume') + rep(3, ACK) + rep(8, ACK)
  + rep(6, INFO, info_export) + rep(6, ACK) + rep(2, ACK))
w('client_handshake', 'starttls-list-abort', greet + rep(5, ACK) + rep(3, SERVER, s32(b'vol')) + rep(3, ACK) + rep(2, ACK))
w('client_handshake', 'go-unsupported-export-name', greet + rep(7, ERR_UNSUP, b'old server') + struct.pack('>QH', 1 << 20, 0x0d))

neg = struct.pack('>QHBIB', 1 << 20, 0x0dfd, 9, 1 << 16, 3)
w('request', 'read', req(0, 0, 1, 0, 4096) + neg)
w('request', 'write-fua', req(1, 1, 2, 4096, 512) + neg)
w('request', 'write-zeroes', req(0x12, 6, 3, 8192, 1 << 20) + neg)
w('request', 'block-status', req(8, 7, 4, 0, 65536) + neg)
w('request', 'flush', req(0, 3, 5, 0, 0))

SIMPLE, CHUNK = 0x67446698, 0x668e33ef
def chunk(flags, kind, cookie, payload): return struct.pack('>IHHQI', CHUNK, flags, kind, cookie, len(payload)) + payload
w('reply', 'simple', struct.pack('>IIQ', SIMPLE, 0, 1) + b'\0' * 512)
w('reply', 'none', chunk(1, 0, 2, b''))
w('reply', 'offset-data', chunk(0, 1, 3, struct.pack('>Q', 4096) + b'\x55' * 64))
w('reply', 'offset-hole', chunk(0, 2, 4, struct.pack('>QI', 8192, 4096)))
w('reply', 'block-status', chunk(1, 5, 5, struct.pack('>IIIII', 1, 4096, 3, 8192, 0)))
w('reply', 'error', chunk(1, (1 << 15) + 1, 6, struct.pack('>IH', 5, 3) + b'eio'))
w('reply', 'error-offset', chunk(1, (1 << 15) + 2, 7, struct.pack('>IH', 22, 3) + b'bad' + struct.pack('>Q', 512)))

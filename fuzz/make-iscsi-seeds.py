# Writes the seed inputs of the iscsi_initiator target under
# fuzz/seeds/iscsi_initiator/ (committed; rerun only to change them):
#   python3 fuzz/make-iscsi-seeds.py fuzz/seeds
# An input is one mode byte (bit 0 header digest, 1 data digest, 2
# InitialR2T, 3 ImmediateData, 4 mutual CHAP), then what a target sends:
# login responses, then full-feature PDUs for the commands braid's fuzzing
# entry point has in flight (ITT 1 an INQUIRY reading 4096 bytes, 2 a
# 32 KiB WRITE, 3 a ping, 4 SendTargets).
import os, struct, sys
root = sys.argv[1]
def w(name, data):
    d = os.path.join(root, 'iscsi_initiator'); os.makedirs(d, exist_ok=True)
    open(os.path.join(d, name), 'wb').write(data)

def pdu(op, flags, itt, fields=b'', data=b'', lun=0, b2=0, b3=0, tsih=0):
    # fields: bytes 20..48 (28 bytes)
    fields = fields.ljust(28, b'\0')
    h = bytes([op, flags, b2, b3, 0]) + struct.pack('>I', len(data))[1:]
    h += struct.pack('>Q', lun) if not tsih else (b'\x80\0\0\0\0\x01' + struct.pack('>H', tsih))
    h += struct.pack('>I', itt) + fields
    assert len(h) == 48
    return h + data + b'\0' * (-len(data) % 4)

def text(*pairs): return b''.join(k + b'=' + v + b'\0' for k, v in pairs)
def nums(stat_sn, exp=1, mx=64): return struct.pack('>III', stat_sn, exp, mx)
def login(flags, stat_sn, keys, status=(0, 0), tsih=0):
    f = b'\0\0\0\0' + nums(stat_sn) + bytes(status) + b'\0' * 10
    return pdu(0x23, flags, 0, f, text(*keys), tsih=tsih)

ops = [(b'HeaderDigest', b'None'), (b'DataDigest', b'None'), (b'InitialR2T', b'No'),
       (b'ImmediateData', b'Yes'), (b'MaxBurstLength', b'65536'), (b'FirstBurstLength', b'16384'),
       (b'MaxRecvDataSegmentLength', b'8192'), (b'TargetPortalGroupTag', b'1')]
chap = (login(0x00, 0, [(b'AuthMethod', b'CHAP')]) +
        login(0x00, 1, [(b'CHAP_A', b'5'), (b'CHAP_I', b'9'), (b'CHAP_C', b'0x' + b'ab' * 16)]) +
        login(0x81, 2, []) +
        login(0x87, 3, ops, tsih=0x0102))
inq = bytes([0, 0x83, 0, 12, 1, 3, 0, 8]) + bytes([0x60, 1, 2, 3, 4, 5, 6, 7])
def data_in(itt, sn, data, off=0, status=True):
    f = struct.pack('>I', 0xffffffff) + nums(sn, 2, 70) + struct.pack('>III', 0, off, 4096 - len(data))
    return pdu(0x25, 0x83 if status else 0, itt, f, data)
r2t = pdu(0x31, 0x80, 2, struct.pack('>I', 0x10) + nums(0, 2, 70) + struct.pack('>III', 0, 16384, 16384))
resp = pdu(0x21, 0x80, 2, b'\0' * 4 + nums(5, 3, 70))
nop = pdu(0x20, 0x80, 3, struct.pack('>I', 0xffffffff) + nums(6, 3, 70))
target_ping = pdu(0x20, 0x80, 0xffffffff, struct.pack('>I', 0x77) + nums(7, 3, 70))
st = text((b'TargetName', b'iqn.2026-11.org.braid-storage:vol'), (b'TargetAddress', b'10.0.1.5:3260,1'),
          (b'TargetAddress', b'[fd00::5]:3260,2'))
txt = pdu(0x24, 0x80, 4, struct.pack('>I', 0xffffffff) + nums(8, 3, 70), st)
sense = struct.pack('>H', 18) + bytes([0x70, 0, 6, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x2a, 6, 0, 0, 0, 0])
check = pdu(0x21, 0x80, 1, b'\0' * 4 + nums(4, 2, 70), sense, b3=2)
async_ua = pdu(0x32, 0x80, 0xffffffff, b'\0' * 4 + nums(9, 3, 70) + b'\0' * 4, sense)
w('chap-then-everything', bytes([0x08]) + chap + data_in(1, 4, inq) + r2t + resp + nop + target_ping + txt + async_ua)
w('check-condition', bytes([0x08]) + chap + check + r2t)
w('mutual-chap-refused', bytes([0x1c]) + chap)
w('redirect', bytes([0]) + login(0x00, 0, [(b'TargetAddress', b'10.0.9.9:3260,1')], status=(1, 1)))
w('no-login', bytes([0x08]) + data_in(1, 1, inq[:8], status=False) + data_in(1, 2, inq[8:], off=8) + txt)

# Writes the seed inputs of the iscsi_target fuzz target under
# fuzz/seeds/iscsi_target/ (committed; rerun only to change them):
#   python3 fuzz/make-iscsi-target-seeds.py fuzz/seeds
# An input is one mode byte (bit 0 CHAP required, bit 1 mutual), then what
# an initiator sends: login requests, then full-feature PDUs.
import os, struct, sys
root = sys.argv[1]
def w(name, data):
    d = os.path.join(root, 'iscsi_target'); os.makedirs(d, exist_ok=True)
    open(os.path.join(d, name), 'wb').write(data)

def pdu(op, flags, itt, rest=b'', data=b'', lun=0, isid=None):
    # rest: bytes 20..48 (28 bytes)
    rest = rest.ljust(28, b'\0')
    h = bytes([op, flags, 0, 0, 0]) + struct.pack('>I', len(data))[1:]
    h += (isid + b'\0\0') if isid else struct.pack('>Q', lun)
    h += struct.pack('>I', itt) + rest
    assert len(h) == 48
    return h + data + b'\0' * (-len(data) % 4)

def text(*pairs): return b''.join(k + b'=' + v + b'\0' for k, v in pairs)
ISID = b'\x80\x00\x00\x42\x00\x01'
def login(flags, keys, cmd_sn=1, exp_stat_sn=0):
    rest = b'\0\0\0\0' + struct.pack('>II', cmd_sn, exp_stat_sn)
    return pdu(0x43, flags, 0x10, rest, text(*keys), isid=ISID)
who = [(b'InitiatorName', b'iqn.2026-11.org.example:fuzz'),
       (b'TargetName', b'iqn.2026-11.org.braid-storage:vol'), (b'SessionType', b'Normal')]
ops = [(b'HeaderDigest', b'None'), (b'DataDigest', b'None'), (b'InitialR2T', b'No'),
       (b'ImmediateData', b'Yes'), (b'MaxBurstLength', b'65536'), (b'FirstBurstLength', b'16384'),
       (b'MaxRecvDataSegmentLength', b'8192'), (b'MaxOutstandingR2T', b'1')]
plain = login(0x81, who + [(b'AuthMethod', b'None')]) + login(0x87, ops)

def scsi(itt, cdb, expected, data=b'', cmd_sn=1, flags=0xa0):
    rest = struct.pack('>III', expected, cmd_sn, 1) + cdb.ljust(16, b'\0')
    return pdu(0x01, flags, itt, rest, data)
def data_out(itt, ttt, sn, offset, data, final=True):
    rest = struct.pack('>I', ttt) + b'\0\0\0\0' + struct.pack('>I', 1) + b'\0' * 4 + struct.pack('>II', sn, offset)
    return pdu(0x05, 0x80 if final else 0, itt, rest, data)
write10 = lambda lba, blocks: bytes([0x2a, 0]) + struct.pack('>I', lba) + b'\0' + struct.pack('>H', blocks) + b'\0'
read10 = lambda lba, blocks: bytes([0x28, 0]) + struct.pack('>I', lba) + b'\0' + struct.pack('>H', blocks) + b'\0'

# A 16 KiB WRITE: 8 KiB immediate, 8 KiB unsolicited Data-Out (the first
# burst), then a READ, a PERSISTENT RESERVE OUT and SendTargets.
w('login-write-read-text', b'\x00' + plain
  + scsi(1, write10(0, 32), 16384, b'\x11' * 8192, cmd_sn=1, flags=0x20)
  + data_out(1, 0xffffffff, 0, 8192, b'\x22' * 8192)
  + scsi(2, read10(0, 8), 4096, cmd_sn=2, flags=0xc0)
  + scsi(3, bytes([0x5f, 0, 1, 0, 0, 0, 0, 0, 24, 0]), 24, struct.pack('>QQ', 0, 7) + b'\0' * 8, cmd_sn=3)
  + pdu(0x04, 0x80, 4, struct.pack('>III', 0xffffffff, 4, 1), text((b'SendTargets', b'All'))))
# A WRITE larger than the first burst: R2T-solicited Data-Out, out of order.
w('write-past-first-burst', b'\x00' + plain
  + scsi(1, write10(8, 64), 32768, b'\x33' * 8192, cmd_sn=1, flags=0x20)
  + data_out(1, 0xffffffff, 0, 8192, b'\x44' * 8192)
  + data_out(1, 1, 1, 24576, b'\x55' * 8192)
  + data_out(1, 1, 0, 16384, b'\x66' * 8192))
# CHAP required: AuthMethod offered, CHAP_A chosen (the response cannot be
# right without the challenge, so the login fails where a wrong one does).
w('chap-wrong-answer', b'\x01'
  + login(0x00, who + [(b'AuthMethod', b'CHAP,None')])
  + login(0x00, [(b'CHAP_A', b'5')])
  + login(0x81, [(b'CHAP_N', b'u'), (b'CHAP_R', b'0x' + b'00' * 16)]))

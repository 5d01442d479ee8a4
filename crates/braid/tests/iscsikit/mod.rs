//! A minimal iSCSI initiator for tests, on `braid-iscsi`'s framing: log in
//! to a normal session, WRITE(10) and READ(10) with data checked by the
//! caller. Deliberately plain (one command at a time, immediate data,
//! then Data-Out as R2Ts ask), so that a test can drive the target with
//! exact bytes; interop with a real initiator is libiscsi's part.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use braid_iscsi::pdu::{Bhs, Framer, Opcode, Pdu};
use braid_iscsi::{text, Digests};
use bytes::{Bytes, BytesMut};

pub struct Initiator {
    stream: TcpStream,
    framer: Framer,
    buf: BytesMut,
    cmd_sn: u32,
    exp_stat_sn: u32,
    itt: u32,
    /// The target's MaxRecvDataSegmentLength.
    max_send: usize,
}

impl Initiator {
    /// Logs in to `target` at `addr`, straight into the operational stage.
    pub fn login(addr: std::net::SocketAddr, target: &str) -> Initiator {
        let stream = TcpStream::connect(addr).expect("connect to the iSCSI portal");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut i = Initiator {
            stream,
            framer: Framer::new(1 << 20),
            buf: BytesMut::new(),
            cmd_sn: 1,
            exp_stat_sn: 0,
            itt: 1,
            max_send: 8192,
        };
        let mut b = Bhs::new(Opcode::LoginRequest);
        b.set_immediate(true);
        b.0[1] = 0x80 | (1 << 2) | 3; // T, operational -> full feature
        b.0[8..14].copy_from_slice(&[0x80, 0, 0, 0x42, 0, 1]);
        b.set_itt(0);
        b.set_u32(24, i.cmd_sn);
        let keys = text::encode(&[
            (
                "InitiatorName",
                "iqn.2026-11.org.braid-storage:test-initiator",
            ),
            ("SessionType", "Normal"),
            ("TargetName", target),
            ("HeaderDigest", "CRC32C"),
            ("DataDigest", "CRC32C"),
            ("MaxRecvDataSegmentLength", "1048576"),
            ("InitialR2T", "Yes"),
            ("ImmediateData", "Yes"),
        ]);
        i.send(&Pdu::new(b, Bytes::from(keys)));
        let resp = i.recv();
        assert_eq!(resp.bhs.opcode(), Opcode::LoginResponse);
        assert_eq!((resp.bhs.0[36], resp.bhs.0[37]), (0, 0), "login status");
        assert_eq!(resp.bhs.0[1] & 0x83, 0x83, "moved to full feature");
        let answers = text::parse(&resp.data).expect("login answer text");
        let get = |k: &str| {
            answers
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no {k} in {answers:?}"))
        };
        assert_eq!(get("HeaderDigest"), "CRC32C");
        i.max_send = get("MaxRecvDataSegmentLength").parse().expect("a number");
        i.exp_stat_sn = resp.bhs.u32_at(24).wrapping_add(1);
        i.framer.set(
            Digests {
                header: true,
                data: true,
            },
            1 << 20,
        );
        i
    }

    fn send(&mut self, pdu: &Pdu) {
        let digests = if self.cmd_sn == 1 && pdu.bhs.opcode() == Opcode::LoginRequest {
            Digests::default()
        } else {
            Digests {
                header: true,
                data: true,
            }
        };
        let mut out = Vec::new();
        pdu.encode(digests, &mut out);
        self.stream.write_all(&out).expect("send a PDU");
    }

    /// Sends WRITE(10) of `blocks` at `lba` and no data at all, as a
    /// hostile or broken initiator would; returns its task tag.
    pub fn write10_without_data(&mut self, lba: u32, blocks: u16) -> u32 {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x2a;
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        self.command(cdb, false, true, u32::from(blocks) * 512, &[])
            .itt()
    }

    /// The next PDU from the target.
    pub fn next_pdu(&mut self) -> Pdu {
        self.recv()
    }

    fn recv(&mut self) -> Pdu {
        loop {
            if let Some(p) = self.framer.next(&mut self.buf).expect("a well-formed PDU") {
                return p;
            }
            let mut chunk = [0u8; 65536];
            let n = self.stream.read(&mut chunk).expect("read from the target");
            assert!(n > 0, "the target closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn command(
        &mut self,
        cdb: [u8; 16],
        read: bool,
        write: bool,
        expected: u32,
        immediate: &[u8],
    ) -> Bhs {
        let mut b = Bhs::new(Opcode::ScsiCommand);
        b.0[1] = 0x80 | if read { 0x40 } else { 0 } | if write { 0x20 } else { 0 } | 1;
        b.set_itt(self.itt);
        b.set_u32(20, expected);
        b.set_u32(24, self.cmd_sn);
        b.set_u32(28, self.exp_stat_sn);
        b.0[32..48].copy_from_slice(&cdb);
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.itt = self.itt.wrapping_add(1);
        self.send(&Pdu::new(b, Bytes::copy_from_slice(immediate)));
        b
    }

    /// WRITE(10) of `data` at `lba` (512-byte blocks); panics unless GOOD.
    pub fn write10(&mut self, lba: u32, data: &[u8]) {
        let blocks = u16::try_from(data.len() / 512).expect("fits WRITE(10)");
        let mut cdb = [0u8; 16];
        cdb[0] = 0x2a;
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        let first = data.len().min(self.max_send).min(65536);
        let cmd = self.command(cdb, false, true, data.len() as u32, &data[..first]);
        loop {
            let p = self.recv();
            match p.bhs.opcode() {
                Opcode::R2t => {
                    let (ttt, offset, len) = (p.bhs.u32_at(20), p.bhs.u32_at(40), p.bhs.u32_at(44));
                    let mut sent = 0;
                    let mut data_sn = 0;
                    while sent < len {
                        let n = (len - sent).min(self.max_send as u32);
                        let mut d = Bhs::new(Opcode::DataOut);
                        d.set_final(sent + n == len);
                        d.set_itt(cmd.itt());
                        d.set_u32(20, ttt);
                        d.set_u32(28, self.exp_stat_sn);
                        d.set_u32(36, data_sn);
                        d.set_u32(40, offset + sent);
                        let at = (offset + sent) as usize;
                        self.send(&Pdu::new(
                            d,
                            Bytes::copy_from_slice(&data[at..at + n as usize]),
                        ));
                        sent += n;
                        data_sn += 1;
                    }
                }
                Opcode::ScsiResponse => {
                    self.exp_stat_sn = p.bhs.u32_at(24).wrapping_add(1);
                    assert_eq!((p.bhs.0[2], p.bhs.0[3]), (0, 0), "WRITE(10) status");
                    return;
                }
                other => panic!("unexpected {other:?} during a WRITE"),
            }
        }
    }

    /// READ(10) of `blocks` at `lba`; panics unless GOOD.
    pub fn read10(&mut self, lba: u32, blocks: u16) -> Vec<u8> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x28;
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        let len = usize::from(blocks) * 512;
        self.command(cdb, true, false, len as u32, &[]);
        let mut out = vec![0u8; len];
        loop {
            let p = self.recv();
            match p.bhs.opcode() {
                Opcode::DataIn => {
                    let at = p.bhs.u32_at(40) as usize;
                    out[at..at + p.data.len()].copy_from_slice(&p.data);
                    if p.bhs.0[1] & 0x01 != 0 {
                        self.exp_stat_sn = p.bhs.u32_at(24).wrapping_add(1);
                        assert_eq!(p.bhs.0[3], 0, "READ(10) status");
                        return out;
                    }
                }
                Opcode::ScsiResponse => {
                    panic!("READ(10) answered without data: status {}", p.bhs.0[3])
                }
                other => panic!("unexpected {other:?} during a READ"),
            }
        }
    }
}

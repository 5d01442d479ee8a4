//! `braid serve --iscsi` against initiators that no real one resembles and
//! against old ones: login text that never ends, names that are not
//! names, RFC 3720's marker keys, and a SendTargets answer larger than the
//! initiator takes in one PDU. A raw client on `braid-iscsi`'s framing
//! sends exactly the PDUs each case needs; libiscsi checks the answers a
//! real initiator reads.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use braid_iscsi::pdu::{Bhs, Framer, Opcode, Pdu};
use braid_iscsi::Digests;
use bytes::{Bytes, BytesMut};
use common::{free_port, Serve};

/// One connection that sends PDUs as given and reads what comes back.
struct Raw {
    stream: TcpStream,
    buf: BytesMut,
    framer: Framer,
    cmd_sn: u32,
    exp_stat_sn: u32,
}

impl Raw {
    fn connect(port: u16) -> Raw {
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let stream = TcpStream::connect(addr).expect("connect to the iSCSI portal");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Raw {
            stream,
            buf: BytesMut::new(),
            framer: Framer::new(1 << 24),
            cmd_sn: 1,
            exp_stat_sn: 0,
        }
    }

    fn send(&mut self, pdu: &Pdu) {
        let mut out = Vec::new();
        pdu.encode(Digests::default(), &mut out);
        self.stream.write_all(&out).expect("send a PDU");
    }

    /// The next PDU, or `None` when the target closed the connection.
    fn recv(&mut self) -> Option<Pdu> {
        loop {
            if let Some(pdu) = self.framer.next(&mut self.buf).expect("a PDU") {
                self.exp_stat_sn = pdu.bhs.u32_at(24).wrapping_add(1);
                return Some(pdu);
            }
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("reading from the target: {e}"),
            }
        }
    }

    /// A Login Request from the operational stage: T set moves to full
    /// feature, C set says more text follows.
    fn login_pdu(&mut self, transit: bool, more: bool, data: Vec<u8>) -> Pdu {
        let mut b = Bhs::new(Opcode::LoginRequest);
        b.set_immediate(true);
        b.0[1] = (u8::from(transit) << 7) | (u8::from(more) << 6) | (1 << 2) | 3;
        b.0[8..14].copy_from_slice(&[0x80, 0, 0, 0x42, 0, 7]);
        b.set_u32(24, self.cmd_sn);
        b.set_u32(28, self.exp_stat_sn);
        Pdu::new(b, Bytes::from(data))
    }
}

/// A Login Response's status class and detail.
fn status(pdu: &Pdu) -> (u8, u8) {
    assert_eq!(pdu.bhs.opcode(), Opcode::LoginResponse, "{pdu:?}");
    (pdu.bhs.0[36], pdu.bhs.0[37])
}

fn logged(serve: &Serve, text: &str) -> bool {
    common::wait_until(Duration::from_secs(10), || serve.log().contains(text))
}

/// 256 KiB of distinct keys over continued Login PDUs, before any
/// authentication: the target refuses the login once the text passes
/// 64 KiB, with a Login Response that says so (initiator error), instead
/// of holding it all and then parsing it.
#[test]
fn a_login_of_endless_text_is_refused_once_past_64_kib() {
    let port = free_port();
    let serve = Serve::start(&[&format!("--iscsi={port}"), "vol=mem:1MiB"]);
    let mut raw = Raw::connect(port);
    let mut keys = Vec::new();
    let mut i = 0u32;
    while keys.len() < 256 * 1024 {
        keys.extend_from_slice(format!("X-{i:06x}=\0").as_bytes());
        i += 1;
    }
    let mut sent = 0;
    let mut refused = None;
    for chunk in keys.chunks(8192) {
        sent += chunk.len();
        let pdu = raw.login_pdu(false, sent < keys.len(), chunk.to_vec());
        raw.send(&pdu);
        let resp = raw.recv().expect("a Login Response");
        if status(&resp) != (0, 0) {
            refused = Some((sent, status(&resp)));
            break;
        }
    }
    let Some((at, st)) = refused else {
        panic!("256 KiB of login text accepted:\n{}", serve.log());
    };
    assert!(at <= 64 * 1024 + 8192, "refused only after {at} bytes");
    assert_eq!(st, (2, 0), "initiator error");
    assert!(raw.recv().is_none(), "the connection ends");
    assert!(
        logged(&serve, "login text past 65536 bytes"),
        "{}",
        serve.log()
    );
}

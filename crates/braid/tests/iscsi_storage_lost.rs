//! Storage lost over iSCSI: when a backend says this server may no longer
//! use its storage (ESHUTDOWN, a Ceph client another gateway blocklisted),
//! the command is not answered and the connection is closed, as over NBD:
//! the initiator takes it for a path failure, fences and goes elsewhere,
//! rather than for a bad medium (which no multipath layer retries on
//! another path) or for a command that never ran.

mod iscsikit;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use braid_iscsi::pdu::Opcode;
use braid_iscsi_target::IscsiConfig;
use braid_store::backend::{Backend, Caps, Extent, FileBackend, ZeroError};
use braid_store::Export;
use iscsikit::inproc::IscsiOnly;
use iscsikit::{write10_cdb, Initiator};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";

/// Memory that can be lost to this server.
#[derive(Debug)]
struct Losable {
    memory: FileBackend,
    lost: AtomicBool,
}

impl Losable {
    fn check(&self) -> io::Result<()> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::ESHUTDOWN));
        }
        Ok(())
    }
}

impl Backend for Losable {
    fn size(&self) -> u64 {
        self.memory.size()
    }
    fn caps(&self) -> Caps {
        self.memory.caps()
    }
    fn blocking(&self) -> bool {
        false
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check()?;
        self.memory.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.check()?;
        self.memory.write_at(buf, offset, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.check()?;
        self.memory.flush()
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        self.check()?;
        self.memory.trim(offset, len, fua)
    }
    fn zero(&self, o: u64, l: u64, may_trim: bool, fast: bool, fua: bool) -> Result<(), ZeroError> {
        self.check()?;
        self.memory.zero(o, l, may_trim, fast, fua)
    }
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        self.check()?;
        self.memory.extents(offset, len)
    }
    fn cache(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check()?;
        self.memory.cache(offset, len)
    }
}

#[test]
fn a_command_on_lost_storage_is_not_answered_and_its_connection_closes() {
    let backend = Arc::new(Losable {
        memory: FileBackend::memory(4 << 20).expect("memory"),
        lost: AtomicBool::new(false),
    });
    let export = Arc::new(Export::local(
        "vol",
        "memory",
        backend.clone(),
        false,
        uuid::Uuid::new_v4(),
    ));
    let server = IscsiOnly::serving(IscsiConfig::default(), export);
    let addr = server.addr;

    let mut i = Initiator::login(addr, TARGET);
    i.write10(8, &[7; 512]);
    backend.lost.store(true, Ordering::SeqCst);
    let itt = i.send_command(&write10_cdb(8, 1), &[9; 512], 0);
    let said = i.last_words(Duration::from_secs(10)).unwrap_or_else(|| {
        let r = i.wait(itt);
        panic!("the target kept the connection and answered the WRITE on lost storage: {r:?}")
    });
    let answers: Vec<_> = said
        .iter()
        .filter(|p| p.bhs.itt() == itt && p.bhs.opcode() == Opcode::ScsiResponse)
        .collect();
    assert!(answers.is_empty(), "the WRITE on lost storage was answered");
    let mut kept = [0u8; 512];
    backend
        .memory
        .read_at(&mut kept, 8 * 512)
        .expect("read the memory");
    assert_eq!(kept, [7; 512], "a write on lost storage landed");

    // The server itself serves on: a new login is taken.
    backend.lost.store(false, Ordering::SeqCst);
    let mut again = Initiator::login(addr, TARGET);
    assert_eq!(again.read10(8, 1), vec![7; 512]);
    again.logout();
}

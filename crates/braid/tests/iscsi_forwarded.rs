//! The iSCSI target over storage reached elsewhere: a multipath volume
//! (what `braid attach` serves over NBD) as the storage of an iSCSI LUN,
//! through the same executor as a file. Data written over iSCSI is read
//! back over iSCSI and found byte for byte in the memory behind the
//! upstream NBD server; COMPARE AND WRITE, which could not be atomic
//! there, is refused.

mod iscsikit;

#[path = "../src/attach/forward.rs"]
#[allow(dead_code)]
mod forward;

use std::sync::Arc;

use braid_initiator::{Volume, VolumeConfig, VolumeUri};
use braid_iscsi_target::IscsiConfig;
use braid_nbd_target::Target;
use braid_store::backend::{Backend, FileBackend};
use braid_store::portal::Portal;
use braid_store::{Export, Exports, Limits};
use iscsikit::inproc::IscsiOnly;
use iscsikit::{Initiator, CHECK_CONDITION};

const TARGET: &str = "iqn.2026-11.org.braid-storage:fwd";

fn portal() -> Portal {
    Portal {
        addr: "127.0.0.1:0".parse().expect("an address"),
        device: None,
    }
}

#[test]
fn iscsi_serves_a_forwarded_volume_byte_for_byte() {
    let memory: Arc<dyn Backend> = Arc::new(FileBackend::memory(8 << 20).expect("memory"));
    let upstream = Arc::new(Export::local(
        "vol",
        "memory",
        memory.clone(),
        false,
        uuid::Uuid::new_v4(),
    ));
    // The upstream NBD server and the volume run on the target's runtime
    // and end with it.
    let make = move || -> std::pin::Pin<Box<dyn std::future::Future<Output = Exports>>> {
        Box::pin(async move {
            let nbd = Target::bind(Exports::new(vec![upstream]), &[portal()], Limits::default())
                .expect("bind the NBD portal");
            let nbd_addr = nbd.local_addrs()[0];
            tokio::spawn(nbd.run());
            let uri: VolumeUri = format!("nbd://{nbd_addr}/vol").parse().expect("a URI");
            let vol = Volume::open(VolumeConfig::new(uri))
                .await
                .expect("open the volume");
            Exports::new(vec![Arc::new(Export {
                name: "fwd".into(),
                description: "a volume over NBD".into(),
                storage: Arc::new(forward::VolumeForward(Arc::new(vol))),
                read_only: false,
                volume: uuid::Uuid::new_v4(),
                allow: Vec::new(),
                peers: None,
                writes: Default::default(),
            })])
        })
    };
    let server = IscsiOnly::start(IscsiConfig::default(), Box::new(make));
    let addr = server.addr;

    let mut i = Initiator::login(addr, TARGET);
    let pattern: Vec<u8> = (0..1 << 20)
        .map(|n: u32| (n * 7 + n / 4096) as u8)
        .collect();
    for (k, chunk) in pattern.chunks(256 << 10).enumerate() {
        i.write10(2048 + 512 * k as u32, chunk);
    }
    let sync = i.exec(&[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0);
    assert!(sync.good(), "SYNCHRONIZE CACHE: {sync:?}");
    let mut back = Vec::new();
    for k in 0..4 {
        back.extend(i.read10(2048 + 512 * k, 512));
    }
    assert!(back == pattern, "iSCSI read back other bytes than it wrote");
    let mut stored = vec![0u8; pattern.len()];
    memory
        .read_at(&mut stored, 1 << 20)
        .expect("read the memory");
    assert!(stored == pattern, "the storage behind holds other bytes");

    // COMPARE AND WRITE of one block: the upstream's other clients are
    // not held off by this server's lock, so it is not offered.
    let mut caw = vec![0u8; 1024];
    caw[512..].fill(1);
    let r = i.exec(
        &[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0],
        &caw,
        0,
    );
    assert_eq!(
        (r.status, r.sense),
        (CHECK_CONDITION, Some((0x5, 0x20, 0x00))),
        "COMPARE AND WRITE over a forwarded volume"
    );
    i.logout();
}

//! The store's limits over iSCSI: READ data held between the storage and
//! the sockets is bounded per connection (`max_bytes`) and across the
//! server (`max_total_bytes`), so initiators that send READs and never
//! read their sockets cannot take the host's memory. Measured by the
//! target's own figure of payload held, not by a time.

mod iscsikit;

use std::sync::{mpsc, Arc};
use std::time::Duration;

use braid_iscsi_target::{IscsiConfig, IscsiServer};
use braid_store::backend::FileBackend;
use braid_store::portal::Portal;
use braid_store::{Export, Exports, Limits};
use iscsikit::{who, Initiator};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";
const MIB: usize = 1 << 20;

/// READ(16) of `blocks` 512-byte blocks at `lba`.
fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x88;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

#[test]
fn sessions_that_never_read_hold_no_more_than_the_servers_bound() {
    let limits = Limits {
        max_bytes: 32 * MIB,
        max_total_bytes: 16 * MIB,
        ..Limits::default()
    };
    let export = Arc::new(Export::local(
        "vol",
        "memory",
        Arc::new(FileBackend::memory(64 << 20).expect("memory")),
        false,
        uuid::Uuid::new_v4(),
    ));
    let (tx, rx) = mpsc::channel();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async move {
            let portal = Portal {
                addr: "127.0.0.1:0".parse().expect("an address"),
                device: None,
            };
            let cfg = IscsiConfig {
                limits,
                ..IscsiConfig::default()
            };
            let iscsi = IscsiServer::bind(&[portal], &Exports::new(vec![export]), &cfg)
                .await
                .expect("bind the iSCSI portal");
            tx.send((iscsi.local_addrs()[0], iscsi.handle()))
                .expect("the test waits");
            iscsi.run(stopped).await;
        });
    });
    let (addr, handle) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the server started");

    // Eight sessions, each asking for 48 MiB it never reads: 384 MiB in
    // all, each session's share alone (32 MiB) twice the server's bound.
    let mut sessions: Vec<Initiator> = (1..=8)
        .map(|n| Initiator::login_as(addr, TARGET, &who("iqn.2026-11.org.example:reader", n)))
        .collect();
    for s in &mut sessions {
        for k in 0..48u64 {
            s.send_command(&read16(k * 2048, 2048), &[], MIB as u32);
        }
    }
    // Until the figure stops moving (sockets full, commands waiting).
    let (mut most, mut still) = (0, 0);
    for _ in 0..400 {
        std::thread::sleep(Duration::from_millis(25));
        let now = handle.payload_in_flight();
        if now > most {
            (most, still) = (now, 0);
        } else {
            still += 1;
            if still >= 40 {
                break;
            }
        }
    }
    assert!(
        most <= 16 * MIB,
        "READ data held across sessions: {most} bytes, past max_total_bytes (16 MiB)"
    );
    assert!(
        most >= 8 * MIB,
        "the sessions held only {most} bytes: the load never reached the bound"
    );
    drop(sessions);
    stop.send(true).expect("the server runs");
    server.join().expect("the server stopped");
}

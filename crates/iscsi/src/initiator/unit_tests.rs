//! What a unit says about itself, read from braid's own target answers
//! and from pages written out by hand as other targets send them.

use super::unit::{self, AccessState, Identity};
use crate::scsi::alua::{report_target_port_groups, AccessState as ScsiState, PortGroup};
use crate::scsi::respond::Unit;

fn braid_unit() -> Unit {
    Unit {
        blocks: 1 << 20,
        block_size: 512,
        uuid: *b"\x6b\x1e\x22\x33\x44\x55\x66\x77\x88\x99\xaa\xbb\xcc\xdd\xee\xff",
        read_only: false,
        thin: true,
        zeroes_after_unmap: true,
        rotational: false,
        max_transfer_blocks: 2048,
        relative_port: 2,
        port_group: 2,
        target_port: "iqn.2026-11.org.braid-storage:vol,t,0x0002".into(),
        instance: None,
    }
}

#[test]
fn braids_own_answers_read_back() {
    let u = braid_unit();
    let inq = unit::Inquiry::parse(&u.inquiry(None, 96).unwrap()).unwrap();
    assert!(inq.is_disk());
    assert_eq!(
        (inq.vendor.as_str(), inq.product.as_str()),
        ("BRAID", "multipath volume")
    );
    assert_eq!(inq.tpgs, 1, "implicit ALUA");
    let d = unit::designators(&u.inquiry(Some(0x83), 512).unwrap()).unwrap();
    assert_eq!(
        d.identity,
        Some(Identity("naa.6b2a1d06b1e2233445566778899aabbc".into())),
        "NAA beats T10"
    );
    assert_eq!((d.relative_port, d.port_group), (Some(2), Some(2)));
    let serial = unit::serial(&u.inquiry(Some(0x80), 255).unwrap()).unwrap();
    assert_eq!(serial, "6b1e2233445566778899aabbccddeeff");
    let pages = unit::supported_pages(&u.inquiry(Some(0), 255).unwrap()).unwrap();
    assert!(pages.contains(&0xb0) && pages.contains(&0xb2));
    let l = unit::block_limits(&u.inquiry(Some(0xb0), 255).unwrap()).unwrap();
    assert_eq!(
        (l.max_transfer, l.optimal_transfer, l.max_unmap),
        (2048, 2048, 2048)
    );
    assert_eq!(
        (
            l.max_unmap_descriptors,
            l.unmap_granularity,
            l.max_write_same
        ),
        (256, 1, 2048)
    );
    let p = unit::provisioning(&u.inquiry(Some(0xb2), 255).unwrap()).unwrap();
    assert!(p.unmap && p.write_same_unmap && p.zeroes);
    let c = unit::capacity16(&u.read_capacity16(32)).unwrap();
    assert_eq!(
        (c.blocks, c.block_size, c.thin, c.bytes()),
        (1 << 20, 512, true, 512 << 20)
    );
    let groups: Vec<PortGroup> = [1, 2]
        .map(|id| PortGroup {
            id,
            state: ScsiState::ActiveOptimized,
            ports: vec![id],
        })
        .to_vec();
    let g = unit::port_groups(&report_target_port_groups(&groups, false, 1024)).unwrap();
    assert_eq!(g.len(), 2);
    assert_eq!(
        (g[1].id, g[1].state, g[1].preferred),
        (2, AccessState::ActiveOptimized, false)
    );
    assert_eq!(g[1].ports, [2]);
    // Asked for the wrong page, the answer is refused.
    assert!(unit::serial(&u.inquiry(Some(0x83), 255).unwrap()).is_err());
}

fn desc(code_set: u8, assoc: u8, kind: u8, v: &[u8]) -> Vec<u8> {
    let mut d = vec![code_set, (assoc << 4) | kind, 0, v.len() as u8];
    d.extend_from_slice(v);
    d
}

fn page83(descs: &[Vec<u8>]) -> Vec<u8> {
    let body: Vec<u8> = descs.concat();
    let mut p = vec![0, 0x83];
    p.extend_from_slice(&(body.len() as u16).to_be_bytes());
    p.extend(body);
    p
}

#[test]
fn designators_rank_as_linux_multipath_ranks_them() {
    let t10 = desc(2, 0, 1, b"IET     VIRTUAL-DISK 0001");
    let eui8 = desc(1, 0, 2, &[1; 8]);
    let eui16 = desc(1, 0, 2, &[2; 16]);
    let naa5 = desc(1, 0, 3, &[0x50, 1, 2, 3, 4, 5, 6, 7]);
    let naa6 = desc(1, 0, 3, &[0x60; 16]);
    let name = desc(3, 0, 8, b"iqn.2026-11.org.example:disk,L,0x0001\0\0\0");
    let port = desc(1, 1, 3, &[0x50; 8]); // a port's NAA: not the unit's
    let id = |ds: &[Vec<u8>]| unit::designators(&page83(ds)).unwrap().identity.unwrap().0;
    assert_eq!(
        id(std::slice::from_ref(&t10)),
        "t10.IET     VIRTUAL-DISK 0001"
    );
    assert_eq!(id(&[t10.clone(), eui8.clone()]), "eui.0101010101010101");
    assert_eq!(
        id(&[eui8.clone(), eui16.clone()]),
        "eui.02020202020202020202020202020202"
    );
    assert_eq!(
        id(&[eui16, naa5.clone(), t10.clone()]),
        "naa.5001020304050607"
    );
    assert_eq!(
        id(&[naa5, naa6.clone(), port.clone()]),
        format!("naa.{}", "60".repeat(16))
    );
    assert_eq!(
        id(&[naa6, name, t10]),
        "iqn.2026-11.org.example:disk,L,0x0001"
    );
    assert_eq!(unit::designators(&page83(&[port])).unwrap().identity, None);
    // A descriptor that claims more than the page holds is refused.
    let mut bad = page83(&[desc(1, 0, 3, &[0x50; 8])]);
    bad[7] = 40;
    assert!(unit::designators(&bad).is_err());
    let inq = unit::Inquiry::parse(b"\0\0\x05\x02\x1f\0\0\0IET     VIRTUAL-DISK    0001").unwrap();
    assert_eq!(
        unit::fallback_identity(&inq, "beaf11").unwrap().0,
        "serial.IET.VIRTUAL-DISK.beaf11"
    );
    assert_eq!(unit::fallback_identity(&inq, ""), None);
}

#[test]
fn port_groups_states_and_bad_lengths() {
    let mut d = vec![0, 0, 0, 0];
    d.extend_from_slice(&[0x01, 0x0f, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]);
    d.extend_from_slice(&[0x8f, 0x0f, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3]);
    let len = (d.len() - 4) as u32;
    d[..4].copy_from_slice(&len.to_be_bytes());
    let g = unit::port_groups(&d).unwrap();
    assert_eq!(g[0].state, AccessState::ActiveNonOptimized);
    assert_eq!(
        (g[1].state, g[1].preferred, g[1].ports.clone()),
        (AccessState::Transitioning, true, vec![2, 3])
    );
    assert_eq!(AccessState::from_code(2).name(), "standby");
    assert_eq!(AccessState::from_code(3), AccessState::Unavailable);
    assert_eq!(AccessState::from_code(0xe), AccessState::Other(0xe));
    d[11] = 9; // the first group claims nine ports
    assert!(unit::port_groups(&d).is_err());
    assert!(unit::capacity16(&[0; 11]).is_err());
    let mut c = [0u8; 32];
    c[8..12].copy_from_slice(&1000u32.to_be_bytes());
    assert!(
        unit::capacity16(&c).is_err(),
        "block size not a power of two"
    );
    // MODE SENSE (6): header with DPOFUA, then the caching page with WCE.
    let m = [0x17, 0, 0x10, 0, 0x08, 0x12, 0x04, 0];
    let caching = unit::caching(&m).unwrap();
    assert!(caching.write_cache && caching.fua && !caching.read_only);
    assert!(unit::caching(&[3, 0, 0, 0]).is_err());
}

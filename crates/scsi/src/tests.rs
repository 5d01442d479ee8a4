//! CDBs written out byte by byte, as initiators send them.

use super::cdb::{check_range, Command};
use super::sense::Sense;

fn cdb16(bytes: &[u8]) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[..bytes.len()].copy_from_slice(bytes);
    c
}

#[test]
fn reads_and_writes_of_every_size() {
    // READ(10), FUA, LBA 0x1000, 8 blocks.
    let c = cdb16(&[0x28, 0x08, 0, 0, 0x10, 0, 0, 0, 8, 0]);
    assert_eq!(
        Command::parse(&c),
        Ok(Command::Read {
            lba: 0x1000,
            blocks: 8,
            fua: true
        })
    );
    // WRITE(6): 21-bit LBA, and 0 blocks means 256.
    let c = cdb16(&[0x0a, 0x1f, 0xff, 0xff, 0, 0]);
    assert_eq!(
        Command::parse(&c),
        Ok(Command::Write {
            lba: 0x1f_ffff,
            blocks: 256,
            fua: false
        })
    );
    // READ(12): 32-bit length.
    let c = cdb16(&[0xa8, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0]);
    assert_eq!(
        Command::parse(&c),
        Ok(Command::Read {
            lba: 1,
            blocks: 0x1_0000,
            fua: false
        })
    );
    // WRITE(16): 64-bit LBA.
    let c = [0x8a, 0x08, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0x20, 0, 0];
    assert_eq!(
        Command::parse(&c),
        Ok(Command::Write {
            lba: 1 << 32,
            blocks: 0x20,
            fua: true
        })
    );
    assert!(Command::parse(&c).unwrap().writes());
}

#[test]
fn inquiry_capacity_luns_sync_and_mode_sense() {
    assert_eq!(
        Command::parse(&cdb16(&[0x12, 0, 0, 0, 36, 0])),
        Ok(Command::Inquiry {
            vpd: None,
            alloc: 36
        })
    );
    assert_eq!(
        Command::parse(&cdb16(&[0x12, 1, 0x83, 0x01, 0x00, 0])),
        Ok(Command::Inquiry {
            vpd: Some(0x83),
            alloc: 256
        })
    );
    assert_eq!(Command::parse(&cdb16(&[0x25])), Ok(Command::ReadCapacity10));
    assert_eq!(
        Command::parse(&cdb16(&[
            0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0
        ])),
        Ok(Command::ReadCapacity16 { alloc: 32 })
    );
    assert_eq!(
        Command::parse(&cdb16(&[0x9e, 0x11])),
        Ok(Command::Unsupported { opcode: 0x9e }),
        "another service action"
    );
    assert_eq!(
        Command::parse(&cdb16(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0])),
        Ok(Command::ReportLuns { alloc: 4096 })
    );
    assert_eq!(
        Command::parse(&cdb16(&[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0])),
        Ok(Command::SynchronizeCache { lba: 0, blocks: 0 })
    );
    assert_eq!(
        Command::parse(&cdb16(&[0x5a, 0x08, 0x48, 0, 0, 0, 0, 0, 0xfc, 0])),
        Ok(Command::ModeSense {
            page: 0x08,
            subpage: 0,
            control: 1,
            no_block_descriptors: true,
            alloc: 0xfc,
            ten: true
        })
    );
}

#[test]
fn bad_and_unknown_cdbs_get_sense_not_a_crash() {
    assert_eq!(Command::parse(&[]), Err(Sense::INVALID_FIELD_IN_CDB));
    assert_eq!(
        Command::parse(&[0x28, 0, 0]),
        Err(Sense::INVALID_FIELD_IN_CDB),
        "short"
    );
    assert_eq!(
        Command::parse(&cdb16(&[0x12, 0, 0x83, 0, 36, 0])),
        Err(Sense::INVALID_FIELD_IN_CDB),
        "a page code without EVPD"
    );
    assert_eq!(
        Command::parse(&cdb16(&[0x28, 0x20, 0, 0, 0, 0, 0, 0, 1, 0])),
        Err(Sense::INVALID_FIELD_IN_CDB),
        "RDPROTECT on a unit without protection information"
    );
    assert_eq!(
        Command::parse(&cdb16(&[0xc0])),
        Ok(Command::Unsupported { opcode: 0xc0 })
    );
    for opcode in 0..=255u8 {
        let _ = Command::parse(&cdb16(&[opcode, 0xff, 0xff, 0xff, 0xff, 0xff]));
        let _ = Command::parse(&[opcode]);
    }
}

#[test]
fn ranges_are_checked_without_overflow() {
    assert_eq!(check_range(0, 8, 8), Ok(()));
    assert_eq!(check_range(1, 8, 8), Err(Sense::LBA_OUT_OF_RANGE));
    assert_eq!(
        check_range(u64::MAX, 1, u64::MAX),
        Err(Sense::LBA_OUT_OF_RANGE)
    );
    assert_eq!(check_range(8, 0, 8), Ok(()), "zero blocks at the end");
}

use super::respond::{report_luns, request_sense, Unit, VPD_PAGES};

fn unit() -> Unit {
    Unit {
        blocks: 1 << 33,
        block_size: 512,
        uuid: [
            0x0b, 0x6f, 0x4c, 0x1e, 0x2d, 0x7a, 0x4c, 0x52, 0x9e, 0x1b, 0x7f, 0x3a, 0x5d, 0x9c,
            0x8e, 0x21,
        ],
        read_only: false,
        thin: true,
        zeroes_after_unmap: true,
        rotational: false,
        max_transfer_blocks: 65536,
        relative_port: 2,
        port_group: 2,
        target_port: "iqn.2026-11.org.example:vol,t,0x0002".into(),
        instance: None,
    }
}

#[test]
fn report_target_port_groups_is_parsed_in_both_formats() {
    let c = cdb16(&[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0]);
    assert_eq!(
        Command::parse(&c),
        Ok(Command::ReportTargetPortGroups {
            extended: false,
            alloc: 1024
        })
    );
    let c = cdb16(&[0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0]);
    assert_eq!(
        Command::parse(&c),
        Ok(Command::ReportTargetPortGroups {
            extended: true,
            alloc: 1024
        })
    );
}

#[test]
fn standard_inquiry_says_alua_and_multiport() {
    let d = unit().inquiry(None, 255).unwrap();
    assert_eq!(d.len(), 96);
    assert_eq!(&d[..8], &[0x00, 0x00, 0x06, 0x12, 91, 0x18, 0x10, 0x02]);
    assert_eq!(
        &d[58..66],
        &[0x00, 0xa0, 0x09, 0x60, 0x04, 0x60, 0x04, 0xc0]
    );
    assert_eq!(&d[8..16], b"BRAID   ");
    // Cut to the allocation length, never padded.
    assert_eq!(unit().inquiry(None, 5).unwrap().len(), 5);
}

#[test]
fn vpd_pages_list_serial_and_designators() {
    let u = unit();
    let d = u.inquiry(Some(0x00), 255).unwrap();
    assert_eq!(&d[..4], &[0, 0, 0, 8]);
    assert_eq!(&d[4..], &VPD_PAGES);
    assert_eq!(
        u.inquiry(Some(0xc0), 255),
        Err(Sense::INVALID_FIELD_IN_CDB),
        "no instance, no page"
    );
    // With the target's instance: page 0xC0, listed last.
    let braid = Unit {
        instance: Some(0xfeed),
        ..unit()
    };
    let d = braid.inquiry(Some(0x00), 255).unwrap();
    assert_eq!(&d[..4], &[0, 0, 0, 9]);
    assert_eq!(d[4..12], VPD_PAGES);
    assert_eq!(d[12], 0xc0);
    let d = braid.inquiry(Some(0xc0), 255).unwrap();
    assert_eq!(&d[..12], b"\x00\xc0\x00\x18braid   ");
    assert_eq!(super::decode_instance_page(&d), Some(0xfeed));

    let d = u.inquiry(Some(0x80), 255).unwrap();
    assert_eq!(&d[4..], b"0b6f4c1e2d7a4c529e1b7f3a5d9c8e21");

    let d = u.inquiry(Some(0x83), 255).unwrap();
    let len = usize::from(u16::from_be_bytes([d[2], d[3]]));
    assert_eq!(d.len(), 4 + len);
    // NAA IEEE Registered Extended first: 6, company B2A1D0, then the
    // first 25 hex digits of the identity.
    assert_eq!(&d[4..8], &[0x01, 0x03, 0, 16]);
    assert_eq!(
        &d[8..24],
        &[
            0x6b, 0x2a, 0x1d, 0x00, 0xb6, 0xf4, 0xc1, 0xe2, 0xd7, 0xa4, 0xc5, 0x29, 0xe1, 0xb7,
            0xf3, 0xa5
        ]
    );
    // T10 vendor ID: vendor and serial, ASCII.
    assert_eq!(&d[24..28], &[0x02, 0x01, 0, 40]);
    assert_eq!(&d[28..68], b"BRAID   0b6f4c1e2d7a4c529e1b7f3a5d9c8e21");
    // Then this port: relative port 2, port group 2, and its name.
    assert_eq!(
        &d[68..84],
        &[0x51, 0x94, 0, 4, 0, 0, 0, 2, 0x51, 0x95, 0, 4, 0, 0, 0, 2]
    );
    assert_eq!(&d[84..88], &[0x53, 0x98, 0, 40]);
    assert_eq!(&d[88..128], b"iqn.2026-11.org.example:vol,t,0x0002\0\0\0\0");
    assert_eq!(d.len(), 128);
    let other_port = Unit {
        relative_port: 3,
        port_group: 3,
        target_port: "iqn.2026-11.org.example:vol,t,0x0003".into(),
        ..unit()
    };
    let d2 = other_port.inquiry(Some(0x83), 255).unwrap();
    assert_eq!(
        d[..68],
        d2[..68],
        "the unit's names are the same on every port"
    );
    assert_ne!(d[68..], d2[68..], "the port's are its own");

    let ext = u.inquiry(Some(0x86), 255).unwrap();
    assert_eq!(&ext[..8], &[0, 0x86, 0, 0x3c, 0, 0x01, 0x01, 0x01]);
    assert_eq!(ext.len(), 64);

    let lbp = u.inquiry(Some(0xb2), 255).unwrap();
    assert_eq!(&lbp[..], &[0, 0xb2, 0, 4, 0, 0xe4, 2, 0]);
    let limits = u.inquiry(Some(0xb0), 255).unwrap();
    assert_eq!(
        &limits[8..12],
        &65536u32.to_be_bytes(),
        "maximum transfer length"
    );
    assert_eq!(u.inquiry(Some(0xc0), 255), Err(Sense::INVALID_FIELD_IN_CDB));
}

#[test]
fn capacity_luns_mode_pages_and_sense() {
    let u = unit();
    assert_eq!(
        u.read_capacity10(),
        [0xff, 0xff, 0xff, 0xff, 0, 0, 2, 0],
        "too big for (10)"
    );
    let d = u.read_capacity16(32);
    assert_eq!(&d[..12], &[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0, 0, 2, 0]);
    assert_eq!(d[14], 0xc0, "LBPME and LBPRZ");
    let small = Unit {
        blocks: 2048,
        ..unit()
    };
    assert_eq!(small.read_capacity10(), [0, 0, 0x07, 0xff, 0, 0, 2, 0]);

    assert_eq!(
        report_luns(&[0], 4096),
        [0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );

    // MODE SENSE(6), caching page, no block descriptors: WCE set.
    let d = u.mode_sense(0x08, 0, 0, true, false, 255, true).unwrap();
    assert_eq!(&d[..4], &[23, 0, 0x10, 0]);
    assert_eq!(&d[4..7], &[0x08, 0x12, 0x04]);
    // MODE SENSE(10), all pages, with a block descriptor.
    let d = u.mode_sense(0x3f, 0, 0, false, true, 1024, true).unwrap();
    assert_eq!(u16::from_be_bytes([d[0], d[1]]) as usize, d.len() - 2);
    assert_eq!(&d[6..8], &[0, 8], "block descriptor length");
    assert_eq!(&d[8..16], &[0xff, 0xff, 0xff, 0xff, 0, 0, 2, 0]);
    assert_eq!(d[16], 0x08);
    assert_eq!(d[36], 0x0a);
    // Changeable values: WCE alone; with the cache turned off, the current
    // page says so and the default page does not.
    let d = u.mode_sense(0x08, 0, 1, true, false, 255, true).unwrap();
    assert_eq!(d[6], 0x04);
    assert_eq!(
        u.mode_sense(0x08, 0, 0, true, false, 255, false).unwrap()[6],
        0
    );
    assert_eq!(
        u.mode_sense(0x08, 0, 2, true, false, 255, false).unwrap()[6],
        0x04
    );
    assert!(
        u.mode_sense(0x08, 0, 3, true, false, 255, true).is_err(),
        "saved values"
    );
    assert_eq!(
        u.mode_sense(0x19, 0, 0, true, false, 255, true),
        Err(Sense::INVALID_FIELD_IN_CDB)
    );

    assert_eq!(request_sense(None, 18)[2], 0, "NO SENSE");
    assert_eq!(request_sense(Some(Sense::LBA_OUT_OF_RANGE), 18)[12], 0x21);
}

#[test]
fn unmap_write_same_and_lba_status() {
    use super::cdb::{unmap_ranges, UnmapRange};
    assert_eq!(
        Command::parse(&cdb16(&[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0])),
        Ok(Command::Unmap { param_len: 24 })
    );
    assert_eq!(
        Command::parse(&cdb16(&[0x42, 1, 0, 0, 0, 0, 0, 0, 24, 0])),
        Err(Sense::INVALID_FIELD_IN_CDB),
        "ANCHOR"
    );
    let mut params = vec![0, 22, 0, 16, 0, 0, 0, 0];
    params.extend_from_slice(&77u64.to_be_bytes());
    params.extend_from_slice(&8u32.to_be_bytes());
    params.extend_from_slice(&[0; 4]);
    assert_eq!(
        unmap_ranges(&params, 256),
        Ok(vec![UnmapRange { lba: 77, blocks: 8 }])
    );
    assert_eq!(
        unmap_ranges(&params[..20], 256),
        Err(Sense::PARAMETER_LIST_LENGTH)
    );
    assert_eq!(unmap_ranges(&params, 0), Err(Sense::INVALID_FIELD_IN_CDB));
    assert_eq!(unmap_ranges(&[], 256), Ok(vec![]));

    let ws16 = [0x93, 0x09, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 4, 0, 0];
    let cmd = Command::parse(&ws16).unwrap();
    assert_eq!(
        cmd,
        Command::WriteSame {
            lba: 5,
            blocks: 4,
            unmap: true,
            no_data: true
        }
    );
    assert_eq!(cmd.data_out_len(512), None, "NDOB: no data");
    let ws10 = cdb16(&[0x41, 0, 0, 0, 0, 9, 0, 0, 2, 0]);
    let cmd = Command::parse(&ws10).unwrap();
    assert_eq!(cmd.data_out_len(512), Some(512), "one block");
    assert!(
        Command::parse(&cdb16(&[0x41, 0x10, 0, 0, 0, 9, 0, 0, 2, 0])).is_err(),
        "ANCHOR"
    );

    let c = cdb16(&[0x9e, 0x12, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 32, 0, 0]);
    assert_eq!(
        Command::parse(&c),
        Ok(Command::GetLbaStatus { lba: 7, alloc: 32 })
    );
    let d = super::respond::lba_status(&[(0, 8, false), (8, 24, true)], 1024);
    assert_eq!(&d[..8], &[0, 0, 0, 36, 0, 0, 0, 0]);
    assert_eq!(
        &d[8 + 16..8 + 32],
        &[0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 24, 1, 0, 0, 0]
    );
}

#[test]
fn mode_select_changes_the_write_cache_and_nothing_else() {
    use super::respond::mode_select;
    let u = unit();
    let bad = Sense::new(super::Key::IllegalRequest, 0x26, 0x00);
    // What MODE SENSE(10) shows, sent back as it is: no change.
    let mut sensed = u.mode_sense(0x3f, 0, 0, false, true, 1024, true).unwrap();
    sensed[0] = 0;
    sensed[1] = 0;
    assert_eq!(mode_select(&u, &sensed, true, true), Ok(true));
    // The caching page with WCE cleared, in a MODE SELECT(6) list.
    let mut six = vec![0, 0, 0, 0];
    let mut caching = u.mode_sense(0x08, 0, 0, true, false, 255, true).unwrap()[4..].to_vec();
    caching[2] = 0;
    six.extend_from_slice(&caching);
    assert_eq!(mode_select(&u, &six, false, true), Ok(false));
    // Anything else changed is refused, and so is a page braid lacks.
    let mut other = six.clone();
    other[4 + 2] = 0x01; // RCD
    assert_eq!(mode_select(&u, &other, false, true), Err(bad));
    let mut control = vec![0, 0, 0, 0];
    control.extend_from_slice(&u.mode_sense(0x0a, 0, 0, true, false, 255, true).unwrap()[4..]);
    assert_eq!(mode_select(&u, &control, false, false), Ok(false));
    control[4 + 3] = 0; // QAM 0
    assert_eq!(mode_select(&u, &control, false, true), Err(bad));
    assert_eq!(
        mode_select(&u, &[0, 0, 0, 0, 0x19, 2, 0, 0], false, true),
        Err(bad)
    );
    // A block descriptor with another block size; lists cut short.
    let mut desc = vec![0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x10, 0];
    assert_eq!(mode_select(&u, &desc, false, true), Err(bad));
    desc[10] = 0x02;
    assert_eq!(mode_select(&u, &desc, false, true), Ok(true));
    assert_eq!(
        mode_select(&u, &six[..10], false, true),
        Err(Sense::PARAMETER_LIST_LENGTH)
    );
    assert_eq!(
        mode_select(&u, &[0, 0], false, true),
        Err(Sense::PARAMETER_LIST_LENGTH)
    );
}

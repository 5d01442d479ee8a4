//! What a block target answers the commands that describe it: INQUIRY
//! (standard data and the VPD pages initiators read to recognise one device
//! behind many paths), READ CAPACITY, REPORT LUNS, MODE SENSE and REQUEST
//! SENSE. Answers are cut to the initiator's allocation length, as SPC
//! asks, never padded.

use super::sense::Sense;

/// The logical unit as its answers describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    /// Logical blocks, and bytes in each.
    pub blocks: u64,
    pub block_size: u32,
    /// The volume's identity (braid's `x-braid:volume`): every portal of
    /// every host serving this volume answers the same designators, which
    /// is what makes initiators see one device with many paths.
    pub uuid: [u8; 16],
    pub read_only: bool,
    /// Holes can be punched (UNMAP, WRITE SAME with UNMAP).
    pub thin: bool,
    /// Unmapped blocks read as zeroes.
    pub zeroes_after_unmap: bool,
    pub rotational: bool,
    /// Most blocks one READ or WRITE may move.
    pub max_transfer_blocks: u32,
    /// The relative port and target port group of the portal asked.
    pub relative_port: u16,
    pub port_group: u16,
    /// Relative port ids of every portal serving the unit (one group,
    /// every port active/optimized: braid uses all paths at once).
    pub ports: Vec<u16>,
}

const VENDOR: &[u8; 8] = b"BRAID   ";
const PRODUCT: &[u8; 16] = b"multipath volume";
const REVISION: &[u8; 4] = b"0001";

/// VPD pages this unit answers, in the order page 0x00 lists them.
pub const VPD_PAGES: [u8; 6] = [0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2];

fn cut(mut data: Vec<u8>, alloc: usize) -> Vec<u8> {
    data.truncate(alloc);
    data
}

impl Unit {
    /// Standard INQUIRY data, or a VPD page.
    ///
    /// # Errors
    ///
    /// INVALID FIELD IN CDB for a VPD page not in [`VPD_PAGES`].
    pub fn inquiry(&self, vpd: Option<u8>, alloc: u16) -> Result<Vec<u8>, Sense> {
        let data = match vpd {
            None => self.standard_inquiry(),
            Some(0x00) => page(0x00, VPD_PAGES.to_vec()),
            Some(0x80) => page(0x80, self.serial().into_bytes()),
            Some(0x83) => page(0x83, self.designators()),
            Some(0xb0) => page(0xb0, self.block_limits()),
            Some(0xb1) => {
                let mut p = vec![0u8; 0x3c];
                // Medium rotation rate: 1 means not rotating.
                let rate: u16 = if self.rotational { 0 } else { 1 };
                p[0..2].copy_from_slice(&rate.to_be_bytes());
                page(0xb1, p)
            }
            Some(0xb2) => {
                let mut p = vec![0u8; 4];
                if self.thin {
                    // LBPU (UNMAP), LBPWS (WRITE SAME 16 with UNMAP), LBPWS10.
                    p[1] = 0x80 | 0x40 | 0x20;
                    if self.zeroes_after_unmap {
                        p[1] |= 0x04; // LBPRZ
                    }
                    p[2] = 2; // thin provisioned
                }
                page(0xb2, p)
            }
            Some(_) => return Err(Sense::INVALID_FIELD_IN_CDB),
        };
        Ok(cut(data, usize::from(alloc)))
    }

    fn standard_inquiry(&self) -> Vec<u8> {
        let mut d = vec![0u8; 96];
        d[0] = 0x00; // connected, direct-access block device
        d[2] = 0x06; // SPC-4
        d[3] = 0x12; // HiSup, response data format 2
        d[4] = 91; // additional length
        d[5] = 0x10; // TPGS: implicit asymmetric access (ALUA)
        d[6] = 0x10; // MULTIP: more than one port
        d[7] = 0x02; // CMDQUE
        d[8..16].copy_from_slice(VENDOR);
        d[16..32].copy_from_slice(PRODUCT);
        d[32..36].copy_from_slice(REVISION);
        // Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
        for (i, v) in [0x00a0u16, 0x0960, 0x0460, 0x04c0].iter().enumerate() {
            d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
        }
        d
    }

    /// The unit serial number: the volume identity in hex.
    pub fn serial(&self) -> String {
        self.uuid.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Device identification designators: the unit's NAA and T10 names
    /// (the same on every port), then this port's relative port and port
    /// group (different per portal).
    fn designators(&self) -> Vec<u8> {
        let mut d = Vec::new();
        // NAA locally assigned (type 3): eight bytes, first nibble 3,
        // then 60 bits of the volume identity.
        let mut naa = [0u8; 8];
        naa.copy_from_slice(&self.uuid[..8]);
        naa[0] = 0x30 | (naa[0] & 0x0f);
        designator(&mut d, 0x01, 0x03, &naa);
        // T10 vendor ID: vendor, then the serial.
        let mut t10 = VENDOR.to_vec();
        t10.extend_from_slice(self.serial().as_bytes());
        designator(&mut d, 0x02, 0x01, &t10);
        // Target port association, iSCSI protocol, PIV set.
        designator(
            &mut d,
            0x51,
            0x94,
            &u32::from(self.relative_port).to_be_bytes(),
        );
        designator(
            &mut d,
            0x51,
            0x95,
            &u32::from(self.port_group).to_be_bytes(),
        );
        d
    }

    fn block_limits(&self) -> Vec<u8> {
        let mut p = vec![0u8; 0x3c];
        p[0] = 0x01; // WSNZ: WRITE SAME must name how many blocks
        p[1] = 1; // maximum COMPARE AND WRITE length, in blocks
        p[4..8].copy_from_slice(&self.max_transfer_blocks.to_be_bytes());
        p[8..12].copy_from_slice(&self.max_transfer_blocks.to_be_bytes());
        if self.thin {
            p[16..20].copy_from_slice(&self.max_transfer_blocks.to_be_bytes()); // unmap LBA count
            p[20..24].copy_from_slice(&256u32.to_be_bytes()); // unmap descriptors
            p[24..28].copy_from_slice(&1u32.to_be_bytes()); // unmap granularity
        }
        p[32..40].copy_from_slice(&u64::from(self.max_transfer_blocks).to_be_bytes()); // write same
        p
    }

    /// READ CAPACITY (10): the last block's address (all ones when it does
    /// not fit, telling the initiator to ask with (16)), and the block size.
    pub fn read_capacity10(&self) -> Vec<u8> {
        let last = self.blocks.saturating_sub(1);
        let last = u32::try_from(last).unwrap_or(u32::MAX);
        let mut d = last.to_be_bytes().to_vec();
        d.extend_from_slice(&self.block_size.to_be_bytes());
        d
    }

    /// READ CAPACITY (16), with logical block provisioning (LBPME, LBPRZ).
    pub fn read_capacity16(&self, alloc: u32) -> Vec<u8> {
        let mut d = vec![0u8; 32];
        d[0..8].copy_from_slice(&self.blocks.saturating_sub(1).to_be_bytes());
        d[8..12].copy_from_slice(&self.block_size.to_be_bytes());
        if self.thin {
            d[14] = 0x80 | if self.zeroes_after_unmap { 0x40 } else { 0 };
        }
        cut(d, alloc as usize)
    }

    /// MODE SENSE (6) or (10): the caching page (write cache on: a FLUSH or
    /// SYNCHRONIZE CACHE is what makes writes durable) and the control page.
    ///
    /// # Errors
    ///
    /// INVALID FIELD IN CDB for another page or a subpage; SAVING
    /// PARAMETERS NOT SUPPORTED for saved values.
    pub fn mode_sense(
        &self,
        page: u8,
        subpage: u8,
        control: u8,
        no_block_descriptors: bool,
        ten: bool,
        alloc: u16,
    ) -> Result<Vec<u8>, Sense> {
        if control == 3 {
            return Err(Sense::new(super::sense::Key::IllegalRequest, 0x39, 0x00));
        }
        if subpage != 0 && subpage != 0xff {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
        let changeable = control == 1;
        let mut pages = Vec::new();
        if matches!(page, 0x08 | 0x3f) {
            let mut p = vec![0u8; 20];
            p[0] = 0x08;
            p[1] = 0x12;
            if !changeable {
                p[2] = 0x04; // WCE
            }
            pages.extend(p);
        }
        if matches!(page, 0x0a | 0x3f) {
            let mut p = vec![0u8; 12];
            p[0] = 0x0a;
            p[1] = 0x0a;
            pages.extend(p);
        }
        if pages.is_empty() {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
        let mut desc = Vec::new();
        if !no_block_descriptors {
            let blocks = u32::try_from(self.blocks).unwrap_or(u32::MAX);
            desc.extend_from_slice(&blocks.to_be_bytes());
            desc.push(0);
            desc.extend_from_slice(&self.block_size.to_be_bytes()[1..]);
        }
        // DPOFUA: the unit honours FUA.
        let specific = 0x10 | if self.read_only { 0x80 } else { 0 };
        let mut d = Vec::new();
        if ten {
            let len = (6 + desc.len() + pages.len()) as u16;
            d.extend_from_slice(&len.to_be_bytes());
            d.extend_from_slice(&[0, specific, 0, 0]);
            d.extend_from_slice(&(desc.len() as u16).to_be_bytes());
        } else {
            d.push((3 + desc.len() + pages.len()) as u8);
            d.extend_from_slice(&[0, specific, desc.len() as u8]);
        }
        d.extend(desc);
        d.extend(pages);
        Ok(cut(d, usize::from(alloc)))
    }
}

impl Unit {
    /// REPORT TARGET PORT GROUPS: one group holding every port, in the
    /// active/optimized state, which is the only state it supports (so
    /// implicit ALUA initiators use every path and never wait for a
    /// transition).
    pub fn report_target_port_groups(&self, extended: bool, alloc: u32) -> Vec<u8> {
        let mut desc = vec![
            0x80, // PREF, asymmetric access state 0: active/optimized
            0x01, // AO_SUP only
        ];
        desc.extend_from_slice(&self.port_group.to_be_bytes());
        desc.extend_from_slice(&[0, 0, 0]); // reserved, status code, vendor
        desc.push(u8::try_from(self.ports.len()).unwrap_or(u8::MAX));
        for &p in self.ports.iter().take(255) {
            desc.extend_from_slice(&[0, 0]);
            desc.extend_from_slice(&p.to_be_bytes());
        }
        let header = if extended { 8 } else { 4 };
        let mut d = ((header - 4 + desc.len()) as u32).to_be_bytes().to_vec();
        if extended {
            // Format type 1; implicit transition time 0: there are none.
            d.extend_from_slice(&[0x10, 0, 0, 0]);
        }
        d.extend(desc);
        cut(d, alloc as usize)
    }
}

/// A VPD page: device type, page code, length, body.
fn page(code: u8, body: Vec<u8>) -> Vec<u8> {
    let mut d = vec![0x00, code];
    d.extend_from_slice(&(body.len() as u16).to_be_bytes());
    d.extend(body);
    d
}

/// One designation descriptor: protocol and code set, PIV, association
/// and type, then the designator.
fn designator(out: &mut Vec<u8>, proto_codeset: u8, piv_assoc_type: u8, value: &[u8]) {
    out.extend_from_slice(&[proto_codeset, piv_assoc_type, 0, value.len() as u8]);
    out.extend_from_slice(value);
}

/// REPORT LUNS: the list length, then eight bytes per LUN (single-level,
/// peripheral addressing, which is LUN 0's all-zero entry).
pub fn report_luns(luns: &[u16], alloc: u32) -> Vec<u8> {
    let mut d = ((luns.len() * 8) as u32).to_be_bytes().to_vec();
    d.extend_from_slice(&[0; 4]);
    for &lun in luns {
        let mut e = [0u8; 8];
        e[0..2].copy_from_slice(&(lun & 0x3fff).to_be_bytes());
        d.extend_from_slice(&e);
    }
    cut(d, alloc as usize)
}

/// GET LBA STATUS: one descriptor per run, `(lba, blocks, deallocated)`.
pub fn lba_status(runs: &[(u64, u32, bool)], alloc: u32) -> Vec<u8> {
    let mut d = ((4 + 16 * runs.len()) as u32).to_be_bytes().to_vec();
    d.extend_from_slice(&[0; 4]);
    for &(lba, blocks, hole) in runs {
        d.extend_from_slice(&lba.to_be_bytes());
        d.extend_from_slice(&blocks.to_be_bytes());
        d.push(u8::from(hole)); // provisioning status: 1 deallocated
        d.extend_from_slice(&[0; 3]);
    }
    cut(d, alloc as usize)
}

/// REQUEST SENSE: the pending sense, or NO SENSE.
pub fn request_sense(pending: Option<Sense>, alloc: u8) -> Vec<u8> {
    let d = match pending {
        Some(s) => s.fixed().to_vec(),
        None => {
            let mut s = [0u8; 18];
            s[0] = 0x70;
            s[7] = 10;
            s.to_vec()
        }
    };
    cut(d, usize::from(alloc))
}

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
    /// The relative port and target port group of the portal asked
    /// (each portal is its own group).
    pub relative_port: u16,
    pub port_group: u16,
    /// The SCSI target port's name, `<target>,t,0x<portal group tag>`
    /// (iSCSI's form, RFC 7143 "iSCSI Names").
    pub target_port: String,
    /// The target process's instance, answered in VPD page 0xC0
    /// ([`super::instance`]); `None` leaves the page out.
    pub instance: Option<u128>,
}

const VENDOR: &[u8; 8] = b"BRAID   ";
const PRODUCT: &[u8; 16] = b"multipath volume";
const REVISION: &[u8; 4] = b"0001";

/// Most blocks one COMPARE AND WRITE may cover (VMware's ATS uses one).
pub const MAX_COMPARE_AND_WRITE_BLOCKS: u32 = 1;

/// VPD pages every unit answers, in the order page 0x00 lists them; a
/// unit with an instance adds braid's page 0xC0 after them.
pub const VPD_PAGES: [u8; 8] = [0x00, 0x80, 0x83, 0x86, 0x8f, 0xb0, 0xb1, 0xb2];

/// The IEEE COMPANY_ID field of braid's NAA designators.
///
/// NAA type 6 (IEEE Registered Extended) is the designator Linux (its
/// kernel's `wwid` and udev's `scsi_id`), Windows' MSDSM and VMware rank
/// first among a unit's names, but its 24-bit company field is meant for
/// an identifier the IEEE assigned, which braid does not have. LIO fills
/// it with the OpenFabrics Alliance's OUI (00-14-05) and tgt with zeroes
/// (00-00-00, an OUI assigned to Xerox); both claim a number that belongs
/// to someone else. braid's value is taken from the one part of the
/// 24-bit space the IEEE never assigns: B2 has the local bit set and the
/// Y and Z bits clear, which IEEE 802c (the structured local address
/// plan) reserves for local administrators, while every OUI has the local
/// bit clear and every CID sits in the extended-local quadrant (second
/// digit A). So no vendor's NAA 6 name can equal a braid one, and the 100
/// bits that follow come from the volume identity.
pub const NAA_COMPANY_ID: u32 = 0x00b2_a1d0;

fn cut(mut data: Vec<u8>, alloc: usize) -> Vec<u8> {
    data.truncate(alloc);
    data
}

impl Unit {
    /// Standard INQUIRY data, or a VPD page.
    ///
    /// # Errors
    ///
    /// INVALID FIELD IN CDB for a VPD page this unit does not answer.
    pub fn inquiry(&self, vpd: Option<u8>, alloc: u16) -> Result<Vec<u8>, Sense> {
        use super::instance::{instance_body, INSTANCE_PAGE};
        let data = match vpd {
            None => self.standard_inquiry(),
            Some(0x00) => {
                let mut pages = VPD_PAGES.to_vec();
                if self.instance.is_some() {
                    pages.push(INSTANCE_PAGE);
                }
                page(0x00, pages)
            }
            Some(INSTANCE_PAGE) => match self.instance {
                Some(i) => page(INSTANCE_PAGE, instance_body(i)),
                None => return Err(Sense::INVALID_FIELD_IN_CDB),
            },
            Some(0x80) => page(0x80, self.serial().into_bytes()),
            Some(0x83) => page(0x83, self.designators()),
            Some(0x86) => page(0x86, self.extended_inquiry()),
            Some(0x8f) => page(0x8f, super::xcopy::third_party_copy_page()),
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
                   // TPGS: implicit asymmetric access (ALUA); 3PC: third-party copy
                   // (EXTENDED COPY, POPULATE TOKEN and WRITE USING TOKEN).
        d[5] = 0x10 | 0x08;
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

    /// The unit's NAA IEEE Registered Extended name: NAA 6, the
    /// [`NAA_COMPANY_ID`], then the first 25 hex digits of the volume
    /// identity, so `naa.6b2a1d0` followed by the start of the volume id
    /// that `braid status` shows.
    pub fn naa(&self) -> [u8; 16] {
        let mut nibbles = vec![6u8];
        nibbles.extend(
            (0..6)
                .rev()
                .map(|i| ((NAA_COMPANY_ID >> (4 * i)) & 0xf) as u8),
        );
        nibbles.extend(self.uuid.iter().flat_map(|b| [b >> 4, b & 0xf]).take(25));
        let mut naa = [0u8; 16];
        for (i, pair) in nibbles.chunks_exact(2).enumerate() {
            naa[i] = (pair[0] << 4) | pair[1];
        }
        naa
    }

    /// Device identification designators (SPC-5 7.7.6): the unit's names,
    /// the same through every port (NAA, then T10 vendor ID), then this
    /// port's relative port, port group and name (association 1, iSCSI).
    ///
    /// No SCSI name string is associated with the unit itself: Linux's
    /// kernel and Windows' MSDSM rank that type above NAA and would name
    /// the device after it, and a name string naming a target differs
    /// between targets that serve the same volume.
    fn designators(&self) -> Vec<u8> {
        let mut d = Vec::new();
        designator(&mut d, 0x01, 0x03, &self.naa());
        let mut t10 = VENDOR.to_vec();
        t10.extend_from_slice(self.serial().as_bytes());
        designator(&mut d, 0x02, 0x01, &t10);
        // Association 1 (target port), protocol 5 (iSCSI), PIV set.
        let port = [
            0,
            0,
            (self.relative_port >> 8) as u8,
            self.relative_port as u8,
        ];
        designator(&mut d, 0x51, 0x94, &port);
        let group = [0, 0, (self.port_group >> 8) as u8, self.port_group as u8];
        designator(&mut d, 0x51, 0x95, &group);
        // The port's name as UTF-8, null-terminated, padded to four bytes.
        let mut name = self.target_port.as_bytes().to_vec();
        name.truncate(251);
        name.push(0);
        name.resize(name.len().div_ceil(4) * 4, 0);
        designator(&mut d, 0x53, 0x98, &name);
        d
    }

    /// Extended INQUIRY Data (SPC-5 7.7.9): simple task attributes, a
    /// volatile write cache (SYNCHRONIZE CACHE makes writes durable), and
    /// unit attentions cleared per I_T nexus (LUICLR).
    fn extended_inquiry(&self) -> Vec<u8> {
        let mut p = vec![0u8; 0x3c];
        p[1] = 0x01; // SIMPSUP
        p[2] = 0x01; // V_SUP
        p[3] = 0x01; // LUICLR
        p
    }

    fn block_limits(&self) -> Vec<u8> {
        let mut p = vec![0u8; 0x3c];
        // WSNZ 0: a WRITE SAME of 0 blocks reaches the end of the medium
        // (refused when that is more than the most one may write).
        p[1] = MAX_COMPARE_AND_WRITE_BLOCKS as u8;
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

    /// MODE SENSE (6) or (10): the caching page (write cache on unless an
    /// initiator turned it off with MODE SELECT: then every write goes
    /// through to the medium) and the control page.
    ///
    /// # Errors
    ///
    /// INVALID FIELD IN CDB for another page or a subpage; SAVING
    /// PARAMETERS NOT SUPPORTED for saved values.
    #[allow(clippy::too_many_arguments)]
    pub fn mode_sense(
        &self,
        page: u8,
        subpage: u8,
        control: u8,
        no_block_descriptors: bool,
        ten: bool,
        alloc: u16,
        write_cache: bool,
    ) -> Result<Vec<u8>, Sense> {
        if control == 3 {
            return Err(Sense::new(super::sense::Key::IllegalRequest, 0x39, 0x00));
        }
        if subpage != 0 && subpage != 0xff {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
        // Page control 2 (defaults) shows the cache on, as a restart
        // leaves it.
        let wce = match control {
            0 => write_cache,
            _ => true,
        };
        let mut pages = Vec::new();
        if matches!(page, 0x08 | 0x3f) {
            pages.extend(caching_page(control, wce));
        }
        if matches!(page, 0x0a | 0x3f) {
            pages.extend(control_page(control));
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

/// The caching mode page; with page control 1 (changeable), the mask of
/// what MODE SELECT may change: WCE alone.
fn caching_page(control: u8, wce: bool) -> [u8; 20] {
    let mut p = [0u8; 20];
    p[0] = 0x08;
    p[1] = 0x12;
    if control == 1 || wce {
        p[2] = 0x04;
    }
    p
}

/// The control mode page: nothing in it can be changed.
fn control_page(control: u8) -> [u8; 12] {
    let mut p = [0u8; 12];
    p[0] = 0x0a;
    p[1] = 0x0a;
    if control != 1 {
        // QUEUE ALGORITHM MODIFIER 1: SIMPLE tasks run in any order (they
        // do: commands of a connection run together). TST 0 (one task set
        // for every nexus) and TAS 0 (tasks another nexus ends go without
        // a response) stay 0.
        p[3] = 0x10;
    }
    p
}

const INVALID_FIELD_IN_PARAMETERS: Sense =
    Sense::new(super::sense::Key::IllegalRequest, 0x26, 0x00);

/// A MODE SELECT (6) or (10) parameter list, checked against the unit:
/// block descriptors may only restate the block size (and the block
/// count, or 0), pages only the current values except what is
/// changeable. Returns the write cache setting it asks for.
///
/// # Errors
///
/// PARAMETER LIST LENGTH ERROR for a list cut short, INVALID FIELD IN
/// PARAMETER LIST for a value that cannot be changed or a page the unit
/// does not have.
pub fn mode_select(
    unit: &Unit,
    params: &[u8],
    ten: bool,
    write_cache: bool,
) -> Result<bool, Sense> {
    let header = if ten { 8 } else { 4 };
    if params.is_empty() {
        return Ok(write_cache);
    }
    if params.len() < header {
        return Err(Sense::PARAMETER_LIST_LENGTH);
    }
    let desc_len = if ten {
        usize::from(u16::from_be_bytes([params[6], params[7]]))
    } else {
        usize::from(params[3])
    };
    if ten && params[4] & 0x01 != 0 {
        // LONGLBA descriptors are not offered.
        return Err(INVALID_FIELD_IN_PARAMETERS);
    }
    let pages_at = header + desc_len;
    if desc_len % 8 != 0 || pages_at > params.len() {
        return Err(Sense::PARAMETER_LIST_LENGTH);
    }
    for d in params[header..pages_at].chunks_exact(8) {
        let blocks = u64::from(u32::from_be_bytes([d[0], d[1], d[2], d[3]]));
        let size = u32::from_be_bytes([0, d[5], d[6], d[7]]);
        if size != unit.block_size
            || (blocks != 0 && blocks != unit.blocks.min(u64::from(u32::MAX)))
        {
            return Err(INVALID_FIELD_IN_PARAMETERS);
        }
    }
    let mut wce = write_cache;
    let mut rest = &params[pages_at..];
    while !rest.is_empty() {
        if rest.len() < 2 {
            return Err(Sense::PARAMETER_LIST_LENGTH);
        }
        let (code, len) = (rest[0] & 0x3f, usize::from(rest[1]) + 2);
        if rest[0] & 0x40 != 0 {
            return Err(INVALID_FIELD_IN_PARAMETERS);
        }
        if rest.len() < len {
            return Err(Sense::PARAMETER_LIST_LENGTH);
        }
        let (page, changeable): (Vec<u8>, Vec<u8>) = match code {
            0x08 => (caching_page(0, wce).into(), caching_page(1, false).into()),
            0x0a => (control_page(0).into(), control_page(1).into()),
            _ => return Err(INVALID_FIELD_IN_PARAMETERS),
        };
        if len != page.len() {
            return Err(INVALID_FIELD_IN_PARAMETERS);
        }
        // The PS bit (byte 0, bit 7) is reserved in MODE SELECT.
        let given = &rest[..len];
        let fixed = (2..len).all(|i| (given[i] ^ page[i]) & !changeable[i] == 0);
        if !fixed {
            return Err(INVALID_FIELD_IN_PARAMETERS);
        }
        if code == 0x08 {
            wce = given[2] & 0x04 != 0;
        }
        rest = &rest[len..];
    }
    Ok(wce)
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

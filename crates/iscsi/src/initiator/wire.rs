//! A PDU as the pieces a vectored write sends, so that data is never
//! copied on its way out: the header (BHS, AHS and header digest), the
//! data as it is, and a tail of padding and data digest.

use bytes::Bytes;

use crate::digest::{self, DIGEST_LEN};
use crate::pdu::{padded, Pdu};
use crate::Digests;

/// The three pieces of one PDU on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parts {
    pub head: Vec<u8>,
    pub data: Bytes,
    tail: [u8; 3 + DIGEST_LEN],
    tail_len: usize,
}

impl Parts {
    /// Padding to four bytes, then the data digest if negotiated.
    pub fn tail(&self) -> &[u8] {
        &self.tail[..self.tail_len]
    }

    pub fn len(&self) -> usize {
        self.head.len() + self.data.len() + self.tail_len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Cuts `pdu` into [`Parts`]; the bytes are those [`Pdu::encode`] writes.
///
/// # Panics
///
/// As [`Pdu::encode`]: an AHS that is not whole words, or 16 MiB of data.
pub fn parts(pdu: &Pdu, digests: Digests) -> Parts {
    let header_only = Pdu {
        bhs: pdu.bhs,
        ahs: pdu.ahs.clone(),
        data: Bytes::new(),
    };
    let mut head = Vec::with_capacity(crate::BHS_LEN + pdu.ahs.len() + DIGEST_LEN);
    header_only.encode(digests, &mut head);
    // The data segment length, which `encode` took from the empty data.
    head[5..8].copy_from_slice(&(pdu.data.len() as u32).to_be_bytes()[1..]);
    if digests.header {
        let at = head.len() - DIGEST_LEN;
        let d = digest::wire(&head[..at]);
        head[at..].copy_from_slice(&d);
    }
    let mut tail = [0u8; 3 + DIGEST_LEN];
    let pad = padded(pdu.data.len()) - pdu.data.len();
    let mut tail_len = pad;
    if digests.data && !pdu.data.is_empty() {
        let crc = crc32c::crc32c_append(digest::crc32c(&pdu.data), &tail[..pad]);
        tail[pad..pad + DIGEST_LEN].copy_from_slice(&crc.to_le_bytes());
        tail_len += DIGEST_LEN;
    }
    Parts {
        head,
        data: pdu.data.clone(),
        tail,
        tail_len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::{Bhs, Opcode};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn the_parts_are_what_encode_writes(
            len in 0usize..64,
            header: bool,
            data_digest: bool,
            ahs_words in 0usize..3,
        ) {
            let mut bhs = Bhs::new(Opcode::DataOut);
            bhs.set_itt(0x1234);
            let pdu = Pdu {
                bhs,
                ahs: Bytes::from(vec![9u8; ahs_words * 4]),
                data: Bytes::from((0..len).map(|i| i as u8).collect::<Vec<_>>()),
            };
            let d = Digests { header, data: data_digest };
            let mut want = Vec::new();
            pdu.encode(d, &mut want);
            let p = parts(&pdu, d);
            let got = [&p.head[..], &p.data[..], p.tail()].concat();
            prop_assert_eq!(got, want);
            prop_assert_eq!(p.len(), p.head.len() + len + p.tail().len());
        }
    }
}

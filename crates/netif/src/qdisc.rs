//! Queueing disciplines (`RTM_GETQDISC`), for the one thing braid needs
//! from them: the rate a token bucket (`tbf`) holds a link to. On a shaped
//! link, such as the lab's veths, that rate is what the link carries,
//! whatever speed the device claims.

use std::io;

use crate::nl;

/// One qdisc.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Qdisc {
    pub ifindex: u32,
    /// `tbf`, `htb`, `fq_codel`, `noqueue`, ...
    pub kind: String,
    /// For `tbf`: the rate, in bits per second of what tbf counts (the
    /// packet plus its configured `overhead`).
    pub rate_bits: Option<u64>,
    /// For `tbf`: the per-packet overhead it charges, in bytes.
    pub overhead: Option<u16>,
}

/// `struct tcmsg`.
const TCMSG: usize = 20;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;

/// Every qdisc of the caller's namespace.
///
/// # Errors
///
/// The OS error from the netlink socket, or `InvalidData`.
pub fn qdiscs() -> io::Result<Vec<Qdisc>> {
    let sock = nl::Socket::route()?;
    sock.send(&nl::request(
        libc::RTM_GETQDISC,
        libc::NLM_F_DUMP as u16,
        &[0u8; TCMSG],
    ))?;
    let mut out = Vec::new();
    sock.replies(|kind, body| {
        if kind == libc::RTM_NEWQDISC {
            out.push(parse(body)?);
        }
        Ok(false)
    })?;
    Ok(out)
}

/// The lowest tbf rate on an interface, in bits per second, with its
/// per-packet overhead: what the link is shaped to.
pub fn shaped_rate(all: &[Qdisc], ifindex: u32) -> Option<(u64, u16)> {
    all.iter()
        .filter(|q| q.ifindex == ifindex)
        .filter_map(|q| Some((q.rate_bits?, q.overhead.unwrap_or(0))))
        .min_by_key(|(r, _)| *r)
}

fn parse(body: &[u8]) -> io::Result<Qdisc> {
    if body.len() < TCMSG {
        return Err(nl::bad("a qdisc message shorter than tcmsg"));
    }
    let mut q = Qdisc {
        ifindex: nl::u32_at(body, 4),
        ..Qdisc::default()
    };
    let mut options: &[u8] = &[];
    for (ty, v) in nl::attrs(&body[TCMSG..]) {
        match ty {
            TCA_KIND => q.kind = nl::c_string(v),
            TCA_OPTIONS => options = v,
            _ => {}
        }
    }
    if q.kind == "tbf" {
        let mut rate64 = None;
        for (ty, v) in nl::attrs(options) {
            match ty {
                // struct tc_tbf_qopt starts with the rate's tc_ratespec:
                // cell_log, linklayer, overhead (u16), cell_align, mpu,
                // rate (u32 bytes/s, at offset 8).
                TCA_TBF_PARMS if v.len() >= 12 => {
                    q.overhead = Some(nl::u16_at(v, 2));
                    q.rate_bits = Some(u64::from(nl::u32_at(v, 8)) * 8);
                }
                // Rates of 2^32 bytes/s and more only fit here.
                TCA_TBF_RATE64 if v.len() >= 8 => {
                    rate64 = Some(u64::from_ne_bytes(v[..8].try_into().expect("8 bytes")));
                }
                _ => {}
            }
        }
        if let Some(r) = rate64 {
            q.rate_bits = Some(r * 8);
        }
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nl::attr;

    #[test]
    fn a_tbf_answer_gives_its_rate() {
        let mut body = vec![0u8; TCMSG];
        body[4..8].copy_from_slice(&5u32.to_ne_bytes());
        body.extend(attr(TCA_KIND, b"tbf\0"));
        let mut parms = vec![0u8; 36];
        parms[2..4].copy_from_slice(&24u16.to_ne_bytes());
        parms[8..12].copy_from_slice(&125_000_000u32.to_ne_bytes());
        body.extend(attr(TCA_OPTIONS, &attr(TCA_TBF_PARMS, &parms)));
        let q = parse(&body).unwrap();
        assert_eq!(q.ifindex, 5);
        assert_eq!(q.rate_bits, Some(1_000_000_000));
        assert_eq!(q.overhead, Some(24));
        assert_eq!(shaped_rate(&[q], 5), Some((1_000_000_000, 24)));
        assert!(parse(&[0u8; 3]).is_err());
    }

    #[test]
    fn this_namespace_answers() {
        // Loopback has a noqueue qdisc, or none: either way the dump works.
        qdiscs().unwrap();
    }
}

//! The reply librados gives a notifier: who acknowledged, who did not.

/// Who answered a notification.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NotifyOutcome {
    /// `(global id, watch cookie)` of each watch that acknowledged.
    pub acked: Vec<(u64, u64)>,
    /// `(global id, watch cookie)` of each watch that did not in time.
    pub timed_out: Vec<(u64, u64)>,
}

/// Decodes a notify reply as librados.h documents it: `le32 n`, then `n`
/// times `le64 gid, le64 cookie, le32 len, len bytes`; then `le32 m` and
/// `m` times `le64 gid, le64 cookie`.
pub(crate) fn parse_notify_reply(mut b: &[u8]) -> Option<NotifyOutcome> {
    fn take<const N: usize>(b: &mut &[u8]) -> Option<[u8; N]> {
        let (head, rest) = b.split_first_chunk::<N>()?;
        *b = rest;
        Some(*head)
    }
    let mut out = NotifyOutcome::default();
    let acks = u32::from_le_bytes(take(&mut b)?);
    for _ in 0..acks {
        let gid = u64::from_le_bytes(take(&mut b)?);
        let cookie = u64::from_le_bytes(take(&mut b)?);
        let len = u32::from_le_bytes(take(&mut b)?) as usize;
        b = b.get(len..)?;
        out.acked.push((gid, cookie));
    }
    let timeouts = u32::from_le_bytes(take(&mut b)?);
    for _ in 0..timeouts {
        let gid = u64::from_le_bytes(take(&mut b)?);
        let cookie = u64::from_le_bytes(take(&mut b)?);
        out.timed_out.push((gid, cookie));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_replies_decode_acks_and_timeouts() {
        let mut b = Vec::new();
        b.extend(2u32.to_le_bytes());
        for (gid, cookie, payload) in [(7u64, 1u64, &b"ok"[..]), (9, 2, &b""[..])] {
            b.extend(gid.to_le_bytes());
            b.extend(cookie.to_le_bytes());
            b.extend((payload.len() as u32).to_le_bytes());
            b.extend(payload);
        }
        b.extend(1u32.to_le_bytes());
        b.extend(11u64.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        let out = parse_notify_reply(&b).unwrap();
        assert_eq!(out.acked, vec![(7, 1), (9, 2)]);
        assert_eq!(out.timed_out, vec![(11, 3)]);
        assert_eq!(parse_notify_reply(&b[..b.len() - 1]), None, "truncated");
        assert_eq!(parse_notify_reply(&[]), None);
    }
}

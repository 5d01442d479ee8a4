//! Text exchanges against requests built byte by byte.

use super::*;
use crate::pdu::Opcode;

/// A Text Request of task `itt`: continuing tag `ttt`, C bit `more`.
fn request(itt: u32, ttt: u32, more: bool) -> Bhs {
    let mut b = Bhs::new(Opcode::TextRequest);
    b.0[1] = if more { 0x40 } else { 0x80 };
    b.set_itt(itt);
    b.set_u32(20, ttt);
    b
}

fn reply(step: Result<Incoming, Refusal>) -> Reply {
    match step {
        Ok(Incoming::Reply(r)) => r,
        other => panic!("{other:?}"),
    }
}

/// 256 KiB of keys over continued Text Requests are refused once past
/// 64 KiB, and nothing of them is kept.
#[test]
fn continued_request_text_past_64_kib_is_refused() {
    let mut x = TextExchange::new(8192);
    let chunk = vec![b'a'; 8192];
    let mut ttt = NO_TAG;
    let mut sent = 0;
    loop {
        sent += chunk.len();
        match x.receive(&request(7, ttt, true), &chunk) {
            Ok(Incoming::Reply(r)) => {
                assert!(sent <= text::MAX_TEXT, "{sent} bytes held");
                assert!(r.data.is_empty() && !r.last && r.ttt != NO_TAG);
                ttt = r.ttt;
            }
            Err(Refusal::TooLong) => break,
            other => panic!("{other:?}"),
        }
        assert!(sent < 256 * 1024, "256 KiB of text held");
    }
    assert_eq!(sent, text::MAX_TEXT + 8192);
    assert!(matches!(x.state, State::Idle));
}

#[test]
fn a_request_continued_over_two_pdus_is_read_as_one() {
    let mut x = TextExchange::new(8192);
    let first = reply(x.receive(&request(3, NO_TAG, true), b"SendTar"));
    let whole = x.receive(&request(3, first.ttt, false), b"gets=All\0");
    assert_eq!(
        whole,
        Ok(Incoming::Request(vec![(
            "SendTargets".into(),
            "All".into()
        )]))
    );
}

/// An answer of 10 pairs of 100 bytes to an initiator that takes 512 goes
/// back in parts of whole pairs, each asked for with the tag of the one
/// before, the last with F and the reserved tag.
#[test]
fn a_long_answer_goes_back_in_parts_the_initiator_asks_for() {
    let mut x = TextExchange::new(512);
    let pair = format!("TargetName={}\0", "n".repeat(88));
    assert_eq!(pair.len(), 100);
    let answer = pair.repeat(10).into_bytes();
    let mut got = Vec::new();
    let mut r = x.answer(9, answer.clone());
    let mut parts = 1;
    while !r.last {
        assert_eq!(r.data.len(), 500, "five whole pairs");
        assert!(!r.cut && r.ttt != NO_TAG);
        got.extend_from_slice(&r.data);
        r = reply(x.receive(&request(9, r.ttt, false), b""));
        parts += 1;
    }
    got.extend_from_slice(&r.data);
    assert_eq!((parts, r.ttt, r.cut), (2, NO_TAG, false));
    assert_eq!(got, answer);
    let mut bhs = Bhs::new(Opcode::TextResponse);
    r.mark(&mut bhs);
    assert_eq!((bhs.0[1], bhs.u32_at(20)), (0x80, NO_TAG));
}

/// A pair longer than the initiator takes is cut, with the C bit.
#[test]
fn a_pair_longer_than_a_pdu_is_cut_with_the_c_bit() {
    let mut x = TextExchange::new(512);
    let answer = format!("X-long={}\0", "v".repeat(1000)).into_bytes();
    let first = x.answer(1, answer.clone());
    assert_eq!(
        (first.data.len(), first.cut, first.last),
        (512, true, false)
    );
    let mut bhs = Bhs::new(Opcode::TextResponse);
    first.mark(&mut bhs);
    assert_eq!((bhs.0[1], bhs.u32_at(20)), (0x40, first.ttt));
    let second = reply(x.receive(&request(1, first.ttt, false), b""));
    assert!(second.last && !second.cut);
    assert_eq!([first.data, second.data].concat(), answer);
}

/// A tag this target never gave is refused; a request with the reserved
/// tag drops an answer still under way.
#[test]
fn unknown_tags_are_refused_and_a_fresh_request_starts_over() {
    let mut x = TextExchange::new(512);
    assert_eq!(
        x.receive(&request(1, 77, false), b""),
        Err(Refusal::UnknownTag { itt: 1, ttt: 77 })
    );
    let first = x.answer(1, "A=1\0".repeat(200).into_bytes());
    assert!(!first.last);
    assert_eq!(
        x.receive(&request(2, NO_TAG, false), b"B=2\0"),
        Ok(Incoming::Request(vec![("B".into(), "2".into())]))
    );
    assert_eq!(
        x.receive(&request(1, first.ttt, false), b""),
        Err(Refusal::UnknownTag {
            itt: 1,
            ttt: first.ttt
        })
    );
}

//! Properties of both sides: no input makes either panic, and what is
//! encoded decodes to the same.

use proptest::prelude::*;

use super::*;

proptest! {
    #[test]
    fn server_never_panics(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        crate::fuzzing::server_handshake(&data);
    }

    #[test]
    fn server_never_panics_after_valid_prefix(
        data in proptest::collection::vec(any::<u8>(), 0..256),
        code in 0u32..14,
    ) {
        let mut bytes = 3u32.to_be_bytes().to_vec();
        encode_option(&mut bytes, OptCode::StructuredReply, b"");
        encode_option(&mut bytes, OptCode::from_u32(code), &data);
        crate::fuzzing::server_handshake(&bytes);
    }

    #[test]
    fn client_never_panics(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = b"NBDMAGICIHAVEOPT\0\x03".to_vec();
        bytes.extend_from_slice(&data);
        crate::fuzzing::client_handshake(&bytes);
        crate::fuzzing::client_handshake(&data);
    }

    #[test]
    fn requests_and_replies_never_panic(data in proptest::collection::vec(any::<u8>(), 0..128)) {
        crate::fuzzing::request(&data);
        crate::fuzzing::reply(&data);
    }

    #[test]
    fn request_round_trip(flags: u16, cmd: u16, cookie: u64, offset: u64, length: u32) {
        let r = Request {
            flags: CmdFlags(flags),
            command: Command::from_u16(cmd),
            cookie: Cookie(cookie),
            offset,
            length,
        };
        let mut out = [0u8; 28];
        r.encode(&mut out);
        prop_assert_eq!(Request::decode(&out).unwrap(), r);
    }

    #[test]
    fn go_and_meta_round_trip(
        export in "[a-z0-9/._-]{0,40}",
        requests in proptest::collection::vec(any::<u16>(), 0..8),
        queries in proptest::collection::vec("[a-z:=,0-9-]{0,30}", 0..6),
    ) {
        let g = GoData { export: export.clone(), requests };
        prop_assert_eq!(GoData::decode(&g.encode()).unwrap(), g);
        let m = MetaQuery { export, queries };
        prop_assert_eq!(MetaQuery::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn info_round_trip(size: u64, flags: u16, min_shift in 0u32..17, pref_extra in 0u32..8, max: u32) {
        let min = 1u32 << min_shift;
        let preferred = min << pref_extra;
        let e = Info::Export { size, flags: TransmissionFlags(flags) };
        prop_assert_eq!(Info::decode(&e.encode()).unwrap(), e);
        let b = Info::BlockSize { min, preferred, max: max.max(min) };
        prop_assert_eq!(Info::decode(&b.encode()).unwrap(), b);
    }
}

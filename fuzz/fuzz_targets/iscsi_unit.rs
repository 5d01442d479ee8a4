//! What an iSCSI target's logical unit reads: CDBs and their parameter
//! lists (MODE SELECT, UNMAP, PERSISTENT RESERVE OUT, EXTENDED COPY).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    braid_iscsi::fuzzing::unit(data);
});

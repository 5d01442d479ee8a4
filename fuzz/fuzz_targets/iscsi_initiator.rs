//! What an iSCSI initiator reads from a target: login responses, then
//! full-feature PDUs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    braid_iscsi::fuzzing::initiator(data);
});

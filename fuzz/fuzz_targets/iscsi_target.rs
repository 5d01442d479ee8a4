//! What an iSCSI target reads from an initiator: login requests, then
//! full-feature PDUs (commands, their Data-Out, text requests).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    braid_iscsi::fuzzing::target(data);
});

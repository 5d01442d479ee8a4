//! A request header, validated against fixed and fuzzed negotiations.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| braid_proto::fuzzing::request(data));

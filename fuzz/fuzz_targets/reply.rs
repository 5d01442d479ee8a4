//! A simple reply or structured chunk header, then its chunk payloads.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| braid_proto::fuzzing::reply(data));

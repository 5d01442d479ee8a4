//! Client bytes into the server side of the handshake, then requests.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| braid_proto::fuzzing::server_handshake(data));

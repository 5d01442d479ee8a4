//! Server bytes into the client side of the handshake.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| braid_proto::fuzzing::client_handshake(data));

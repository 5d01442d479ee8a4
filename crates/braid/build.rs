//! Which of the tests' needs this machine lacks: see
//! crates/test-needs/skips.rs, the one build script every test crate
//! shares.

include!("../test-needs/skips.rs");

//! What `braid attach` keeps of each volume it serves, shared with the
//! metrics endpoint (kept apart so neither depends on the other).

use std::path::PathBuf;
use std::sync::Arc;

use braid_initiator::Volume;

/// An attached volume.
pub struct Attached {
    pub name: String,
    pub uri: String,
    pub socket: PathBuf,
    pub volume: Arc<Volume>,
}

//! State of a unit that every server of an export keeps in common (the
//! gateways of one Ceph image: the SCSI reservations), for the protocol
//! that decides on it: read, replaced only if no other server changed it
//! first, and changes announced to every other server, which acts on them
//! before the change is answered.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A change announced, or acted on: ends when done, or says why not.
pub type Acted = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// What a server runs when another announced a change (the text it sent);
/// the announcement is answered when the returned future ends.
pub type OnChange = Arc<dyn Fn(Vec<u8>) -> Acted + Send + Sync>;

/// One export's shared state. `load` and `replace` block (they reach the
/// cluster): call them off the runtime.
pub trait SharedState: Send + Sync + std::fmt::Debug {
    /// The state as last stored (empty: none yet).
    ///
    /// # Errors
    ///
    /// It could not be read; the message says why.
    fn load(&self) -> Result<Vec<u8>, String>;
    /// Stores `new` if the state is still `seen` (one operation: of two
    /// servers that read the same state, one replaces it). `Ok(false)`:
    /// another server changed it first; read it again.
    ///
    /// # Errors
    ///
    /// It could not be stored.
    fn replace(&self, seen: &[u8], new: &[u8]) -> Result<bool, String>;
    /// Sends `message` to every other live server and ends once each has
    /// run its [`OnChange`] on it, or, silent, was fenced (no write of it
    /// can land any more).
    fn announce(&self, message: Vec<u8>) -> Acted;
    /// Runs `on_change` for every change another server announces, and
    /// with an empty message whenever this server may have missed one
    /// (its watch was registered again): it reads the state again.
    fn subscribe(&self, on_change: OnChange);
}

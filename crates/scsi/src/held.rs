//! What copy commands leave for the initiator to ask after (RECEIVE COPY
//! RESULTS' COPY STATUS for EXTENDED COPY, RECEIVE ROD TOKEN INFORMATION
//! for the token commands): kept per I_T nexus and list identifier, as
//! SPC-4 keeps them, the latest of each, and bounded per unit.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::NexusName;

/// Most results one unit holds; past it the oldest goes first.
pub const MAX_HELD: usize = 256;

/// The results held, oldest first.
#[derive(Debug)]
pub struct Held<T>(Mutex<VecDeque<(NexusName, u32, T)>>);

impl<T> Default for Held<T> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<T: Clone> Held<T> {
    /// Holds how the command `list_id` from `nexus` ended, in place of
    /// what an earlier one of that list identifier left.
    pub fn put(&self, nexus: &NexusName, list_id: u32, result: T) {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        held.retain(|(n, l, _)| !(n == nexus && *l == list_id));
        if held.len() == MAX_HELD {
            held.pop_front();
        }
        held.push_back((nexus.clone(), list_id, result));
    }

    /// How the command `list_id` from `nexus` ended, if it is held.
    pub fn get(&self, nexus: &NexusName, list_id: u32) -> Option<T> {
        let held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        held.iter()
            .find(|(n, l, _)| n == nexus && *l == list_id)
            .map(|(_, _, r)| r.clone())
    }
}

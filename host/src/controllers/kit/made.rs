//! The runners this process's set controller made, handed to the runner
//! controller in memory.
//!
//! Before a runner is first registered its controller proves that the set
//! it names as its controller made it: the set exists under the uid the
//! runner's owner reference carries ([`crate::controllers::ephemeral_runner`]'s
//! admission). For a runner the set controller of this very process
//! created a moment ago that proof is already in hand, in the answer to
//! its create: the API server gave the runner its uid and the set's uid
//! was on the request. Asking the API server again cost a read for every
//! runner made (0.6 a job in the fleet benchmark). What is handed over is
//! the pair of uids, which no tenant can forge: a runner written by hand
//! has a uid this map never saw, and is read for as before.
//!
//! An entry is taken once, at the runner's admission. One never taken (its
//! runner deleted before it was admitted) stays until the map is full,
//! when all are dropped: a dropped entry costs its runner the read it
//! would have made anyway, never a wrong answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// How many runners awaiting admission are remembered at most.
pub const CAPACITY: usize = 65_536;

/// Runner uid -> the uid of the set that made it. Clones share it.
#[derive(Clone, Debug, Default)]
pub struct MadeRunners {
    made: Arc<Mutex<HashMap<String, String>>>,
}

impl MadeRunners {
    /// Records that the set `set_uid` made the runner `runner_uid`.
    pub fn made(&self, runner_uid: &str, set_uid: &str) {
        let mut made = self.made.lock().unwrap_or_else(PoisonError::into_inner);
        if made.len() >= CAPACITY {
            made.clear();
        }
        made.insert(runner_uid.to_owned(), set_uid.to_owned());
    }

    /// Whether the set `set_uid` made the runner `runner_uid`, as recorded
    /// here; the record is taken. `false` says only that this process does
    /// not know.
    pub fn take(&self, runner_uid: &str, set_uid: &str) -> bool {
        let mut made = self.made.lock().unwrap_or_else(PoisonError::into_inner);
        match made.get(runner_uid) {
            Some(by) if by == set_uid => {
                made.remove(runner_uid);
                true
            }
            _ => false,
        }
    }

    /// How many are remembered.
    pub fn len(&self) -> usize {
        self.made
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runner_made_by_its_set_is_known_once_and_no_other_pair_is() {
        let made = MadeRunners::default();
        made.made("runner-1", "set-a");
        assert!(!made.take("runner-1", "set-b"), "another set's uid");
        assert!(!made.take("runner-2", "set-a"), "a runner never made here");
        assert!(made.take("runner-1", "set-a"));
        assert!(!made.take("runner-1", "set-a"), "taken once");
        assert!(made.is_empty());
    }

    #[test]
    fn a_full_map_forgets_everything_rather_than_grow() {
        let made = MadeRunners::default();
        for n in 0..CAPACITY {
            made.made(&format!("runner-{n}"), "set");
        }
        assert_eq!(made.len(), CAPACITY);
        made.made("one-more", "set");
        assert_eq!(made.len(), 1);
        assert!(made.take("one-more", "set"));
    }
}

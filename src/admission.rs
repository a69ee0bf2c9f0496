//! Admission control: at most `limit` requests in flight (running or waiting in the
//! engine). A request that would exceed it is refused at once with a 429 and
//! `Retry-After`, rather than queueing without bound and timing out later.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct Admission {
    limit: usize,
    in_flight: Arc<AtomicUsize>,
}

/// Held for as long as a request is in flight; dropping it frees the slot.
#[derive(Debug)]
pub struct Permit {
    in_flight: Arc<AtomicUsize>,
}

impl Admission {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            in_flight: Arc::default(),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// A slot, or `None` when `limit` requests are already in flight.
    pub fn try_admit(&self) -> Option<Permit> {
        self.in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Permit {
                in_flight: Arc::clone(&self.in_flight),
            })
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_the_limit_and_frees_on_drop() {
        let admission = Admission::new(2);
        let a = admission.try_admit().expect("first");
        let _b = admission.try_admit().expect("second");
        assert!(admission.try_admit().is_none(), "third is over the limit");
        drop(a);
        assert_eq!(admission.in_flight(), 1);
        assert!(admission.try_admit().is_some());
    }
}

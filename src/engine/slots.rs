//! The front's slot queue: requests wait here for one of the backend's sequence slots,
//! in the gateway, where the wait is measured; a [`Claim`] holds a slot, the request's
//! place in the running count and its KV-cache positions until the sequence ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{EngineError, EngineLoad, KvCacheUse};

/// How many requests the backend runs at once, and where the others wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slots {
    /// This many sequences, each with its own KV-cache region one context long
    /// (llama.cpp, mistral.rs): requests beyond them wait in the front's queue, which the
    /// queue timeout bounds.
    Sequences(usize),
    /// As many as come, each started within the queue timeout (the scripted engine, whose
    /// script may wait as a busy engine's queue does); no KV cache to report.
    Unlimited,
    /// No queue of the gateway's: an upstream's wait is its first byte, bounded by its
    /// own timeout, and its KV cache is its own.
    Elsewhere,
}

/// Counts itself in a shared number while it lives: figures that stay right whichever
/// way a task ends (finished, failed, cancelled).
#[derive(Debug)]
pub(crate) struct Counted(Arc<AtomicUsize>);

impl Counted {
    pub(crate) fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(count))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Running and waiting requests of one model, and the KV positions the running ones
/// hold. Requests wait for a slot only where the backend has slots.
#[derive(Debug, Default)]
pub struct SlotQueue {
    /// One permit per sequence the backend runs at once; `None`: no waiting here.
    slots: Option<Arc<Semaphore>>,
    /// Where requests wait, and the sequences that hold KV positions.
    kind: Option<Slots>,
    waiting: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
    kv_tokens: Arc<AtomicUsize>,
}

impl SlotQueue {
    /// The queue of a backend with these slots.
    pub fn new(slots: Slots) -> Self {
        let permits = match slots {
            Slots::Sequences(n) => {
                Some(Arc::new(Semaphore::new(n.clamp(1, Semaphore::MAX_PERMITS))))
            }
            Slots::Unlimited | Slots::Elsewhere => None,
        };
        Self {
            slots: permits,
            kind: Some(slots),
            ..Self::default()
        }
    }

    /// Waits for a slot (where there are slots) and claims it.
    pub async fn claim(&self) -> Result<Claim, EngineError> {
        let permit = match &self.slots {
            Some(slots) => {
                let _waiting = Counted::new(&self.waiting);
                let permit = Arc::clone(slots)
                    .acquire_owned()
                    .await
                    .map_err(|_| EngineError::Internal("the engine is shutting down".into()))?;
                Some(permit)
            }
            None => None,
        };
        Ok(Claim {
            _running: Counted::new(&self.running),
            kv_tokens: Arc::clone(&self.kv_tokens),
            held: 0,
            _permit: permit,
        })
    }

    pub fn load(&self) -> EngineLoad {
        EngineLoad {
            running: self.running.load(Ordering::SeqCst),
            waiting: self.waiting.load(Ordering::SeqCst),
        }
    }

    /// The positions the running sequences hold over what the sequences can hold, each
    /// one context long; `None` for a backend without sequences of its own here.
    pub fn kv_cache(&self, context_length: u32) -> Option<KvCacheUse> {
        let Some(Slots::Sequences(sequences)) = self.kind else {
            return None;
        };
        Some(KvCacheUse {
            used_tokens: self.kv_tokens.load(Ordering::SeqCst) as u64,
            capacity_tokens: sequences as u64 * u64::from(context_length),
        })
    }
}

/// A running sequence's claim: its slot, its place in the running count and its KV
/// positions, all given back when it is dropped at the sequence's end.
#[derive(Debug)]
pub struct Claim {
    _running: Counted,
    kv_tokens: Arc<AtomicUsize>,
    held: usize,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Claim {
    /// The sequence's KV cache now holds `tokens` positions.
    pub fn holds(&mut self, tokens: usize) {
        if tokens > self.held {
            self.kv_tokens
                .fetch_add(tokens - self.held, Ordering::SeqCst);
        } else {
            self.kv_tokens
                .fetch_sub(self.held - tokens, Ordering::SeqCst);
        }
        self.held = tokens;
    }

    /// Positions the sequence holds now.
    pub fn held(&self) -> usize {
        self.held
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.kv_tokens.fetch_sub(self.held, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_waiting_running_and_kv_positions() {
        let queue = Arc::new(SlotQueue::new(Slots::Sequences(1)));
        let mut first = queue.claim().await.unwrap();
        first.holds(10);
        first.holds(12);
        assert_eq!(queue.kv_cache(100).unwrap().used_tokens, 12);
        assert_eq!(queue.kv_cache(100).unwrap().capacity_tokens, 100);
        let second = tokio::spawn({
            let queue = Arc::clone(&queue);
            async move { queue.claim().await.map(|_| ()) }
        });
        while queue.load().waiting == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            queue.load(),
            EngineLoad {
                running: 1,
                waiting: 1
            }
        );
        drop(first);
        second.await.unwrap().unwrap();
        assert_eq!(queue.kv_cache(100).unwrap().used_tokens, 0);
        assert_eq!(queue.load(), EngineLoad::default());
    }

    #[tokio::test]
    async fn without_slots_nothing_waits_and_no_kv_is_reported() {
        let queue = SlotQueue::new(Slots::Elsewhere);
        let _a = queue.claim().await.unwrap();
        let _b = queue.claim().await.unwrap();
        assert_eq!(queue.load().running, 2);
        assert_eq!(queue.kv_cache(100), None);
    }
}

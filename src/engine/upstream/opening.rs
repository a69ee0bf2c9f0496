//! How a request to an upstream opened, told to the gateway while it holds its status
//! line: the attempts ([`super::attempts`]) and the stream reader ([`super::stream`])
//! hold the [`Opening`], the engine's `start` the [`Waiting`].
//!
//! The gateway waits at most [`OPENING_WINDOW`]: a fault within it (a refusal, every
//! replica failing) is answered as the HTTP error it stands for; after it the client has
//! its 200 and keep-alives, and a fault is the stream's error frame.

use std::time::Duration;

use tokio::sync::oneshot;

use super::fault::Fault;

/// How long the gateway holds its status line for the first attempt to open: long
/// enough for a refused connection to fail over, or for vLLM's in-stream refusal of
/// `stop_token_ids` or a `json_schema` (it comes before any prefill), short enough that
/// a client behind a silent upstream gets its 200 and keep-alives at once.
pub const OPENING_WINDOW: Duration = Duration::from_millis(1000);

/// The attempts' side: `Ok` once an answer's first chunk is good, the fault when it
/// failed before that.
pub(crate) struct Opening(Option<oneshot::Sender<Result<(), Fault>>>);

/// The gateway's side.
pub(crate) struct Waiting(oneshot::Receiver<Result<(), Fault>>);

/// A new opening and its waiting end.
pub(crate) fn channel() -> (Opening, Waiting) {
    let (tx, rx) = oneshot::channel();
    (Opening(Some(tx)), Waiting(rx))
}

impl Opening {
    /// For the fuzz target and tests: nobody waits.
    pub(crate) fn none() -> Self {
        Self(None)
    }

    pub(crate) fn opened(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(Ok(()));
        }
    }

    /// Hands the fault to the waiting gateway; gives it back when the gateway answered
    /// already (it then goes into the stream).
    pub(crate) fn failed(&mut self, fault: Fault) -> Option<Fault> {
        match self.0.take() {
            Some(tx) => tx.send(Err(fault)).err().and_then(Result::err),
            None => Some(fault),
        }
    }
}

impl Waiting {
    /// The fault the request failed with within `window`, if it did.
    pub(crate) async fn fault_within(mut self, window: Duration) -> Option<Fault> {
        let opened = match tokio::time::timeout(window, &mut self.0).await {
            Ok(opened) => opened.ok(),
            // Closed first, so that a fault sent from now on goes back to the attempts
            // (which put it in the stream), and one sent just before is read here.
            Err(_) => {
                self.0.close();
                self.0.try_recv().ok()
            }
        };
        opened.and_then(Result::err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_fault_within_the_window_is_the_gateways_and_one_after_it_the_streams() {
        let (mut opening, waiting) = channel();
        let refused = || Fault::Unreachable("refused".into());
        assert!(opening.failed(refused()).is_none(), "taken by the gateway");
        assert!(waiting.fault_within(Duration::from_secs(1)).await.is_some());

        let (mut opening, waiting) = channel();
        assert!(waiting
            .fault_within(Duration::from_millis(10))
            .await
            .is_none());
        assert!(
            opening.failed(refused()).is_some(),
            "given back, for the stream"
        );

        let (mut opening, waiting) = channel();
        opening.opened();
        assert!(waiting.fault_within(Duration::from_secs(1)).await.is_none());
    }
}

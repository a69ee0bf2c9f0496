//! Stopping without dropping anyone. On SIGTERM or SIGINT the gateway drains:
//!
//! 1. `/ready` answers 503 at once, so load balancers stop sending work, and new chat
//!    requests get 503 `server_shutting_down` with `Retry-After`;
//! 2. requests already running finish, for up to the shutdown timeout;
//! 3. those still running then end with an error frame (streams) or a 503 (the others),
//!    each recorded, so every request keeps its one semantic-log document;
//! 4. the HTTP server stops, and the semantic log writes its queue to the spool before
//!    it tries the network with the time left (see `semlog`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::admission::Admission;

/// Whether the gateway is draining, and the signal that ends the requests still running.
#[derive(Debug, Default)]
pub struct Lifecycle {
    draining: AtomicBool,
    cut_off: CancellationToken,
}

impl Lifecycle {
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Fires when the drain's time is up: running requests end with an error.
    pub fn cut_off(&self) -> CancellationToken {
        self.cut_off.clone()
    }

    /// Refuses new work, waits up to `timeout` for the requests in flight to finish, then
    /// ends the rest and waits (briefly) for them to be recorded.
    pub async fn drain(&self, admission: &Admission, timeout: Duration) {
        self.draining.store(true, Ordering::SeqCst);
        let in_flight = admission.in_flight();
        tracing::info!(
            in_flight,
            timeout_s = timeout.as_secs_f64(),
            "Draining: not ready, refusing new requests, letting running ones finish."
        );
        if !settled(admission, timeout).await {
            tracing::warn!(
                in_flight = admission.in_flight(),
                "The shutdown timeout is up; ending the requests still running."
            );
            self.cut_off.cancel();
            if !settled(admission, CUT_OFF_GRACE).await {
                tracing::error!(
                    in_flight = admission.in_flight(),
                    "Requests were still running after they were told to end."
                );
            }
        }
    }
}

/// How long requests that were told to end get to write their last frames.
const CUT_OFF_GRACE: Duration = Duration::from_secs(2);

/// Whether no request is in flight within `timeout`.
async fn settled(admission: &Admission, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    while admission.in_flight() > 0 {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// Resolves on the first SIGTERM or SIGINT (Ctrl-C).
pub async fn stop_signal() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

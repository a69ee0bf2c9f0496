//! mistral.rs's engine threads, watched: one engine thread per model instance runs every
//! step, and when it ends (a panic inside mistral.rs) nothing answers that instance's
//! requests until something asks mistral.rs for its sender again, which restarts the
//! thread. Left alone, the first request after a panic paid for the restart, and `/ready`
//! said ready all the while.
//!
//! The watchdog looks at each instance's request channel every [`EVERY`]: a channel whose
//! receiving end is gone is a thread that ended. It says so in the log, marks the instance
//! down ([`Health`], which `readiness` reads) and asks mistral.rs for a new sender, which
//! restarts the thread on the loaded weights; once the new channel is open the instance is
//! up again and the restart is counted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use mistralrs::{Model, Request};
use tokio::sync::mpsc::Sender;

/// How often each engine thread is looked at: a stopped one is restarted within this.
pub(super) const EVERY: Duration = Duration::from_millis(250);

/// Whether each model instance's engine thread runs, and how often one was restarted.
#[derive(Debug)]
pub(super) struct Health {
    down: Vec<AtomicBool>,
    restarts: AtomicU64,
}

impl Health {
    pub(super) fn new(instances: usize) -> Self {
        Self {
            down: (0..instances).map(|_| AtomicBool::new(false)).collect(),
            restarts: AtomicU64::new(0),
        }
    }

    /// Whether no instance can take a request now: every engine thread has stopped.
    pub(super) fn all_down(&self) -> bool {
        self.down.iter().all(|d| d.load(Ordering::SeqCst))
    }

    /// Engine threads restarted since the model loaded.
    pub(super) fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::SeqCst)
    }
}

/// Watches `instances` until they are dropped (the engine is gone).
pub(super) async fn watch(model_id: String, instances: Vec<Weak<Model>>, health: Arc<Health>) {
    // The sender each instance had at the last look.
    let mut senders: Vec<Option<Sender<Request>>> = vec![None; instances.len()];
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for (i, instance) in instances.iter().enumerate() {
            let Some(model) = instance.upgrade() else {
                return;
            };
            let stopped = senders[i].as_ref().is_some_and(Sender::is_closed);
            if stopped && !health.down[i].swap(true, Ordering::SeqCst) {
                tracing::error!(
                    model = %model_id,
                    instance = i,
                    "mistral.rs's engine thread has stopped (a panic; the log above says where); restarting it."
                );
            }
            // mistral.rs restarts a stopped engine thread here, on the loaded weights.
            match model.inner().get_sender(None) {
                Ok(sender) if !sender.is_closed() => {
                    if health.down[i].swap(false, Ordering::SeqCst) {
                        health.restarts.fetch_add(1, Ordering::SeqCst);
                        tracing::warn!(model = %model_id, instance = i, "mistral.rs's engine thread was restarted; serving again.");
                    }
                    senders[i] = Some(sender);
                }
                Ok(_) => {}
                // Down until mistral.rs gives a sender again; said once per outage.
                Err(error) => {
                    if !health.down[i].swap(true, Ordering::SeqCst) {
                        tracing::error!(
                            model = %model_id,
                            instance = i,
                            error = %error,
                            "mistral.rs's engine thread could not be restarted; trying again."
                        );
                    }
                }
            }
        }
    }
}

/// Ends every instance's engine thread as a panic would (for the tests of the watchdog).
pub(super) async fn stop_threads(instances: &[Arc<Model>]) -> anyhow::Result<()> {
    for model in instances {
        model
            .inner()
            .get_sender(None)?
            .send(Request::Terminate)
            .await?;
    }
    Ok(())
}

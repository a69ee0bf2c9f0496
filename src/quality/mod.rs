//! Answer-quality signals, computed cheaply per request and reported with the timings:
//!
//! - [`repetition`]: seq-rep-n, incrementally per token, and the sliding window that
//!   drives the degeneration guard;
//! - [`refusal`]: does the answer decline the request (phrase list, several languages);
//! - [`intent`]: what kind of request it is (regex rules from `prompts/intents.toml`).

pub mod intent;
pub mod refusal;
pub mod repetition;

use serde::Serialize;

/// The quality figures of one finished request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Quality {
    pub repetition_rate: f64,
    /// The degeneration guard stopped the answer early.
    pub degenerated: bool,
    pub refusal: bool,
    pub intent: String,
}

/// Settings of the degeneration guard; off unless configured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuardConfig {
    /// Tokens in the sliding window.
    pub window: usize,
    /// Stop when the window's seq-rep-n is above this.
    pub threshold: f64,
}

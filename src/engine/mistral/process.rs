//! Process-wide settings that candle and mistral.rs read once, from the environment or
//! from rayon's global pool, the first time they need them: how quantized weights are
//! held on CPU, and how many threads compute. The gateway sets them from its own config
//! before any thread starts, so a stray variable in the user's shell cannot change what
//! is served (each override is reported).
//!
//! Why each lever matters is measured in docs/engine.md ("Engine settings on CPU").

use crate::engine::config::{EngineConfig, Weights};

/// The weight mode candle's variables select now, read as candle reads them.
pub(super) fn weights_in_effect() -> Weights {
    weights_from(|name| std::env::var(name).ok())
}

/// The weight mode variables select, given how to look one up.
fn weights_from(var: impl Fn(&str) -> Option<String>) -> Weights {
    let on = |name: &str| var(name).is_some_and(|v| !v.is_empty() && v != "0");
    if on("CANDLE_DEQUANTIZE_ALL") {
        Weights::F32
    } else if on("CANDLE_DEQUANTIZE_ALL_F16") {
        Weights::F16
    } else {
        Weights::Quantized
    }
}

/// Values of candle's two variables for a weight mode (`None`: unset).
fn candle_env(weights: Weights) -> [(&'static str, Option<&'static str>); 2] {
    let (all, all_f16) = match weights {
        Weights::Quantized => (None, None),
        Weights::F16 => (None, Some("1")),
        Weights::F32 => (Some("1"), None),
    };
    [
        ("CANDLE_DEQUANTIZE_ALL", all),
        ("CANDLE_DEQUANTIZE_ALL_F16", all_f16),
    ]
}

/// What [`apply`] did, for the start-up log (logging is not running yet when it runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub threads: usize,
    /// Variables the user's environment had set to something else, with their old value.
    pub overridden: Vec<(&'static str, String)>,
}

/// Sets candle's and rayon's variables and builds rayon's global pool.
///
/// Call it while the process has a single thread (before the async runtime and the
/// logger start): the environment is process-wide and not safe to change while other
/// threads may read it. It fails if rayon's global pool already exists.
pub fn apply(engine: &EngineConfig) -> Result<Applied, String> {
    let threads = match engine.threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    let threads_text = threads.to_string();
    let mut wanted: Vec<(&'static str, Option<&str>)> = candle_env(engine.weights).to_vec();
    // mistral.rs's attention pool is a rayon pool built with defaults, which read this.
    wanted.push(("RAYON_NUM_THREADS", Some(&threads_text)));
    let mut overridden = Vec::new();
    for (name, value) in wanted {
        let old = std::env::var(name).ok();
        if old.is_some() && old.as_deref() != value {
            overridden.push((name, old.unwrap_or_default()));
        }
        match value {
            Some(value) => std::env::set_var(name, value),
            None => std::env::remove_var(name),
        }
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .map_err(|e| format!("could not size the compute thread pool: {e}"))?;
    Ok(Applied {
        threads,
        overridden,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_reads_back_as_itself() {
        for w in [Weights::Quantized, Weights::F16, Weights::F32] {
            let env = candle_env(w);
            let lookup = |name: &str| {
                env.iter()
                    .find(|(n, _)| *n == name)
                    .and_then(|(_, v)| v.map(str::to_owned))
            };
            assert_eq!(weights_from(lookup), w);
        }
        assert_eq!(weights_from(|_| Some("0".into())), Weights::Quantized);
    }

    #[test]
    fn each_mode_sets_exactly_one_candle_switch_or_none() {
        let set = |w: Weights| -> Vec<&str> {
            candle_env(w)
                .iter()
                .filter_map(|(name, value)| value.map(|_| *name))
                .collect()
        };
        assert!(set(Weights::Quantized).is_empty());
        assert_eq!(set(Weights::F16), ["CANDLE_DEQUANTIZE_ALL_F16"]);
        assert_eq!(set(Weights::F32), ["CANDLE_DEQUANTIZE_ALL"]);
    }
}

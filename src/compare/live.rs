//! `llmgate compare --live PRIMARY:CANDIDATE`: the verdicts of a shadow running in a
//! gateway (docs/shadow.md), over its window of the last comparisons, as `/stats` gives
//! them: the same statistics as a comparison on a prompt set.

use serde_json::Value;

use super::CompareArgs;
use crate::shadow::verdict::{table, FigureVerdict};
use crate::shadow::PairView;

/// The pair's view from the gateway's `/stats`.
pub async fn fetch(args: &CompareArgs, pair: &str) -> anyhow::Result<PairView> {
    let (primary, candidate) = pair
        .split_once(':')
        .filter(|(p, c)| !p.is_empty() && !c.is_empty())
        .ok_or_else(|| anyhow::anyhow!("--live takes PRIMARY:CANDIDATE, the two models' ids"))?;
    let mut request =
        reqwest::Client::new().get(format!("{}/stats", args.gateway.trim_end_matches('/')));
    if let Some(key) = &args.api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await?;
    let status = response.status();
    let stats: Value = response.json().await?;
    anyhow::ensure!(
        status.is_success(),
        "{} answered {status}: {}",
        args.gateway,
        stats["error"]["message"].as_str().unwrap_or("")
    );
    let views: Vec<PairView> = match stats.get("shadows") {
        Some(shadows) => serde_json::from_value(shadows.clone())?,
        None => Vec::new(),
    };
    let served: Vec<String> = views
        .iter()
        .map(|v| format!("{}:{}", v.primary, v.candidate))
        .collect();
    views
        .into_iter()
        .find(|v| v.primary == primary && v.candidate == candidate)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{} has compared no request of {pair} yet (pairs with comparisons: {})",
                args.gateway,
                if served.is_empty() {
                    "none".to_owned()
                } else {
                    served.join(", ")
                }
            )
        })
}

/// The report: counts, then the verdict per figure.
pub fn report(view: &PairView) -> String {
    let mut out = format!(
        "{} (primary) and {} (candidate): {} pairs compared, {} identical, {} different, {} with a side that failed",
        view.primary, view.candidate, view.compared, view.identical, view.different, view.failed
    );
    if let Some(distance) = view.mean_edit_distance {
        out.push_str(&format!("; mean word edit distance {distance:.3}"));
    }
    out.push_str(".\n\nCandidate minus primary, per figure (the median for times and tokens, the mean for rates; 95% bootstrap interval):\n");
    out.push_str(&table(&view.figures));
    out
}

/// Whether any figure is judged worse.
pub fn any_worse(figures: &[FigureVerdict]) -> bool {
    figures.iter().any(|f| f.verdict == "worse")
}

//! The report of one run: percentiles of the client-side figures, the comparison with
//! the server's own `timings`, and the gateway's overhead over what it fronts.

use std::time::Duration;

use serde::Serialize;

use super::client::Sample;
use super::BenchArgs;
use crate::timing::nearest_rank;

/// p50, p95 and p99 in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct LatencyPercentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

fn percentiles(values: &[Duration]) -> Option<LatencyPercentiles> {
    let ms: Vec<f64> = values.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    percentiles_ms(&ms)
}

/// Percentiles of signed millisecond values (client minus server can be negative).
pub(super) fn percentiles_ms(values: &[f64]) -> Option<LatencyPercentiles> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| nearest_rank(&sorted, q);
    Some(LatencyPercentiles {
        p50: at(0.50),
        p95: at(0.95),
        p99: at(0.99),
    })
}

/// The result of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub label: String,
    pub target: String,
    pub concurrency: usize,
    pub rate: Option<f64>,
    pub requests_ok: usize,
    pub errors: usize,
    /// Each distinct error of the failed requests, and how many had it.
    pub error_messages: std::collections::BTreeMap<String, usize>,
    /// Requests sent a second time because the first send never reached the server.
    pub resent: usize,
    pub duration_s: f64,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    pub ttft_ms: Option<LatencyPercentiles>,
    pub tpot_ms: Option<LatencyPercentiles>,
    pub itl_ms: Option<LatencyPercentiles>,
    pub e2e_ms: Option<LatencyPercentiles>,
    /// Client minus server, per request, when the server reports `timings` (llmgate).
    pub client_minus_server_ttft_ms: Option<LatencyPercentiles>,
    pub client_minus_server_tpot_ms: Option<LatencyPercentiles>,
    /// With `--engine-direct` at concurrency 1: this request through the gateway minus
    /// the same prompt straight into the engine, paired request by request.
    pub gateway_minus_direct_ttft_ms: Option<LatencyPercentiles>,
    pub gateway_minus_direct_tpot_ms: Option<LatencyPercentiles>,
}

impl Report {
    pub(super) fn from_samples(
        label: String,
        target: String,
        args: &BenchArgs,
        samples: &[Sample],
        took: Duration,
    ) -> Self {
        let ok: Vec<&Sample> = samples.iter().filter(|s| s.error.is_none()).collect();
        let collect = |f: &dyn Fn(&Sample) -> Option<Duration>| -> Vec<Duration> {
            ok.iter().filter_map(|s| f(s)).collect()
        };
        let itl: Vec<Duration> = ok.iter().flat_map(|s| s.itl.iter().copied()).collect();
        let ttft_diff: Vec<f64> = ok
            .iter()
            .filter_map(|s| Some(s.ttft?.as_secs_f64() * 1000.0 - s.server_ttft_ms?))
            .collect();
        let tpot_diff: Vec<f64> = ok
            .iter()
            .filter_map(|s| Some(s.tpot?.as_secs_f64() * 1000.0 - s.server_tpot_ms?))
            .collect();
        let tokens: u64 = ok.iter().map(|s| u64::from(s.output_tokens)).sum();
        let mut error_messages = std::collections::BTreeMap::new();
        for error in samples.iter().filter_map(|s| s.error.as_ref()) {
            *error_messages.entry(error.clone()).or_insert(0) += 1;
        }
        let secs = took.as_secs_f64().max(f64::EPSILON);
        Report {
            label,
            target,
            concurrency: args.concurrency,
            rate: args.rate,
            requests_ok: ok.len(),
            errors: samples.len() - ok.len(),
            error_messages,
            resent: samples.iter().filter(|s| s.resent).count(),
            duration_s: secs,
            requests_per_s: ok.len() as f64 / secs,
            output_tokens_per_s: tokens as f64 / secs,
            ttft_ms: percentiles(&collect(&|s| s.ttft)),
            tpot_ms: percentiles(&collect(&|s| s.tpot)),
            itl_ms: percentiles(&itl),
            e2e_ms: percentiles(&collect(&|s| Some(s.e2e))),
            client_minus_server_ttft_ms: percentiles_ms(&ttft_diff),
            client_minus_server_tpot_ms: percentiles_ms(&tpot_diff),
            gateway_minus_direct_ttft_ms: None,
            gateway_minus_direct_tpot_ms: None,
        }
    }

    /// The human-readable table.
    pub fn table(&self) -> String {
        let row = |name: &str, p: Option<LatencyPercentiles>| match p {
            Some(p) => format!(
                "{name:<28} {:>10.2} {:>10.2} {:>10.2}\n",
                p.p50, p.p95, p.p99
            ),
            None => format!("{name:<28} {:>10} {:>10} {:>10}\n", "-", "-", "-"),
        };
        let mut out = format!(
            "{} ({}), concurrency {}{}: {} ok, {} errors in {:.1} s\n",
            self.label,
            self.target,
            self.concurrency,
            self.rate.map_or(String::new(), |r| format!(", rate {r}/s")),
            self.requests_ok,
            self.errors,
            self.duration_s
        );
        if self.resent > 0 {
            out.push_str(&format!(
                "  {} sent again: the connection was closed before the request reached the server\n",
                self.resent
            ));
        }
        for (message, count) in &self.error_messages {
            out.push_str(&format!("  {count} failed: {message}\n"));
        }
        out.push_str(&format!(
            "{:<28} {:>10} {:>10} {:>10}\n",
            "ms", "p50", "p95", "p99"
        ));
        out.push_str(&row("TTFT", self.ttft_ms));
        out.push_str(&row("TPOT", self.tpot_ms));
        out.push_str(&row("ITL", self.itl_ms));
        out.push_str(&row("e2e", self.e2e_ms));
        if self.gateway_minus_direct_ttft_ms.is_some() {
            out.push_str(&row(
                "TTFT gateway - direct",
                self.gateway_minus_direct_ttft_ms,
            ));
            out.push_str(&row(
                "TPOT gateway - direct",
                self.gateway_minus_direct_tpot_ms,
            ));
        }
        if self.client_minus_server_ttft_ms.is_some() {
            out.push_str(&row(
                "TTFT client - server",
                self.client_minus_server_ttft_ms,
            ));
            out.push_str(&row(
                "TPOT client - server",
                self.client_minus_server_tpot_ms,
            ));
        }
        out.push_str(&format!(
            "throughput: {:.2} requests/s, {:.1} output tokens/s\n",
            self.requests_per_s, self.output_tokens_per_s
        ));
        out
    }
}

/// The gateway over what it fronts (the engine in-process, or the upstream server), for
/// the summary line of an `--engine-direct` or `--direct-url` run.
pub fn overhead(engine: &Report, gateway: &Report) -> String {
    let ratio = |g: Option<LatencyPercentiles>, e: Option<LatencyPercentiles>| match (g, e) {
        (Some(g), Some(e)) if e.p50 > 0.0 => {
            format!("{:+.3} ms ({:.4}x)", g.p50 - e.p50, g.p50 / e.p50)
        }
        _ => "-".into(),
    };
    format!(
        "gateway vs {} at p50: TTFT {}, TPOT {}, e2e {}\n",
        engine.label,
        ratio(gateway.ttft_ms, engine.ttft_ms),
        ratio(gateway.tpot_ms, engine.tpot_ms),
        ratio(gateway.e2e_ms, engine.e2e_ms)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ttft_ms: u64, server_ttft: f64) -> Sample {
        Sample {
            ttft: Some(Duration::from_millis(ttft_ms)),
            tpot: Some(Duration::from_millis(20)),
            itl: vec![Duration::from_millis(20); 3],
            e2e: Duration::from_millis(ttft_ms + 60),
            output_tokens: 4,
            server_ttft_ms: Some(server_ttft),
            server_tpot_ms: Some(20.0),
            error: None,
            resent: false,
        }
    }

    #[test]
    fn a_report_aggregates_samples_with_the_gateway_percentiles() {
        let args = BenchArgs {
            url: "u".into(),
            model: "m".into(),
            prompts: "p".into(),
            concurrency: 2,
            rate: None,
            requests: 4,
            duration_secs: None,
            warmup: 0,
            max_tokens: 4,
            temperature: 0.0,
            json: None,
            label: None,
            engine_direct: false,
            model_path: "x".into(),
            direct_url: None,
            direct_model: None,
            api_key: None,
        };
        let mut failed = sample(0, 0.0);
        failed.error = Some("status 500".into());
        let mut resent = sample(100, 99.0);
        resent.resent = true;
        let samples = [resent, sample(200, 198.5), sample(300, 299.0), failed];
        let r = Report::from_samples(
            "t".into(),
            "u".into(),
            &args,
            &samples,
            Duration::from_secs(2),
        );
        assert_eq!((r.requests_ok, r.errors), (3, 1));
        assert_eq!(r.error_messages.get("status 500"), Some(&1));
        assert!(
            r.table().contains("  1 failed: status 500"),
            "{}",
            r.table()
        );
        assert_eq!(r.ttft_ms.map(|p| p.p50), Some(200.0));
        assert_eq!(r.ttft_ms.map(|p| p.p99), Some(300.0));
        assert_eq!(r.output_tokens_per_s, 6.0);
        assert_eq!(r.client_minus_server_ttft_ms.map(|p| p.p50), Some(1.0));
        assert!(r.table().contains("TTFT client - server"));
        assert_eq!(r.resent, 1, "sent again, and answered");
    }
}

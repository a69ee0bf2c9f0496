//! `llmgate compare`: the regression check to run before a new model, file or build goes
//! live. The same prompt set goes to two gateways (the one serving today, the
//! candidate), one prompt after the other, greedy and seeded by default; or two
//! `system_fingerprint`s are compared in a semantic-log NDJSON export, request by request
//! (matched by `llm.input_hash`, so only prompts both answered count).
//!
//! Per prompt: whether the answers are the same, the share of words before they first
//! differ, and the deltas (candidate minus baseline) of TTFT, TPOT, repetition rate,
//! refusal and mean token log-probability as each gateway reported them. The summary
//! gives the share of identical answers and the medians and means of the deltas. As a
//! table, and as JSON with `--json`.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::config::DEFAULT_MODEL_ID;
use crate::shadow::verdict::{table, verdict, Better, FigureOf, FigureVerdict, Margin};

/// The figures a verdict is given on, as a live shadow's are (`crate::shadow`): which way
/// is better and what margin counts.
const FIGURES: [FigureOf<SideAnswer>; 5] = [
    ("ttft_ms", Better::Lower, Margin::Time, |a| a.ttft_ms),
    ("tpot_ms", Better::Lower, Margin::Time, |a| a.tpot_ms),
    ("repetition_rate", Better::Lower, Margin::Rate, |a| {
        a.repetition_rate
    }),
    ("refusal", Better::Lower, Margin::Rate, |a| {
        a.refusal.map(f64::from)
    }),
    ("mean_logprob", Better::Higher, Margin::Rate, |a| {
        a.mean_logprob
    }),
];

pub mod live;

#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// Base URL of the gateway serving today.
    #[arg(long, requires = "candidate", conflicts_with = "semlog")]
    pub baseline: Option<String>,
    /// Base URL of the gateway to compare with it.
    #[arg(long, requires = "baseline")]
    pub candidate: Option<String>,
    /// A semantic-log NDJSON file (or a folder of them) to compare two fingerprints in,
    /// instead of asking two gateways.
    #[arg(long, requires_all = ["baseline_fingerprint", "candidate_fingerprint"])]
    pub semlog: Option<PathBuf>,
    #[arg(long)]
    pub baseline_fingerprint: Option<String>,
    #[arg(long)]
    pub candidate_fingerprint: Option<String>,
    /// Model id to send.
    #[arg(long, default_value = DEFAULT_MODEL_ID)]
    pub model: String,
    /// Prompt set: JSONL lines with `id` and a `messages` array.
    #[arg(long, default_value = "prompts/mixed.jsonl")]
    pub prompts: PathBuf,
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
    /// 0 (the default) compares greedy answers, which a same-model change should keep.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Sent with every request, so sampled answers are comparable too.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// API key for both gateways.
    #[arg(long, env = "LLMGATE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Exit with status 1 when fewer answers than this share are identical.
    #[arg(long)]
    pub min_agreement: Option<f64>,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// A shadow running in a gateway, as PRIMARY:CANDIDATE (docs/shadow.md): its
    /// verdicts over the gateway's window, instead of a prompt set.
    #[arg(long, value_name = "PRIMARY:CANDIDATE", conflicts_with_all = ["baseline", "semlog"])]
    pub live: Option<String>,
    /// The gateway running the shadow (with --live).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub gateway: String,
    /// With --live: exit with status 1 when a figure is judged worse.
    #[arg(long, requires = "live")]
    pub fail_on_worse: bool,
}

/// One side's answer to one prompt, with the figures its gateway reported.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SideAnswer {
    pub text: Option<String>,
    /// A digest of the text: sha256 for a live answer, the semantic log's keyed
    /// `llm.output_hash` in an export (one gateway's key: its documents compare).
    pub output_hash: Option<String>,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub repetition_rate: Option<f64>,
    pub refusal: Option<bool>,
    pub mean_logprob: Option<f64>,
    pub system_fingerprint: Option<String>,
    pub error: Option<String>,
}

impl SideAnswer {
    fn from_response(body: &Value) -> Self {
        let t = &body["timings"];
        let text = body["choices"][0]["message"]["content"]
            .as_str()
            .map(str::to_owned);
        Self {
            output_hash: text.as_deref().map(crate::record::output_hash),
            text,
            ttft_ms: t["ttft_ms"].as_f64(),
            tpot_ms: t["tpot_ms"].as_f64(),
            repetition_rate: t["repetition_rate"].as_f64(),
            refusal: t["refusal"].as_bool(),
            mean_logprob: t["mean_logprob"].as_f64(),
            system_fingerprint: body["system_fingerprint"].as_str().map(str::to_owned),
            error: None,
        }
    }

    /// A semantic-log document's `llm` object: the excerpt stands for the text.
    fn from_document(llm: &Value) -> Self {
        Self {
            text: llm["response_excerpt"].as_str().map(str::to_owned),
            output_hash: llm["output_hash"].as_str().map(str::to_owned),
            ttft_ms: llm["ttft_ms"].as_f64(),
            tpot_ms: llm["tpot_ms"].as_f64(),
            repetition_rate: llm["repetition_rate"].as_f64(),
            refusal: llm["refusal"].as_bool(),
            mean_logprob: llm["mean_logprob"].as_f64(),
            system_fingerprint: llm["system_fingerprint"].as_str().map(str::to_owned),
            error: None,
        }
    }

    fn failed(error: String) -> Self {
        Self {
            error: Some(error),
            ..Self::default()
        }
    }
}

/// One prompt, both answers, and how they differ.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub id: String,
    /// The same text (by hash).
    pub identical: bool,
    /// Share of the baseline's words before the two first differ (1 when identical).
    pub shared_prefix: f64,
    pub ttft_ms_delta: Option<f64>,
    pub tpot_ms_delta: Option<f64>,
    pub repetition_rate_delta: Option<f64>,
    pub mean_logprob_delta: Option<f64>,
    /// `(baseline, candidate)`.
    pub refusal: (Option<bool>, Option<bool>),
    pub baseline: SideAnswer,
    pub candidate: SideAnswer,
}

impl Row {
    pub fn new(id: String, baseline: SideAnswer, candidate: SideAnswer) -> Self {
        let delta = |f: fn(&SideAnswer) -> Option<f64>| match (f(&baseline), f(&candidate)) {
            (Some(b), Some(c)) => Some(c - b),
            _ => None,
        };
        let identical = baseline.error.is_none()
            && candidate.error.is_none()
            && baseline.output_hash.is_some()
            && baseline.output_hash == candidate.output_hash;
        let shared_prefix = if identical {
            1.0
        } else {
            shared_prefix(
                baseline.text.as_deref().unwrap_or(""),
                candidate.text.as_deref().unwrap_or(""),
            )
        };
        Self {
            id,
            identical,
            shared_prefix,
            ttft_ms_delta: delta(|a| a.ttft_ms),
            tpot_ms_delta: delta(|a| a.tpot_ms),
            repetition_rate_delta: delta(|a| a.repetition_rate),
            mean_logprob_delta: delta(|a| a.mean_logprob),
            refusal: (baseline.refusal, candidate.refusal),
            baseline,
            candidate,
        }
    }
}

/// Share of `a`'s words that come before `a` and `b` first differ.
pub fn shared_prefix(a: &str, b: &str) -> f64 {
    let a: Vec<&str> = a.split_whitespace().collect();
    let b: Vec<&str> = b.split_whitespace().collect();
    if a.is_empty() {
        return if b.is_empty() { 1.0 } else { 0.0 };
    }
    let same = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    same as f64 / a.len() as f64
}

/// What all rows say together.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Prompts both sides answered.
    pub compared: usize,
    /// Prompts a side failed on.
    pub failed: usize,
    pub identical: usize,
    pub identical_share: f64,
    pub mean_shared_prefix: f64,
    pub ttft_ms_delta_median: Option<f64>,
    pub tpot_ms_delta_median: Option<f64>,
    pub repetition_rate_delta_mean: Option<f64>,
    pub mean_logprob_delta_mean: Option<f64>,
    pub refusals_baseline: usize,
    pub refusals_candidate: usize,
    pub baseline_fingerprint: Option<String>,
    pub candidate_fingerprint: Option<String>,
    /// Per figure, the median of candidate minus baseline over the prompts, its 95%
    /// interval and the verdict: the statistics of a live shadow's (`crate::shadow`).
    pub verdicts: Vec<FigureVerdict>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub summary: Summary,
    pub rows: Vec<Row>,
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

impl Comparison {
    pub fn new(rows: Vec<Row>) -> Self {
        let ok: Vec<&Row> = rows
            .iter()
            .filter(|r| r.baseline.error.is_none() && r.candidate.error.is_none())
            .collect();
        let collect =
            |f: fn(&Row) -> Option<f64>| ok.iter().filter_map(|r| f(r)).collect::<Vec<_>>();
        let identical = ok.iter().filter(|r| r.identical).count();
        let count_refusals =
            |side: fn(&Row) -> Option<bool>| ok.iter().filter(|r| side(r) == Some(true)).count();
        let fingerprint = |side: fn(&Row) -> &SideAnswer| {
            ok.iter().find_map(|r| side(r).system_fingerprint.clone())
        };
        let summary = Summary {
            compared: ok.len(),
            failed: rows.len() - ok.len(),
            identical,
            identical_share: if ok.is_empty() {
                0.0
            } else {
                identical as f64 / ok.len() as f64
            },
            mean_shared_prefix: mean(&ok.iter().map(|r| r.shared_prefix).collect::<Vec<_>>())
                .unwrap_or(0.0),
            ttft_ms_delta_median: median(collect(|r| r.ttft_ms_delta)),
            tpot_ms_delta_median: median(collect(|r| r.tpot_ms_delta)),
            repetition_rate_delta_mean: mean(&collect(|r| r.repetition_rate_delta)),
            mean_logprob_delta_mean: mean(&collect(|r| r.mean_logprob_delta)),
            refusals_baseline: count_refusals(|r| r.refusal.0),
            refusals_candidate: count_refusals(|r| r.refusal.1),
            baseline_fingerprint: fingerprint(|r| &r.baseline),
            candidate_fingerprint: fingerprint(|r| &r.candidate),
            verdicts: FIGURES
                .iter()
                .map(|(name, better, margin, figure)| {
                    let pairs: Vec<(f64, f64)> = ok
                        .iter()
                        .filter_map(|r| Some((figure(&r.baseline)?, figure(&r.candidate)?)))
                        .collect();
                    verdict(name, &pairs, *better, *margin)
                })
                .collect(),
        };
        Self { summary, rows }
    }

    /// The human-readable table: one line per prompt, then the summary.
    pub fn table(&self) -> String {
        let num = |v: Option<f64>, digits: usize| {
            v.map_or_else(|| "-".to_owned(), |v| format!("{v:+.digits$}"))
        };
        let flag = |v: Option<bool>| match v {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        };
        let mut out = format!(
            "{:<28} {:>5} {:>7} {:>10} {:>9} {:>7} {:>9} {:>9}\n",
            "prompt", "same", "prefix", "dTTFT ms", "dTPOT ms", "dRep", "refusal", "dLogprob"
        );
        for r in &self.rows {
            if let Some(error) = r.baseline.error.as_ref().or(r.candidate.error.as_ref()) {
                out.push_str(&format!("{:<28} failed: {error}\n", r.id));
                continue;
            }
            out.push_str(&format!(
                "{:<28} {:>5} {:>6.0}% {:>10} {:>9} {:>7} {:>9} {:>9}\n",
                r.id.chars().take(28).collect::<String>(),
                if r.identical { "yes" } else { "no" },
                r.shared_prefix * 100.0,
                num(r.ttft_ms_delta, 1),
                num(r.tpot_ms_delta, 2),
                num(r.repetition_rate_delta, 3),
                format!("{}>{}", flag(r.refusal.0), flag(r.refusal.1)),
                num(r.mean_logprob_delta, 3),
            ));
        }
        let s = &self.summary;
        out.push_str(&format!(
            "\n{} of {} answers identical ({:.0}%), {:.0}% of words shared before the first difference on average; {} failed.\n",
            s.identical,
            s.compared,
            s.identical_share * 100.0,
            s.mean_shared_prefix * 100.0,
            s.failed
        ));
        out.push_str(&format!(
            "Candidate minus baseline: TTFT {} ms and TPOT {} ms (medians), repetition rate {} and mean token log-probability {} (means); refusals {} -> {}.\n",
            num(s.ttft_ms_delta_median, 1),
            num(s.tpot_ms_delta_median, 2),
            num(s.repetition_rate_delta_mean, 3),
            num(s.mean_logprob_delta_mean, 3),
            s.refusals_baseline,
            s.refusals_candidate
        ));
        out.push_str(&format!(
            "Fingerprints: baseline {}, candidate {}.\n",
            s.baseline_fingerprint.as_deref().unwrap_or("-"),
            s.candidate_fingerprint.as_deref().unwrap_or("-")
        ));
        out.push_str("\nCandidate minus baseline, per figure (the median for times and tokens, the mean for rates; 95% bootstrap interval):\n");
        out.push_str(&table(&s.verdicts));
        out
    }
}

/// Asks one gateway one prompt, non-streamed, and reads its answer and timings.
async fn ask(
    client: &reqwest::Client,
    base: &str,
    args: &CompareArgs,
    messages: &Value,
) -> SideAnswer {
    let body = serde_json::json!({
        "model": args.model,
        "messages": messages,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
    });
    let mut request = client
        .post(format!(
            "{}/v1/chat/completions",
            base.trim_end_matches('/')
        ))
        .json(&body);
    if let Some(key) = &args.api_key {
        request = request.bearer_auth(key);
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(error) => return SideAnswer::failed(error.to_string()),
    };
    let status = response.status();
    match response.json::<Value>().await {
        Ok(body) if status.is_success() => SideAnswer::from_response(&body),
        Ok(body) => SideAnswer::failed(format!(
            "status {status}: {}",
            body["error"]["message"].as_str().unwrap_or("")
        )),
        Err(error) => SideAnswer::failed(format!("status {status}: {error}")),
    }
}

/// Sends every prompt of the set to both gateways, alternating which goes first so that
/// neither always meets a warmer cache.
pub async fn compare_gateways(args: &CompareArgs) -> anyhow::Result<Comparison> {
    let (Some(baseline), Some(candidate)) = (&args.baseline, &args.candidate) else {
        anyhow::bail!("--baseline and --candidate are both needed");
    };
    let prompts = crate::bench::load_prompt_set(&args.prompts)?;
    let client = reqwest::Client::new();
    let mut rows = Vec::with_capacity(prompts.len());
    for (i, (id, messages)) in prompts.iter().enumerate() {
        let (b, c) = if i % 2 == 0 {
            let b = ask(&client, baseline, args, messages).await;
            (b, ask(&client, candidate, args, messages).await)
        } else {
            let c = ask(&client, candidate, args, messages).await;
            (ask(&client, baseline, args, messages).await, c)
        };
        rows.push(Row::new(id.clone(), b, c));
    }
    Ok(Comparison::new(rows))
}

/// The semantic-log documents of an NDJSON export (`_bulk` form: an action line, then
/// the document), from a file or every `*.ndjson` file of a folder.
fn documents(path: &Path) -> anyhow::Result<Vec<Value>> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "ndjson"))
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| anyhow::anyhow!("could not read {}: {e}", file.display()))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let value: Value = serde_json::from_str(line)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            // Action lines ({"create": ...}) have no `llm` object.
            if value.get("llm").is_some() {
                docs.push(value);
            }
        }
    }
    Ok(docs)
}

/// Compares the answers two fingerprints gave to the same requests (same
/// `llm.input_hash`) in a semantic-log export; the last answer of each counts.
pub fn compare_semlog(args: &CompareArgs) -> anyhow::Result<Comparison> {
    let (Some(path), Some(base_fp), Some(cand_fp)) = (
        &args.semlog,
        &args.baseline_fingerprint,
        &args.candidate_fingerprint,
    ) else {
        anyhow::bail!("--semlog needs --baseline-fingerprint and --candidate-fingerprint");
    };
    let mut baseline = std::collections::BTreeMap::new();
    let mut candidate = std::collections::BTreeMap::new();
    for doc in documents(path)? {
        let llm = &doc["llm"];
        let (Some(input), Some(fp)) = (
            llm["input_hash"].as_str(),
            llm["system_fingerprint"].as_str(),
        ) else {
            continue;
        };
        if llm["status"].as_str() != Some("ok") {
            continue;
        }
        let side = if fp == base_fp {
            &mut baseline
        } else if fp == cand_fp {
            &mut candidate
        } else {
            continue;
        };
        side.insert(input.to_owned(), SideAnswer::from_document(llm));
    }
    let rows: Vec<Row> = baseline
        .into_iter()
        .filter_map(|(input, b)| {
            let c = candidate.remove(&input)?;
            Some(Row::new(input.chars().take(12).collect(), b, c))
        })
        .collect();
    anyhow::ensure!(
        !rows.is_empty(),
        "no request in {} was answered under both {base_fp} and {cand_fp}",
        path.display()
    );
    Ok(Comparison::new(rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str, ttft: f64, rep: f64, refusal: bool, lp: f64) -> SideAnswer {
        SideAnswer {
            text: Some(text.into()),
            output_hash: Some(crate::record::output_hash(text)),
            ttft_ms: Some(ttft),
            tpot_ms: Some(20.0),
            repetition_rate: Some(rep),
            refusal: Some(refusal),
            mean_logprob: Some(lp),
            system_fingerprint: Some("fp_a".into()),
            error: None,
        }
    }

    #[test]
    fn rows_hold_agreement_and_deltas_and_the_summary_adds_them_up() {
        let same = Row::new(
            "a".into(),
            answer("Paris is the capital.", 100.0, 0.0, false, -0.5),
            answer("Paris is the capital.", 80.0, 0.0, false, -0.4),
        );
        assert!(same.identical);
        assert_eq!(same.shared_prefix, 1.0);
        assert_eq!(same.ttft_ms_delta, Some(-20.0));
        let other = Row::new(
            "b".into(),
            answer("one two three four", 100.0, 0.1, false, -1.0),
            answer("one two five six", 140.0, 0.3, true, -2.0),
        );
        assert!(!other.identical);
        assert_eq!(other.shared_prefix, 0.5);
        let failed = Row::new(
            "c".into(),
            SideAnswer::failed("down".into()),
            answer("x", 1.0, 0.0, false, 0.0),
        );
        let report = Comparison::new(vec![same, other, failed]);
        let s = &report.summary;
        assert_eq!((s.compared, s.failed, s.identical), (2, 1, 1));
        assert_eq!(s.identical_share, 0.5);
        assert_eq!(s.mean_shared_prefix, 0.75);
        assert_eq!(s.ttft_ms_delta_median, Some(10.0));
        assert!((s.repetition_rate_delta_mean.expect("mean") - 0.1).abs() < 1e-9);
        assert_eq!((s.refusals_baseline, s.refusals_candidate), (0, 1));
        let table = report.table();
        assert!(table.contains("1 of 2 answers identical (50%)"), "{table}");
        assert!(
            table.contains("c                            failed: down"),
            "{table}"
        );
    }

    #[test]
    fn a_semantic_log_export_is_compared_by_request() {
        let dir = tempfile::tempdir().expect("tempdir");
        let doc = |fp: &str, input: &str, out: &str, ttft: f64| {
            format!(
                "{{\"create\":{{\"_id\":\"x\"}}}}\n{}\n",
                serde_json::json!({"llm": {"status": "ok", "system_fingerprint": fp, "input_hash": input,
                    "output_hash": out, "ttft_ms": ttft, "repetition_rate": 0.0, "refusal": false,
                    "response_excerpt": out}})
            )
        };
        let text = [
            doc("fp_a", "in1", "same", 100.0),
            doc("fp_b", "in1", "same", 90.0),
            doc("fp_a", "in2", "old answer", 100.0),
            doc("fp_b", "in2", "new answer", 120.0),
            doc("fp_a", "in3", "only the baseline", 100.0),
            doc("fp_c", "in1", "another fingerprint", 1.0),
        ]
        .concat();
        std::fs::write(dir.path().join("requests-1.ndjson"), text).expect("write");
        let args = CompareArgs {
            baseline: None,
            candidate: None,
            semlog: Some(dir.path().to_owned()),
            baseline_fingerprint: Some("fp_a".into()),
            candidate_fingerprint: Some("fp_b".into()),
            model: "m".into(),
            prompts: PathBuf::new(),
            max_tokens: 1,
            temperature: 0.0,
            seed: 0,
            api_key: None,
            min_agreement: None,
            json: None,
            live: None,
            gateway: String::new(),
            fail_on_worse: false,
        };
        let report = compare_semlog(&args).expect("report");
        assert_eq!(report.summary.compared, 2);
        assert_eq!(report.summary.identical, 1);
        assert_eq!(report.summary.ttft_ms_delta_median, Some(5.0));
        let missing = CompareArgs {
            candidate_fingerprint: Some("fp_nobody".into()),
            ..args
        };
        assert!(compare_semlog(&missing).is_err());
    }
}

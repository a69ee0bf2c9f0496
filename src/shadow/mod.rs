//! Shadow traffic: a share of a served model's live requests also goes to a candidate
//! (another served model: in this process, an upstream, a fleet), whose answer the client
//! never sees, and the two answers are compared request by request.
//!
//! - [`Shadows`]: which requests are shadowed (every 1/share-th, spread evenly) and
//!   whether one may start: under its own cap (`shadow.max_in_flight`) and only while the
//!   gateway has room (under half its `server.max_in_flight`), else dropped and counted.
//!   The copy has the client's parameters and seed; it is timed, scored and logged as
//!   any request (its record names the pair), and is charged to no key.
//! - [`Pairs`]: the two records of a pair, whichever ends first, made one
//!   [`compare::Comparison`]; the last [`WINDOW`] of each pair, with each figure's
//!   [`verdict`], for `/stats` and `llmgate compare --live`.

pub mod compare;
pub mod split;
pub mod verdict;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::admission::{Admission, Permit};

use crate::record::{RequestRecord, ShadowLink, ShadowSide};
use compare::{Comparison, SideFigures};
use verdict::{verdict, Better, FigureOf, FigureVerdict, Margin};

/// Comparisons kept per pair for the verdict.
pub const WINDOW: usize = 1_000;
/// A side whose other never ended is forgotten after this.
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

/// Why a shadow request was not sent, or was stopped: the `reason` of
/// `llmgate_shadow_dropped_total`. `shed`: stopped while it ran, to make way for clients.
pub const DROP_REASONS: [&str; 3] = ["busy", "load", "shed"];

/// A served model's shadow as the config sets it (`shadow = { model, share,
/// max_in_flight }` on a `[[models]]` entry), checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowPolicy {
    pub candidate: String,
    pub share: f64,
    pub max_in_flight: usize,
}

/// One served model's shadow.
#[derive(Debug)]
pub struct Shadow {
    pub primary: String,
    pub candidate: String,
    share: f64,
    seen: AtomicU64,
    /// The copies in flight, under `shadow.max_in_flight`: their own count, not the
    /// clients' (`server.max_in_flight`), so a copy never takes a client's place.
    copies: Admission,
}

impl Shadow {
    /// Whether the next request is one of the share, spread evenly: with 0.2, the 5th,
    /// 10th, ...
    pub fn picks(&self) -> bool {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) as f64;
        ((n + 1.0) * self.share).floor() > (n * self.share).floor()
    }

    /// A place for one copy, or why there is none: the gateway is crowded (`load`, see
    /// [`Shadow::crowded`]), or `shadow.max_in_flight` copies are in flight (`busy`).
    pub fn try_start(&self, crowded: bool) -> Result<Permit, &'static str> {
        if crowded {
            return Err("load");
        }
        self.copies.try_admit().ok_or("busy")
    }

    /// Whether copies must make way for clients: the clients' requests in flight
    /// (`clients`) fill over half the gateway's `limit`, or any request waits for a slot
    /// in the candidate's engine (`candidate_waiting`): a client behind a copy, or a
    /// copy behind clients. Copies run on idle capacity only.
    pub fn crowded(&self, clients: usize, limit: usize, candidate_waiting: usize) -> bool {
        clients * 2 > limit || candidate_waiting > 0
    }

    /// The links of a new pair: the client's request and its copy, under an id of
    /// their own (the client's request id may repeat).
    pub fn links(&self) -> (ShadowLink, ShadowLink) {
        let pair_id = uuid::Uuid::new_v4().simple().to_string();
        let link = |side| ShadowLink {
            pair_id: pair_id.clone(),
            primary: self.primary.clone(),
            candidate: self.candidate.clone(),
            side,
        };
        (link(ShadowSide::Primary), link(ShadowSide::Candidate))
    }
}

/// Every served model's shadow, by the primary's id.
#[derive(Debug, Default)]
pub struct Shadows(HashMap<String, Arc<Shadow>>);

impl Shadows {
    pub fn new<'a>(policies: impl IntoIterator<Item = (&'a str, &'a ShadowPolicy)>) -> Self {
        Self(
            policies
                .into_iter()
                .map(|(primary, p)| {
                    let shadow = Shadow {
                        primary: primary.to_owned(),
                        candidate: p.candidate.clone(),
                        share: p.share,
                        seen: AtomicU64::new(0),
                        copies: Admission::new(p.max_in_flight),
                    };
                    (primary.to_owned(), Arc::new(shadow))
                })
                .collect(),
        )
    }

    pub fn of(&self, model: &str) -> Option<&Arc<Shadow>> {
        self.0.get(model)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Shadow>> {
        self.0.values()
    }
}

/// The pair of models a window is of: primary, candidate.
type PairKey = (String, String);

/// The figures a verdict is given on, with which way is better and what margin counts.
const FIGURES: [FigureOf<SideFigures>; 8] = [
    ("ttft_ms", Better::Lower, Margin::Time, |s| s.ttft_ms),
    ("tpot_ms", Better::Lower, Margin::Time, |s| s.tpot_ms),
    ("itl_p95_ms", Better::Lower, Margin::Time, |s| s.itl_p95_ms),
    ("e2e_ms", Better::Lower, Margin::Time, |s| Some(s.e2e_ms)),
    ("repetition_rate", Better::Lower, Margin::Rate, |s| {
        s.repetition_rate
    }),
    ("refusal", Better::Lower, Margin::Rate, |s| {
        s.refusal.map(f64::from)
    }),
    ("mean_logprob", Better::Higher, Margin::Rate, |s| {
        s.mean_logprob
    }),
    ("completion_tokens", Better::Neither, Margin::Tokens, |s| {
        Some(f64::from(s.completion_tokens))
    }),
];

/// A pair's window, as `/stats` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PairView {
    pub primary: String,
    pub candidate: String,
    /// Comparisons in the window (both sides ended).
    pub compared: usize,
    /// Of those, the answers identical, different, or one side failed.
    pub identical: usize,
    pub different: usize,
    pub failed: usize,
    /// Mean word-level edit distance of the answers both gave.
    pub mean_edit_distance: Option<f64>,
    /// Each figure: candidate minus primary, its interval and the verdict.
    pub figures: Vec<FigureVerdict>,
    /// The newest comparison.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub last: Option<Comparison>,
}

#[derive(Default)]
struct PairWindow {
    comparisons: VecDeque<Arc<Comparison>>,
}

/// How long `/stats` shows the same verdicts before they are computed again: a window's
/// bootstraps take tens of milliseconds, and the page asks every two seconds.
const VIEWS_KEPT: Duration = Duration::from_secs(5);

/// A pair whose two records are not both in yet.
struct Open {
    since: Instant,
    primary: Option<Box<SideFigures>>,
    candidate: Option<Box<SideFigures>>,
    /// The copy was stopped to make way for clients: neither side is compared.
    shed: bool,
}

/// The pairs not both ended, and each pair's window.
#[derive(Default)]
pub struct Pairs {
    open: Mutex<HashMap<String, Open>>,
    windows: Mutex<HashMap<PairKey, PairWindow>>,
    views: Mutex<Option<(Instant, Vec<PairView>)>>,
}

impl std::fmt::Debug for Pairs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pairs").finish_non_exhaustive()
    }
}

impl Pairs {
    /// A new pair, before either side can end; pairs open longer than
    /// [`FORGET_AFTER`] (a side that never ended) are forgotten.
    pub fn open(&self, pair_id: &str) {
        let now = Instant::now();
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|_, pair| now.duration_since(pair.since) < FORGET_AFTER);
        let pair = Open {
            since: now,
            primary: None,
            candidate: None,
            shed: false,
        };
        open.insert(pair_id.to_owned(), pair);
    }

    /// Takes a record of a shadowed request; the comparison once both sides have ended.
    pub fn observe(&self, record: &RequestRecord) -> Option<Arc<Comparison>> {
        let link = record.shadow.as_ref()?;
        let side = Box::new(SideFigures::of(record));
        let (primary, candidate) = {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            // A pair not opened here, or forgotten: nothing to pair it with.
            let pair = open.get_mut(&link.pair_id)?;
            match link.side {
                ShadowSide::Primary => pair.primary = Some(side),
                ShadowSide::Candidate => pair.candidate = Some(side),
            }
            if pair.primary.is_none() || pair.candidate.is_none() {
                return None;
            }
            let pair = open.remove(&link.pair_id)?;
            if pair.shed {
                return None;
            }
            (*pair.primary?, *pair.candidate?)
        };
        let mut comparison = Comparison::of(link.pair_id.clone(), primary, candidate);
        // Compared: the texts would only weigh on the window.
        comparison.primary.text = String::new();
        comparison.candidate.text = String::new();
        let comparison = Arc::new(comparison);
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let window = windows
            .entry((link.primary.clone(), link.candidate.clone()))
            .or_default();
        if window.comparisons.len() == WINDOW {
            window.comparisons.pop_front();
        }
        window.comparisons.push_back(Arc::clone(&comparison));
        Some(comparison)
    }

    /// Marks pair `pair_id`'s copy as stopped, so that neither side is compared; false
    /// when its record is in already (it ended: there is nothing to stop).
    pub fn shed(&self, pair_id: &str) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        match open.get_mut(pair_id) {
            Some(pair) if pair.candidate.is_none() && !pair.shed => {
                pair.shed = true;
                true
            }
            _ => false,
        }
    }

    /// Every pair's window with its verdicts, as computed at most [`VIEWS_KEPT`] ago.
    pub fn views(&self) -> Vec<PairView> {
        let mut kept = self.views.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, views)) = kept.as_ref().filter(|(at, _)| at.elapsed() < VIEWS_KEPT) {
            return views.clone();
        }
        let views = self.compute_views();
        *kept = Some((Instant::now(), views.clone()));
        views
    }

    fn compute_views(&self) -> Vec<PairView> {
        let windows: Vec<(PairKey, Vec<Arc<Comparison>>)> = {
            let windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
            windows
                .iter()
                .map(|(pair, w)| (pair.clone(), w.comparisons.iter().cloned().collect()))
                .collect()
        };
        let mut views: Vec<PairView> = windows
            .into_iter()
            .map(|((primary, candidate), comparisons)| view(primary, candidate, &comparisons))
            .collect();
        views.sort_by(|a, b| (&a.primary, &a.candidate).cmp(&(&b.primary, &b.candidate)));
        views
    }
}

fn view(primary: String, candidate: String, comparisons: &[Arc<Comparison>]) -> PairView {
    let count = |outcome| {
        comparisons
            .iter()
            .filter(|c| c.outcome() == outcome)
            .count()
    };
    let distances: Vec<f64> = comparisons
        .iter()
        .filter_map(|c| c.difference.as_ref().map(|d| d.edit_distance))
        .collect();
    let answered: Vec<&Arc<Comparison>> = comparisons
        .iter()
        .filter(|c| c.difference.is_some())
        .collect();
    let figures = FIGURES
        .iter()
        .map(|(name, better, margin, figure)| {
            let pairs: Vec<(f64, f64)> = answered
                .iter()
                .filter_map(|c| Some((figure(&c.primary)?, figure(&c.candidate)?)))
                .collect();
            verdict(name, &pairs, *better, *margin)
        })
        .collect();
    PairView {
        primary,
        candidate,
        compared: comparisons.len(),
        identical: count("identical"),
        different: count("different"),
        failed: count("failed"),
        mean_edit_distance: (!distances.is_empty())
            .then(|| distances.iter().sum::<f64>() / distances.len() as f64),
        figures,
        last: comparisons.last().map(|c| (**c).clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_give_way_when_clients_fill_half_or_anything_waits() {
        let policy = ShadowPolicy {
            candidate: "b".into(),
            share: 1.0,
            max_in_flight: 2,
        };
        let shadows = Shadows::new([("a", &policy)]);
        let shadow = shadows.of("a").expect("a's shadow");
        assert!(!shadow.crowded(2, 4, 0), "half full");
        assert!(shadow.crowded(3, 4, 0), "over half full");
        let _copy = shadow.try_start(false).expect("a place");
        assert!(
            shadow.crowded(1, 4, 1),
            "a client behind the copy, or it behind one"
        );
        assert_eq!(shadow.try_start(true).map(drop), Err("load"));
        let _second = shadow.try_start(false).expect("a second place");
        assert_eq!(shadow.try_start(false).map(drop), Err("busy"));
    }
}

//! Per-request latency bookkeeping: TTFT, TPOT, inter-token latency, e2e, queue time and
//! the time spent waiting for the client.
//!
//! Two kinds of moment are stamped on the injected [`Clock`]: those of the engine (it
//! started the request; it handed over a token, stamped by the engine itself so a
//! client that reads slowly cannot move them) and those of the transport (a frame was
//! handed to it). When the request ends, [`RequestTimer::finish`] turns the stamps into
//! [`Timings`], which travel in the final chunk, the request log line, the metrics and
//! the semantic log. Definitions, as in docs/timings.md:
//!
//! - TTFT: `t_recv` -> the first frame carrying output of any kind (content, reasoning,
//!   a tool call) is handed to the transport (what the client sees). The kinds apart:
//!   [`kinds`] and docs/timings.md, "Reasoning and tool calls".
//! - engine TTFT: the engine starts the request (its slot is acquired) -> its first token.
//! - queue: `t_recv` -> the engine starts the request.
//! - TPOT: `(t_last_token - t_first_token) / (output_tokens - 1)`, engine stamps; absent
//!   below 2 tokens.
//! - ITL: every gap between consecutive token events with text, engine stamps. An
//!   upstream's event is one streamed chunk: where a chunk carries several tokens, its
//!   gap is one sample (the time the tokens really took to arrive), never divided into
//!   made-up per-token gaps; TPOT, from the token count, stays per token.
//! - upstream TTFT (upstream models): the request sent upstream -> its first content
//!   chunk, the upstream's share of TTFT.
//! - e2e: `t_recv` -> the final frame is handed to the transport.
//! - client wait (streams): time the transport spent blocked because the client had not
//!   taken the previous frames.
//! - chunks: the token events with text (an upstream's content chunks, those whose
//!   bytes came in one read as one; one per engine step in process). Fewer chunks than
//!   tokens means tokens came bunched, and the gaps inside a chunk are not measured.
//! - delivery: for each chunk, from its engine stamp (in process: when its token was
//!   picked; an upstream's: when it reached the gateway) to the gateway's stream taking
//!   it, just before its frame is handed to the transport: what the gateway's own
//!   runtime adds, and on a starved machine the lag that bunches tokens.
//! - overhead: what the gateway added to the request's end, less the network: `t_recv`
//!   -> the engine starts it (less the wait for an in-process engine's slot), plus the
//!   engine's last token (its stamp) -> the end, less the time blocked on the client.
//!   What a client measures as added over the model alone at the end of the response;
//!   at the first token the same share is `ttft - engine_ttft` (`ttft - upstream_ttft`).
//!
//! [`Clock`]: crate::clock::Clock

mod kinds;

use std::time::Duration;

use serde::Serialize;

pub use kinds::{KindClock, KindTimings, OutputKind, TokensByKind, TpotByKind};

/// Timestamps of one request, as offsets on the gateway's clock.
#[derive(Debug, Clone)]
pub struct RequestTimer {
    t_recv: Duration,
    t_submit: Option<Duration>,
    /// The engine has rendered and counted the prompt (the end of tokenisation).
    t_prepared: Option<Duration>,
    /// The engine started the request: the start of engine TTFT, the end of queue.
    t_started: Option<Duration>,
    /// First token event from the engine, content or not: the end of engine TTFT.
    t_engine_first: Option<Duration>,
    /// Last token event of any kind: the final token (end of sequence) often carries no
    /// text, yet TPOT's span must end at it.
    t_last_token: Option<Duration>,
    /// Last token event with text, for the ITL gaps.
    t_last_text: Option<Duration>,
    /// The first and last frames carrying output of any kind (content, reasoning, a
    /// tool call): TTFT ends at the first.
    t_first_frame: Option<Duration>,
    t_last_frame: Option<Duration>,
    /// Gaps between consecutive tokens with text, in order.
    itl: Vec<Duration>,
    /// Token events with text.
    chunks: u32,
    /// Each chunk's wait from its engine stamp to the stream taking it.
    delivery: Vec<Duration>,
    /// Time blocked on the client, when the transport measures it (streams).
    client_wait: Option<Duration>,
    /// The engine is an upstream server: its TTFT is also `upstream_ttft`.
    upstream: bool,
    /// The stream took the engine's last event (the end of the answer).
    t_engine_done: Option<Duration>,
    /// The moments of reasoning, answer and tool-call output, each apart.
    kinds: KindClock,
    /// The engine's own count of reasoning tokens, where it gave one.
    reported_reasoning: Option<u32>,
}

/// The latency figures of one finished request, in milliseconds. Serialised as the
/// `timings` extension object of the final chunk and of non-streamed responses.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = Latency)]
pub struct Timings {
    /// Request received -> first content byte written (streams) or ready (non-streamed).
    pub ttft_ms: Option<f64>,
    /// Engine started the request -> its first token.
    pub engine_ttft_ms: Option<f64>,
    /// (last token - first token) / (output tokens - 1).
    pub tpot_ms: Option<f64>,
    /// Request received -> response finished.
    pub e2e_ms: f64,
    /// Waiting for an engine slot.
    pub queue_ms: Option<f64>,
    /// Gaps between content chunks as the client got them.
    pub itl_ms: Option<ItlStats>,
    /// Output tokens per second of the whole request (`output_tokens / e2e`).
    pub tokens_per_second: Option<f64>,
    pub output_tokens: u32,
    /// Chunks with text the engine handed over: below `output_tokens`, tokens came
    /// several to a chunk and TPOT and ITL measure their arrival, not their making.
    pub chunks: u32,
    /// From each chunk's engine stamp to the gateway's stream taking it (the gateway's
    /// own delay; large on a starved machine).
    pub delivery_ms: Option<ItlStats>,
    /// Streams: how long frames waited for the client to take earlier ones.
    pub client_wait_ms: Option<f64>,
    /// Upstream models: the request was sent upstream -> its first content chunk
    /// reached the gateway.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub upstream_ttft_ms: Option<f64>,
    /// What the gateway added to the end of the request: `e2e_ms` less the model's
    /// part (from its start to its last token) and the client's (`client_wait_ms`).
    pub overhead_ms: f64,
    /// For a reasoning model or a tool call: the times of each kind of output.
    #[serde(flatten)]
    pub kinds: KindTimings,
}

/// When each phase of a request began, as readings of the gateway's clock: the span
/// timestamps of its trace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases {
    pub received: Duration,
    pub submitted: Option<Duration>,
    /// The prompt was rendered and counted (and a grammar compiled): the end of
    /// tokenisation, the start of the wait for an engine slot.
    pub prepared: Option<Duration>,
    pub started: Option<Duration>,
    pub first_token: Option<Duration>,
    pub last_token: Option<Duration>,
    pub ended: Duration,
}

/// Summary of the inter-token gaps of one request.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ItlStats {
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
}

impl RequestTimer {
    /// Starts timing at `t_recv`, the moment the handler received the request.
    pub fn start(t_recv: Duration) -> Self {
        Self {
            t_recv,
            t_submit: None,
            t_prepared: None,
            t_started: None,
            t_engine_first: None,
            t_last_token: None,
            t_last_text: None,
            t_first_frame: None,
            t_last_frame: None,
            itl: Vec::new(),
            chunks: 0,
            delivery: Vec::new(),
            client_wait: None,
            upstream: false,
            t_engine_done: None,
            kinds: KindClock::default(),
            reported_reasoning: None,
        }
    }

    /// The engine is an upstream: its start is the request being sent, its first token
    /// the first content chunk arriving, and the span between is `upstream_ttft`.
    pub fn engine_is_upstream(&mut self) {
        self.upstream = true;
    }

    /// Forgets the answer's token moments: it starts over at another upstream replica
    /// (the first failed midway, before the client had any of it), and its TTFT, TPOT
    /// and gaps are the answer the client gets.
    pub fn restart_answer(&mut self) {
        self.t_engine_first = None;
        self.t_last_token = None;
        self.t_last_text = None;
        self.t_first_frame = None;
        self.t_last_frame = None;
        self.itl.clear();
        self.chunks = 0;
        self.delivery.clear();
        self.kinds = KindClock::default();
    }

    /// The request was handed to the engine (it may wait there for a slot).
    pub fn engine_submitted(&mut self, at: Duration) {
        self.t_submit.get_or_insert(at);
    }

    /// The engine has rendered and counted the prompt.
    pub fn prompt_prepared(&mut self, at: Duration) {
        self.t_prepared.get_or_insert(at);
    }

    /// The engine started the request: its slot was acquired.
    pub fn engine_started(&mut self, at: Duration) {
        self.t_started.get_or_insert(at);
    }

    /// The engine handed over a token event at `at`, with text or not.
    pub fn engine_token(&mut self, at: Duration, has_text: bool) {
        if has_text {
            self.kinds.engine_output(OutputKind::Answer, at, 0);
        }
        self.output_at(at, has_text);
    }

    /// The engine handed over `tokens` tokens of reasoning or of a tool call at `at`:
    /// output like any token for TTFT, TPOT and ITL, and timed by its kind.
    pub fn engine_output(&mut self, kind: OutputKind, at: Duration, tokens: u32) {
        self.kinds.engine_output(kind, at, tokens);
        self.output_at(at, true);
    }

    /// The engine's own count of the answer's reasoning tokens.
    pub fn reasoning_reported(&mut self, tokens: Option<u32>) {
        self.reported_reasoning = tokens;
    }

    fn output_at(&mut self, at: Duration, has_text: bool) {
        self.t_engine_first.get_or_insert(at);
        self.t_last_token = Some(at);
        if has_text {
            self.chunks += 1;
            if let Some(prev) = self.t_last_text {
                self.itl.push(at.saturating_sub(prev));
            }
            self.t_last_text = Some(at);
        }
    }

    /// A chunk with text stamped by the engine `waited` ago was taken by the stream.
    pub fn delivered(&mut self, waited: Duration) {
        self.delivery.push(waited);
    }

    /// The stream took the engine's last event: the answer is complete.
    pub fn engine_done(&mut self, at: Duration) {
        self.t_engine_done.get_or_insert(at);
    }

    /// A frame carrying non-empty content was handed to the transport.
    pub fn content_sent(&mut self, at: Duration) {
        self.frame_sent(OutputKind::Answer, at);
    }

    /// A frame carrying output of `kind` was handed to the transport.
    pub fn frame_sent(&mut self, kind: OutputKind, at: Duration) {
        self.kinds.frame_sent(kind, at);
        self.t_first_frame.get_or_insert(at);
        self.t_last_frame = Some(at);
    }

    /// The transport waited `waited` for the client to take earlier frames. Called once
    /// with zero when a stream starts, so a stream always reports its wait.
    pub fn client_waited(&mut self, waited: Duration) {
        *self.client_wait.get_or_insert(Duration::ZERO) += waited;
    }

    /// While the answer streams: the engine's time to its first token (from the start of
    /// the request in the engine, for an upstream from the send), and the time from
    /// the first token to the last so far. `None` before the first token.
    pub fn decoding_so_far(&self) -> Option<(Duration, Duration)> {
        let first = self.t_engine_first?;
        let started = self.t_started.unwrap_or(self.t_recv);
        let last = self.t_last_token.unwrap_or(first);
        Some((first.saturating_sub(started), last.saturating_sub(first)))
    }

    /// `t_recv` on the gateway's clock.
    pub fn received(&self) -> Duration {
        self.t_recv
    }

    /// The clock readings of the request's phases, with `t_end` its end.
    pub fn phases(&self, t_end: Duration) -> Phases {
        Phases {
            received: self.t_recv,
            submitted: self.t_submit,
            prepared: self.t_prepared,
            started: self.t_started,
            first_token: self.t_engine_first,
            last_token: self.t_last_frame.max(self.t_last_token),
            ended: t_end,
        }
    }

    /// Every gap between consecutive tokens with text, in order, moved out once the
    /// timings are computed (for the ITL histogram).
    pub fn take_gaps(&mut self) -> Vec<Duration> {
        std::mem::take(&mut self.itl)
    }

    /// Computes the figures, with `t_end` the moment the final frame was handed over
    /// and `output_tokens` the completion tokens the engine reported.
    pub fn finish(&self, t_end: Duration, output_tokens: u32) -> Timings {
        let since_recv = |t: Duration| t.saturating_sub(self.t_recv);
        let e2e = since_recv(t_end);
        let tpot = match (self.t_engine_first, self.t_last_token, output_tokens) {
            (Some(first), Some(last), n) if n >= 2 => Some(last.saturating_sub(first) / (n - 1)),
            _ => None,
        };
        let engine_ttft = match (self.t_started, self.t_engine_first) {
            (Some(started), Some(first)) => Some(first.saturating_sub(started)),
            _ => None,
        };
        let tokens_per_second = (output_tokens > 0 && !e2e.is_zero())
            .then(|| f64::from(output_tokens) / e2e.as_secs_f64());
        Timings {
            ttft_ms: self.t_first_frame.map(|t| ms(since_recv(t))),
            engine_ttft_ms: engine_ttft.map(ms),
            tpot_ms: tpot.map(ms),
            e2e_ms: ms(e2e),
            queue_ms: self.t_started.map(|t| ms(since_recv(t))),
            itl_ms: itl_stats(&self.itl),
            tokens_per_second: tokens_per_second.map(round3),
            output_tokens,
            chunks: self.chunks,
            delivery_ms: itl_stats(&self.delivery),
            client_wait_ms: self.client_wait.map(ms),
            upstream_ttft_ms: engine_ttft.filter(|_| self.upstream).map(ms),
            overhead_ms: ms(self.overhead(t_end)),
            kinds: self
                .kinds
                .figures(self.t_recv, output_tokens, self.reported_reasoning)
                .into(),
        }
    }

    /// What the gateway added up to `t_end` (see the module's definitions).
    fn overhead(&self, t_end: Duration) -> Duration {
        let Some(started) = self.t_started else {
            // It never reached the engine: all of it was the gateway's.
            return t_end.saturating_sub(self.t_recv);
        };
        // An upstream request waits for nothing between being prepared and sent (choosing
        // the replica is the gateway's work); an in-process one waits for a slot.
        let slot_wait = match self.t_prepared {
            Some(prepared) if !self.upstream => started.saturating_sub(prepared),
            _ => Duration::ZERO,
        };
        let before = started
            .saturating_sub(self.t_recv)
            .saturating_sub(slot_wait);
        // The model's part ends at its last token; without one, when its end came, and
        // without that (a failure) it ran until now.
        let model_done = self.t_last_token.or(self.t_engine_done).unwrap_or(t_end);
        let after = t_end.saturating_sub(model_done.max(started));
        (before + after).saturating_sub(self.client_wait.unwrap_or_default())
    }
}

/// Milliseconds with microsecond resolution.
fn ms(d: Duration) -> f64 {
    round3(d.as_secs_f64() * 1000.0)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn itl_stats(gaps: &[Duration]) -> Option<ItlStats> {
    if gaps.is_empty() {
        return None;
    }
    let mut sorted = gaps.to_vec();
    sorted.sort_unstable();
    Some(ItlStats {
        p50: ms(nearest_rank(&sorted, 0.50)),
        p95: ms(nearest_rank(&sorted, 0.95)),
        max: ms(sorted[sorted.len() - 1]),
    })
}

/// The nearest-rank `q` quantile of `sorted`, a non-empty slice (the gateway's and the
/// benchmark's).
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> T {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn no_tokens_has_e2e_only() {
        let mut timer = RequestTimer::start(at(100));
        timer.engine_submitted(at(101));
        let t = timer.finish(at(150), 0);
        assert_eq!(t.e2e_ms, 50.0);
        assert_eq!(t.ttft_ms, None);
        assert_eq!(t.tpot_ms, None);
        assert_eq!(t.engine_ttft_ms, None);
        assert_eq!(t.queue_ms, None);
        assert_eq!(t.itl_ms, None);
        assert_eq!(t.tokens_per_second, None);
        assert_eq!(t.client_wait_ms, None, "measured for streams only");
    }

    #[test]
    fn chunks_and_delivery_are_counted_apart_from_tokens() {
        let mut timer = RequestTimer::start(at(0));
        timer.engine_started(at(1));
        // 8 tokens in 3 chunks (as an upstream bunches them), the last event without text.
        for (t, waited) in [(10, 1), (12, 5), (40, 30)] {
            timer.engine_token(at(t), true);
            timer.delivered(at(waited));
        }
        timer.engine_token(at(41), false);
        timer.content_sent(at(11));
        let t = timer.finish(at(50), 8);
        assert_eq!((t.chunks, t.output_tokens), (3, 8));
        let delivery = t.delivery_ms.expect("delivery");
        assert_eq!((delivery.p50, delivery.max), (5.0, 30.0));
        assert_eq!(
            t.tpot_ms,
            Some(round3(31.0 / 7.0)),
            "per token, over the chunks' arrivals"
        );
        assert_eq!(
            RequestTimer::start(at(0)).finish(at(1), 0).delivery_ms,
            None
        );
    }

    #[test]
    fn one_token_has_ttft_but_no_tpot() {
        let mut timer = RequestTimer::start(at(0));
        timer.engine_submitted(at(2));
        timer.engine_started(at(12));
        timer.engine_token(at(40), true);
        timer.content_sent(at(41));
        let t = timer.finish(at(45), 1);
        assert_eq!(t.ttft_ms, Some(41.0));
        assert_eq!(
            t.engine_ttft_ms,
            Some(28.0),
            "from the slot, not the submit"
        );
        assert_eq!(t.queue_ms, Some(12.0));
        assert_eq!(t.tpot_ms, None, "TPOT is undefined below two tokens");
        assert_eq!(t.itl_ms, None);
        assert_eq!(t.e2e_ms, 45.0);
    }

    #[test]
    fn two_tokens_tpot_is_the_single_gap() {
        let mut timer = RequestTimer::start(at(0));
        timer.engine_token(at(300), true);
        timer.content_sent(at(300));
        timer.engine_token(at(325), true);
        timer.content_sent(at(325));
        let t = timer.finish(at(330), 2);
        assert_eq!(t.ttft_ms, Some(300.0));
        assert_eq!(t.tpot_ms, Some(25.0));
        assert_eq!(
            t.itl_ms,
            Some(ItlStats {
                p50: 25.0,
                p95: 25.0,
                max: 25.0
            })
        );
    }

    #[test]
    fn many_tokens_tpot_itl_and_queue() {
        let mut timer = RequestTimer::start(at(1_000));
        timer.engine_submitted(at(1_001));
        timer.engine_started(at(1_050));
        // 21 tokens with text: gaps 10, 20, ..., 200 ms (20 gaps).
        let mut t = 1_200;
        timer.engine_token(at(t), true);
        timer.content_sent(at(t));
        for i in 1..=20 {
            t += 10 * i;
            timer.engine_token(at(t), true);
            timer.content_sent(at(t));
        }
        let timings = timer.finish(at(t + 5), 21);
        assert_eq!(timings.ttft_ms, Some(200.0));
        assert_eq!(timings.engine_ttft_ms, Some(150.0));
        // (t_last - t_first) = 10 * (1 + ... + 20) = 2100 ms over 20 intervals.
        assert_eq!(timings.tpot_ms, Some(105.0));
        assert_eq!(timings.queue_ms, Some(50.0));
        let itl = timings.itl_ms.expect("itl stats");
        assert_eq!(itl.p50, 100.0);
        assert_eq!(itl.p95, 190.0);
        assert_eq!(itl.max, 200.0);
        assert_eq!(timings.e2e_ms, 2_305.0);
        assert_eq!(timings.tokens_per_second, Some(9.111));
    }

    #[test]
    fn tpot_spans_to_the_last_token_even_without_text() {
        // Three tokens 15 ms apart; the last (end of sequence) carried no text.
        let mut timer = RequestTimer::start(at(0));
        for (t, text) in [(10, true), (25, true), (40, false)] {
            timer.engine_token(at(t), text);
            if text {
                timer.content_sent(at(t));
            }
        }
        let t = timer.finish(at(41), 3);
        assert_eq!(t.tpot_ms, Some(15.0));
        assert_eq!(
            t.itl_ms.map(|i| i.max),
            Some(15.0),
            "ITL covers tokens with text only"
        );
    }

    #[test]
    fn a_slow_reader_moves_ttft_and_e2e_but_not_the_engine_figures() {
        // The engine hands over three tokens 10 ms apart; the client takes the frames
        // late, and the transport waits 500 ms for it in all.
        let mut timer = RequestTimer::start(at(0));
        timer.engine_started(at(5));
        timer.client_waited(Duration::ZERO);
        for t in [20, 30, 40] {
            timer.engine_token(at(t), true);
        }
        timer.content_sent(at(220));
        timer.client_waited(at(200));
        timer.content_sent(at(520));
        timer.client_waited(at(300));
        timer.content_sent(at(540));
        let t = timer.finish(at(545), 3);
        assert_eq!(t.engine_ttft_ms, Some(15.0));
        assert_eq!(t.tpot_ms, Some(10.0));
        assert_eq!(t.itl_ms.map(|i| i.max), Some(10.0));
        assert_eq!(t.ttft_ms, Some(220.0), "what the client saw");
        assert_eq!(t.client_wait_ms, Some(500.0));
        assert_eq!(t.e2e_ms, 545.0);
    }

    #[test]
    fn overhead_is_what_the_gateway_adds_not_the_upstreams_waits() {
        // Received at 0, sent upstream at 2; chunks reach the gateway at 50 and 60, the
        // end of the upstream's stream at 61; the last frame goes at 63.
        let mut timer = RequestTimer::start(at(0));
        timer.prompt_prepared(at(1));
        timer.engine_started(at(2));
        timer.engine_is_upstream();
        for t in [50, 60] {
            timer.engine_token(at(t), true);
            timer.content_sent(at(t + 1));
        }
        timer.engine_done(at(61));
        let t = timer.finish(at(63), 2);
        assert_eq!(t.overhead_ms, 2.0 + 3.0);
        assert_eq!(t.upstream_ttft_ms, Some(48.0));
        // A failure with nothing from the upstream: only the time before it was sent.
        let mut failed = RequestTimer::start(at(0));
        failed.engine_started(at(2));
        failed.engine_is_upstream();
        assert_eq!(failed.finish(at(900), 0).overhead_ms, 2.0);
    }

    #[test]
    fn overhead_leaves_out_the_slot_wait_and_the_client() {
        // In process: prepared at 3, the slot comes at 40, the last token at 51, the
        // end at 54.
        let mut timer = RequestTimer::start(at(0));
        timer.prompt_prepared(at(3));
        timer.engine_started(at(40));
        timer.client_waited(Duration::ZERO);
        timer.engine_token(at(50), true);
        timer.engine_token(at(51), true);
        timer.engine_done(at(52));
        let t = timer.finish(at(54), 2);
        assert_eq!(t.overhead_ms, 3.0 + 3.0);
        // The client held a frame back 2 ms: not the gateway's.
        timer.client_waited(at(2));
        assert_eq!(timer.finish(at(54), 2).overhead_ms, 4.0);
        // Refused before the engine: all of it is the gateway's.
        assert_eq!(RequestTimer::start(at(0)).finish(at(7), 0).overhead_ms, 7.0);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let sorted: Vec<Duration> = (1..=10).map(at).collect();
        assert_eq!(nearest_rank(&sorted, 0.5), at(5));
        assert_eq!(nearest_rank(&sorted, 0.95), at(10));
        assert_eq!(nearest_rank(&sorted[..1], 0.5), at(1));
    }
}

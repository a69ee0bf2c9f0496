//! The decode loop of one llama.cpp model, on a thread of its own that owns the context.
//!
//! Each of the context's sequence ids is a [`Slot`]: its own region of the KV cache and
//! the tokens it holds. A request takes a free slot (the gateway's semaphore keeps one
//! free for each) and is decoded there:
//! - one step decodes, in one llama.cpp batch, the next token of every sequence that is
//!   answering and a chunk of each prompt still being read: [`BatchShape::chunk`] tokens of
//!   it while others answer, up to the whole batch when nothing else does, so a long
//!   prompt delays the others one chunk per step, not its whole prefill;
//! - a seeded request runs in a batch of its own, with chunks of a fixed size and no
//!   prefix from another request: what its logits are cannot depend on what else ran,
//!   so a replay gives the same text;
//! - with [`BatchShape::reuse_prefixes`] a request takes the free slot whose cache shares
//!   the longest prefix with its prompt (a system prompt, a chat template's opening: at
//!   least a tenth of the prompt, as llama.cpp's server judges a slot's similarity, or
//!   half of what the slot holds) and reads only the rest; otherwise
//!   a free slot beside the running ones (see [`runs_with`]), the one taken longest ago
//!   among those, so the prefixes of other recent requests stay;
//! - sequences running at once with one prefix (a request's `n` choices, a batch's
//!   prompts) read it once: the others wait and take the first's cache ([`siblings`]);
//! - each token is picked by the gateway's picker on the sequence's logits (penalties
//!   first), stamped as it is picked, and sent on at once (the engine never waits for a
//!   client: see `super::forward`);
//! - a sequence whose client left ends at its next step; its cache stays for reuse.

use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::mpsc::UnboundedSender;

mod siblings;

use super::stash::{a_tenth_of, shared_prefix, Stash, WORTH_STASHING};
use super::text::Pieces;
use crate::engine::grammar::Vocabulary;
use crate::engine::picking::{penalize, Pick, TokenPicker};
use crate::engine::slots::Claim;
use crate::engine::{EngineError, EngineEvent, GenerationRequest};
use crate::tokens::{FinishReason, TokenLogprob, TokenText, Usage};

/// How the loop's context is laid out, and how it steps.
#[derive(Debug, Clone, Copy)]
pub(super) struct BatchShape {
    /// Sequences decoded together, each a slot of the KV cache.
    pub sequences: usize,
    /// Tokens of context each sequence has.
    pub context: u32,
    /// Tokens one decode call takes at most.
    pub batch: u32,
    /// Tokens of a prompt read in a step while other sequences answer, and in every
    /// step of a seeded request's own batch.
    pub chunk: u32,
    /// Keep finished sequences' caches for requests that share their prefix.
    pub reuse_prefixes: bool,
    /// Bytes of host memory for caches cut from their slot ([`Stash`]); 0 for none.
    pub stash_bytes: usize,
}

/// A request for the loop: a sequence to decode.
pub(crate) struct NewSequence {
    /// The prompt's tokens, chat template applied.
    pub prompt: Arc<[u32]>,
    pub picker: TokenPicker,
    /// Its sampling (for the penalties, which the loop applies before the picker) and
    /// its completion budget.
    pub request: GenerationRequest,
    pub events: UnboundedSender<EngineEvent>,
    pub claim: Claim,
}

impl NewSequence {
    /// Decode it alone, with no cached prefix: a seeded answer is one a replay must give
    /// again, so no prefix computed in another batch, no batch company.
    fn solo(&self) -> bool {
        self.request.sampling.seed.is_some()
    }
}

/// A request being read or answered.
struct Running {
    job: NewSequence,
    /// Prompt tokens whose cache an earlier prompt left (the prefix reused).
    reused: usize,
    answer: Vec<u32>,
    /// The token picked last, decoded at the next step (it is not in the cache yet).
    next: Option<u32>,
    text: Pieces,
}

/// One sequence id of the context and what its region of the KV cache holds.
#[derive(Default)]
struct Slot {
    /// The tokens whose keys and values are in the cache, in order.
    cached: Vec<u32>,
    running: Option<Running>,
    /// When a request last took it (a count of admissions; 0: never).
    taken: u64,
}

/// One sequence's part of a decode call.
struct Entry {
    slot: usize,
    /// Tokens this call adds to its cache.
    adds: Vec<u32>,
    /// Where its logits are in the batch, when this call ends its prompt or decodes.
    logits: Option<i32>,
}

/// Runs until the engine is dropped (the jobs' sender with it).
pub(super) fn run(
    mut ctx: LlamaContext<'_>,
    model: &LlamaModel,
    vocabulary: Option<Arc<Vocabulary>>,
    jobs: Receiver<NewSequence>,
    shape: BatchShape,
) {
    let mut slots: Vec<Slot> = (0..shape.sequences).map(|_| Slot::default()).collect();
    let mut batch = LlamaBatch::new(shape.batch as usize, 1);
    let tokens = Tokens { model, vocabulary };
    let mut stash = Stash::new(shape.stash_bytes);
    let mut admitted = 0u64;
    loop {
        if slots.iter().all(|s| s.running.is_none()) {
            let job = jobs.recv();
            let _in_llama_cpp = super::in_llama_cpp();
            match job {
                Ok(job) => {
                    admitted += 1;
                    admit(&mut ctx, &mut slots, &mut stash, job, shape, admitted);
                }
                // The context is freed under the lock too.
                Err(_) => {
                    drop(ctx);
                    return;
                }
            }
        }
        let _in_llama_cpp = super::in_llama_cpp();
        loop {
            match jobs.try_recv() {
                Ok(job) => {
                    admitted += 1;
                    admit(&mut ctx, &mut slots, &mut stash, job, shape, admitted);
                }
                Err(TryRecvError::Empty) => break,
                // The engine is gone: the sequences still running end with it, and the
                // context is freed under the lock (a parameter outlives the guard).
                Err(TryRecvError::Disconnected) => {
                    drop(ctx);
                    return;
                }
            }
        }
        for slot in &mut slots {
            if slot
                .running
                .as_ref()
                .is_some_and(|r| r.job.events.is_closed())
            {
                slot.running = None;
            }
        }
        let (shared, solo): (Vec<usize>, Vec<usize>) = (0..slots.len())
            .filter(|&i| slots[i].running.is_some())
            .partition(|&i| slots[i].running.as_ref().is_some_and(|r| !r.job.solo()));
        if !shared.is_empty() {
            step(
                &mut ctx, &tokens, &mut slots, &shared, &mut batch, shape, false,
            );
        }
        for i in solo {
            step(&mut ctx, &tokens, &mut slots, &[i], &mut batch, shape, true);
        }
    }
}

/// Gives `job` a free slot (the `now`th admission): with prefix reuse, the one whose
/// cache is mostly a prefix of its prompt, keeping that prefix (never all of the prompt:
/// its last token is read again for its logits); otherwise one beside the running
/// slots, taken longest ago among those, emptied. What the slot held and loses goes to
/// the stash first; a stashed state sharing a longer prefix is copied in.
fn admit(
    ctx: &mut LlamaContext<'_>,
    slots: &mut [Slot],
    stash: &mut Stash,
    job: NewSequence,
    shape: BatchShape,
    now: u64,
) {
    let reuse = shape.reuse_prefixes && !job.solo();
    // A tenth of the prompt or more, as llama.cpp's server judges a slot alike; or half of
    // what the slot holds (the same long prefix).
    let similar = |slot: &Slot| {
        let common = shared_prefix(&slot.cached, &job.prompt);
        let alike = a_tenth_of(common, &job.prompt) || common * 2 >= slot.cached.len();
        (common > 0 && alike).then_some(common)
    };
    let free = || {
        slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.running.is_none())
    };
    let reused = reuse
        .then(|| {
            free()
                .filter_map(|(i, s)| similar(s).map(|common| (i, common)))
                // The longest shared prefix; of equals, the slot that loses least.
                .max_by_key(|&(i, common)| (common, std::cmp::Reverse(slots[i].cached.len())))
        })
        .flatten();
    // Otherwise a slot beside the running ones (see `runs_with`), the one taken longest
    // ago among those.
    let busy: Vec<bool> = slots.iter().map(|s| s.running.is_some()).collect();
    let chosen = reused.or_else(|| {
        free()
            .min_by_key(|&(i, s)| (runs_with(&busy, i), s.taken))
            .map(|(i, _)| (i, 0))
    });
    let Some((index, keep)) = chosen else {
        // The gateway's semaphore holds back more requests than slots; this is a bug.
        let _ = job.events.send(EngineEvent::Failed(EngineError::Internal(
            "no free llama.cpp sequence for an admitted request".into(),
        )));
        return;
    };
    let slot = &mut slots[index];
    slot.taken = now;
    let seq = sequence(index);
    if slot.cached.len() >= keep + WORTH_STASHING {
        stash.keep(ctx, seq, &slot.cached);
    }
    let mut keep = keep;
    if let Some(found) = reuse.then(|| stash.best_for(&job.prompt, keep)).flatten() {
        if let Some(held) = stash.restore(ctx, seq, &found) {
            let (states, bytes) = stash.size();
            tracing::debug!(
                sequence = index,
                restored = found.common,
                stashed_states = states,
                stashed_mb = bytes / (1 << 20),
                "Restored a stashed prompt prefix."
            );
            slot.cached = held;
            keep = found.common;
        }
    }
    let keep = forget_from(ctx, index, slot, keep);
    if keep > 0 {
        tracing::debug!(
            sequence = index,
            reused = keep,
            prompt = job.prompt.len(),
            "Reusing a cached prompt prefix."
        );
    }
    let mut job = job;
    job.claim.holds(keep);
    report_progress(&job, keep, keep);
    slot.running = Some(Running {
        job,
        reused: keep,
        answer: Vec::new(),
        next: None,
        text: Pieces::default(),
    });
}

/// Drops the cache of sequence `index` from position `keep` on; how many tokens it
/// kept. Where llama.cpp cannot cut the sequence there (it answers false, as a recurrent
/// state does), all of it goes.
fn forget_from(ctx: &mut LlamaContext<'_>, index: usize, slot: &mut Slot, keep: usize) -> usize {
    let seq = u32::try_from(index).unwrap_or_default();
    let from = u32::try_from(keep).unwrap_or(u32::MAX);
    if !matches!(
        ctx.clear_kv_cache_seq(Some(seq), Some(from), None),
        Ok(true)
    ) {
        let _ = ctx.clear_kv_cache_seq(Some(seq), None, None);
        slot.cached.clear();
        return 0;
    }
    slot.cached.truncate(keep);
    slot.cached.len()
}

/// How many runs of neighbouring sequence ids the `busy` slots form with `candidate`
/// among them. llama.cpp splits a batch over separate caches into passes of consecutive
/// sequence ids (`split_equal`): running slots 0 and 2 cost two passes of the model
/// per step where 0 and 1 cost one.
fn runs_with(busy: &[bool], candidate: usize) -> usize {
    let taken = |i: usize| i == candidate || busy[i];
    (0..busy.len())
        .filter(|&i| taken(i) && (i == 0 || !taken(i - 1)))
        .count()
}

/// The model's tokens as the loop needs them: their bytes, whether they end a
/// sequence, and their spelling for the log-probabilities.
struct Tokens<'m> {
    model: &'m LlamaModel,
    vocabulary: Option<Arc<Vocabulary>>,
}

impl Tokens<'_> {
    fn text(&self, id: u32) -> TokenText {
        match &self.vocabulary {
            Some(v) => v.token_text(id),
            None => TokenText::from_bytes(self.bytes(id)),
        }
        .with_id(id)
    }

    fn bytes(&self, id: u32) -> Vec<u8> {
        self.model.vocab().token_to_piece(
            LlamaToken::new(i32::try_from(id).unwrap_or_default()),
            false,
            None,
        )
    }

    fn ends(&self, id: u32) -> bool {
        self.model
            .vocab()
            .is_eog(LlamaToken::new(i32::try_from(id).unwrap_or_default()))
    }

    fn logprob(&self, pick: &Pick) -> TokenLogprob {
        TokenLogprob {
            sampled: pick.sampled,
            token: self.text(pick.id),
            logprob: pick.logprob,
            top: pick
                .top
                .iter()
                .map(|&(id, lp)| (self.text(id), lp))
                .collect(),
        }
    }
}

/// One decode call for the sequences in `group`, and a token picked for each whose
/// logits it gave.
fn step(
    ctx: &mut LlamaContext<'_>,
    tokens: &Tokens<'_>,
    slots: &mut [Slot],
    group: &[usize],
    batch: &mut LlamaBatch<'_>,
    shape: BatchShape,
    solo: bool,
) {
    batch.clear();
    if !solo && shape.reuse_prefixes {
        siblings::take_from_leaders(ctx, slots, group);
    }
    let entries = fill(batch, slots, group, shape, solo);
    if entries.is_empty() {
        return;
    }
    let began = std::time::Instant::now();
    let decoded = ctx.decode(batch);
    tracing::trace!(
        sequences = entries.len(),
        tokens = batch.n_tokens(),
        solo,
        decode_us = began.elapsed().as_micros() as u64,
        "Decoding a batch."
    );
    if let Err(error) = decoded {
        tracing::error!(error = %error, sequences = entries.len(), "llama.cpp failed to decode a batch.");
        for entry in &entries {
            let slot = &mut slots[entry.slot];
            forget_from(ctx, entry.slot, slot, 0);
            if let Some(running) = slot.running.take() {
                let failed = EngineError::Internal(format!("llama.cpp failed to decode: {error}"));
                tell_last(running.job, EngineEvent::Failed(failed));
            }
        }
        return;
    }
    for entry in entries {
        let slot = &mut slots[entry.slot];
        slot.cached.extend_from_slice(&entry.adds);
        let Some(running) = slot.running.as_mut() else {
            continue;
        };
        running.next = None;
        running.job.claim.holds(slot.cached.len());
        if running.answer.is_empty() {
            report_progress(&running.job, running.reused, slot.cached.len());
        }
        if let Some(at) = entry.logits {
            let mut values = ctx.get_logits_ith(at).to_vec();
            if let Some(ending) = pick_next(tokens, running, &mut values) {
                finish(slot, ending);
            }
        }
    }
}

/// With `return_progress`: `processed` of the job's prompt read, `cached` of them from a
/// cache.
fn report_progress(job: &NewSequence, cached: usize, processed: usize) {
    if job.request.return_progress {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let _ = job.events.send(EngineEvent::Progress {
            total: count(job.prompt.len()),
            cached: count(cached),
            processed: count(processed),
        });
    }
}

/// Fills `batch` for one decode call: every answering sequence's next token has a
/// place; prompts being read share the rest, a chunk each while others answer. The
/// batch goes in sequence order (`group` is ascending), which is what lets llama.cpp
/// take neighbouring sequences in one pass.
fn fill(
    batch: &mut LlamaBatch<'_>,
    slots: &[Slot],
    group: &[usize],
    shape: BatchShape,
    solo: bool,
) -> Vec<Entry> {
    let mut entries: Vec<Entry> = Vec::with_capacity(group.len());
    let answering = group
        .iter()
        .filter(|&&i| slots[i].running.as_ref().is_some_and(|r| r.next.is_some()))
        .count();
    let mut room = (shape.batch as usize).saturating_sub(answering);
    for &i in group {
        let slot = &slots[i];
        let Some(running) = slot.running.as_ref() else {
            continue;
        };
        let from = slot.cached.len();
        if let Some(next) = running.next {
            let at = batch.n_tokens();
            let token = LlamaToken::new(i32::try_from(next).unwrap_or_default());
            if batch
                .add(token, position(from), &[sequence(i)], true)
                .is_ok()
            {
                entries.push(Entry {
                    slot: i,
                    adds: vec![next],
                    logits: Some(at),
                });
            }
            continue;
        }
        if !solo && shape.reuse_prefixes && siblings::waits(slots, group, i) {
            // A sibling reads the prefix they share; it takes that cache next step.
            continue;
        }
        let chunk = if solo || answering > 0 {
            shape.chunk as usize
        } else {
            room
        };
        let prompt = &running.job.prompt;
        let to = prompt.len().min(from + chunk.min(room));
        if let Some(entry) = add_prompt(batch, i, prompt, from..to) {
            room -= entry.adds.len();
            entries.push(entry);
        }
    }
    entries
}

/// Adds the positions `chunk` of sequence `i`'s prompt, with logits at the prompt's
/// last token if the chunk reaches it; `None` when nothing fits.
fn add_prompt(
    batch: &mut LlamaBatch<'_>,
    i: usize,
    prompt: &[u32],
    chunk: std::ops::Range<usize>,
) -> Option<Entry> {
    let from = chunk.start;
    let mut logits = None;
    let mut added = 0;
    for (pos, &id) in prompt.get(chunk)?.iter().enumerate() {
        let last = from + pos + 1 == prompt.len();
        let at = batch.n_tokens();
        let token = LlamaToken::new(i32::try_from(id).unwrap_or_default());
        if batch
            .add(token, position(from + pos), &[sequence(i)], last)
            .is_err()
        {
            break;
        }
        added += 1;
        if last {
            logits = Some(at);
        }
    }
    (added > 0).then(|| Entry {
        slot: i,
        adds: prompt[from..from + added].to_vec(),
        logits,
    })
}

/// How a sequence ends.
enum SequenceEnd {
    Finished(FinishReason),
    Failed(EngineError),
}

/// Picks the sequence's next token from `values` and sends its text on; what ends the
/// sequence, if this token does.
fn pick_next(
    tokens: &Tokens<'_>,
    running: &mut Running,
    values: &mut [f32],
) -> Option<SequenceEnd> {
    let job = &running.job;
    penalize(values, &job.prompt, &running.answer, &job.request.sampling);
    let length = job.prompt.len() + running.answer.len();
    let pick = match job.picker.pick(values, length) {
        Ok(pick) => pick,
        Err(message) => {
            return Some(SequenceEnd::Failed(EngineError::Internal(format!(
                "structured output: {message}"
            ))))
        }
    };
    let id = pick.id;
    running.answer.push(id);
    if pick.ends || tokens.ends(id) {
        // The end token is counted as generated (usage), and is no part of the content:
        // not its text, not its id, not its log-probability (docs/api.md, "The end
        // token"). The event still marks when it was picked, where TPOT's span ends.
        let _ = job.events.send(EngineEvent::Token {
            text: running.text.finish(),
            ids: Vec::new(),
            logprobs: Vec::new(),
            at: pick.at,
        });
        return Some(SequenceEnd::Finished(FinishReason::Stop));
    }
    let _ = job.events.send(EngineEvent::Token {
        text: running.text.push(&tokens.bytes(id)),
        ids: vec![id],
        logprobs: vec![tokens.logprob(&pick)],
        at: pick.at,
    });
    if running.answer.len() >= job.request.budget.tokens() as usize {
        let rest = running.text.finish();
        if !rest.is_empty() {
            let _ = job.events.send(EngineEvent::Token {
                text: rest,
                ids: Vec::new(),
                logprobs: Vec::new(),
                at: pick.at,
            });
        }
        return Some(SequenceEnd::Finished(FinishReason::Length));
    }
    running.next = Some(id);
    None
}

/// Ends the slot's sequence with `ending`; its cache stays for a later prefix.
fn finish(slot: &mut Slot, ending: SequenceEnd) {
    let Some(running) = slot.running.take() else {
        return;
    };
    let event = match ending {
        SequenceEnd::Finished(reason) => EngineEvent::Finished {
            reason,
            usage: Usage {
                prompt_tokens: u32::try_from(running.job.prompt.len()).unwrap_or(u32::MAX),
                completion_tokens: u32::try_from(running.answer.len()).unwrap_or(u32::MAX),
                cached_tokens: Some(u32::try_from(running.reused).unwrap_or(u32::MAX)),
                reasoning_tokens: None,
            },
        },
        SequenceEnd::Failed(error) => EngineEvent::Failed(error),
    };
    tell_last(running.job, event);
}

/// Sends a sequence's last event after giving back its claim: whoever sees the end sees
/// the engine without the sequence (its running count, its KV positions, a free slot).
fn tell_last(job: NewSequence, event: EngineEvent) {
    let NewSequence { events, claim, .. } = job;
    drop(claim);
    let _ = events.send(event);
}

fn position(index: usize) -> i32 {
    i32::try_from(index).unwrap_or(i32::MAX)
}

fn sequence(slot: usize) -> i32 {
    i32::try_from(slot).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::runs_with;

    #[test]
    fn a_new_sequence_goes_beside_the_running_ones() {
        // 0 runs: beside it (1) keeps one pass; 2 or 3 would make two.
        let busy = [true, false, false, false];
        assert_eq!(runs_with(&busy, 1), 1);
        assert_eq!(runs_with(&busy, 2), 2);
        assert_eq!(runs_with(&busy, 3), 2);
        // 0 and 2 run: 1 joins them into one run, 3 leaves two.
        let busy = [true, false, true, false];
        assert_eq!(runs_with(&busy, 1), 1);
        assert_eq!(runs_with(&busy, 3), 2);
        // Nothing runs: any slot is one run.
        assert_eq!(runs_with(&[false; 4], 3), 1);
    }
}

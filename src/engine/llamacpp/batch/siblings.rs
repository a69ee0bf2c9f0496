//! Sequences that share a prompt prefix while they run: the choices of one request
//! (`n` > 1), a batch's prompts with one opening, clients sending the same system prompt
//! at once. One of them (the leader: the one that has read most, ties to the lower slot)
//! reads the shared part; the others wait for it and then take its cache, copied
//! (llama.cpp's `llama_state_seq_get_data` and `_set_data`, as the stash copies a state:
//! each sequence has a KV stream of its own, which llama.cpp's `seq_cp` copies only
//! whole), and read only the rest. A seeded sequence takes part in neither role: it
//! decodes alone, from nothing another request computed.

use llama_cpp_2::context::session::LlamaStateSeqFlags;
use llama_cpp_2::context::LlamaContext;

use super::{forget_from, sequence, Slot};
use crate::engine::llamacpp::stash::{shared_prefix, WORTH_STASHING};

/// Whether sequence `i`, reading its prompt, waits for another sequence of `group` that
/// is reading the same prefix ahead of it (and then takes that prefix, [`take_from_leaders`]).
pub(super) fn waits(slots: &[Slot], group: &[usize], i: usize) -> bool {
    let Some(prompt) = slots[i].running.as_ref().map(|r| &r.job.prompt) else {
        return false;
    };
    let own = slots[i].cached.len();
    group.iter().any(|&j| {
        let Some(leader) = slots[j].running.as_ref().filter(|_| j != i) else {
            return false;
        };
        let theirs = slots[j].cached.len();
        let ahead = theirs > own || (theirs == own && j < i);
        let shared = shared_prefix(&leader.job.prompt, prompt);
        // It still reads what it could give: once it has, the copy comes first.
        ahead && shared >= own + WORTH_STASHING && theirs < shared
    })
}

/// Gives each sequence of `group` still reading its prompt the longest prefix of it
/// another slot's cache holds (a running sibling's, or a finished one's), when that is
/// worth a copy.
pub(super) fn take_from_leaders(ctx: &mut LlamaContext<'_>, slots: &mut [Slot], group: &[usize]) {
    for &i in group {
        let Some(running) = slots[i].running.as_ref() else {
            continue;
        };
        if running.next.is_some() || !running.answer.is_empty() {
            continue;
        }
        let own = slots[i].cached.len();
        let best = (0..slots.len())
            .filter(|&j| j != i)
            .map(|j| (j, shared_prefix(&slots[j].cached, &running.job.prompt)))
            .filter(|&(_, common)| common >= own + WORTH_STASHING)
            .max_by_key(|&(j, common)| (common, std::cmp::Reverse(j)));
        let Some((j, common)) = best else {
            continue;
        };
        let Ok(state) = ctx.state_seq_get(sequence(j), LlamaStateSeqFlags::empty()) else {
            continue;
        };
        let _ = ctx.clear_kv_cache_seq(u32::try_from(i).ok(), None, None);
        if ctx.state_seq_set(&state, sequence(i)).is_err() {
            tracing::debug!(
                from = j,
                to = i,
                "llama.cpp refused a sibling's prompt state."
            );
            let _ = ctx.clear_kv_cache_seq(u32::try_from(i).ok(), None, None);
            slots[i].cached.clear();
            continue;
        }
        slots[i].cached = slots[j].cached.clone();
        let kept = forget_from(ctx, i, &mut slots[i], common);
        if let Some(running) = slots[i].running.as_mut() {
            tracing::debug!(
                from = j,
                to = i,
                tokens = kept,
                "Took a sibling's prompt prefix."
            );
            // What it had read itself is what it holds less what it was given.
            running.reused += kept.saturating_sub(own);
            running.job.claim.holds(kept);
        }
    }
}

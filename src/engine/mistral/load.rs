//! Loading a GGUF into mistral.rs instances: the file's hash and metadata first (the
//! fingerprint, the vocabulary, the end-of-sequence tokens), then one model instance per
//! replica.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mistralrs::GgufModelBuilder;

use super::{process, Loaded, MistralSettings, ENGINE_NAME};
use crate::engine::gguf::{InProcessModel, ModelFile};

pub(super) async fn load(settings: &MistralSettings) -> anyhow::Result<Loaded> {
    let path = settings.model_path.clone();
    let model_file = tokio::task::spawn_blocking(move || ModelFile::read(&path)).await??;
    let eos: Arc<[u32]> = model_file.facts.end_of_sequence_ids().into();
    let (dir, file) = split_model_path(&settings.model_path)?;
    let mut replicas = Vec::with_capacity(settings.replica_count());
    for _ in 0..settings.replica_count() {
        let mut builder = GgufModelBuilder::new(dir.clone(), vec![file.clone()])
            .with_max_num_seqs(settings.max_batch_size)
            .with_prefix_cache_n(settings.prefix_cache.then_some(16));
        if settings.on_cpu() {
            builder = builder.with_force_cpu();
        }
        replicas.push(Arc::new(builder.build().await?));
    }
    let context_length = replicas[0]
        .max_sequence_length()?
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| anyhow::anyhow!("the model reports no context length"))?;
    // Dequantized weights round differently, so they are part of what makes an answer.
    let device = if settings.on_cpu() {
        format!("cpu/{}", process::weights_in_effect().as_str())
    } else {
        "cuda".to_owned()
    };
    let info = model_file.info(&settings.model_id, context_length, ENGINE_NAME, device);
    Ok(Loaded {
        health: Arc::new(super::watchdog::Health::new(replicas.len())),
        replicas,
        served: InProcessModel {
            info: Arc::new(info),
            vocabulary: model_file.vocabulary,
            end_tokens: eos,
        },
    })
}

/// mistral.rs takes a GGUF model as a directory ("model id") and file names in it.
fn split_model_path(path: &Path) -> anyhow::Result<(String, String)> {
    let file = path
        .file_name()
        .and_then(|f| f.to_str())
        .ok_or_else(|| anyhow::anyhow!("model path {} names no file", path.display()))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir.to_string_lossy().into_owned(), file.to_owned()))
}

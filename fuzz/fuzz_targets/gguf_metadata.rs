//! A model file's header and metadata, any bytes: an error naming what is wrong, never a
//! panic or an allocation the file cannot back (run with `-malloc_limit_mb`, as
//! `scripts/fuzz` does); what is read from an accepted header is read without panics too.

#![no_main]

use libfuzzer_sys::fuzz_target;
use llmgate::engine::gguf::GgufFacts;

fuzz_target!(|data: &[u8]| {
    match GgufFacts::from_reader(data, data.len() as u64) {
        Err(error) => assert!(!error.to_string().is_empty()),
        Ok(gguf) => {
            let _ = gguf.architecture();
            if let Err(message) = gguf.check_supported() {
                assert!(message.contains(gguf.architecture()), "{message}");
            }
            let _ = gguf.quantization();
            let _ = gguf.end_of_sequence_ids();
            let _ = gguf.vocabulary();
            let _ = gguf.tokenizer_parts();
            let _ = gguf.bpe_tokenizer();
        }
    }
});

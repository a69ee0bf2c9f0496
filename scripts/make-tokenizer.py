#!/usr/bin/env python3
"""A Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json, config.json)
built offline from a GGUF's own tokenizer, for clients that want one (AIPerf, GuideLLM):
no hub is reachable here.

  python3 scripts/make-tokenizer.py MODEL.gguf OUT_DIR

Needs the `gguf` and `tokenizers` packages. Byte-level BPE (llama.cpp's `gpt2` model)
only; SmolLM2's `smollm` pre-tokenizer splits digits one by one before the byte level.
"""

import json
import os
import sys

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

CONTROL = 3  # llama.cpp's token type of a special token


def main(gguf_path: str, out: str) -> None:
    reader = GGUFReader(gguf_path)
    field = lambda key: reader.fields[key].contents() if key in reader.fields else None
    assert field("tokenizer.ggml.model") == "gpt2", "only byte-level BPE vocabularies"
    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type") or []
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
    tokenizer = Tokenizer(bpe)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if field("tokenizer.ggml.pre") == "smollm":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    special = [t for t, kind in zip(tokens, types) if kind == CONTROL]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    os.makedirs(out, exist_ok=True)
    tokenizer.save(os.path.join(out, "tokenizer.json"))
    token_of = lambda key: tokens[field(key)] if field(key) is not None else None
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": token_of("tokenizer.ggml.bos_token_id"),
            "eos_token": token_of("tokenizer.ggml.eos_token_id"),
            "chat_template": field("tokenizer.chat_template"),
            "model_max_length": int(field("llama.context_length") or 2048),
        }, f, indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "vocab_size": len(tokens)}, f, indent=2)
    print(f"{out}: {len(tokens)} tokens, {len(merges)} merges, {len(special)} special")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

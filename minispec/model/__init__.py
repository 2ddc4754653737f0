"""The model: a Hugging Face Llama / Qwen2 / Qwen3 checkpoint's transformer, its cache, and p and q.

    config.py        ModelConfig: the checkpoint's config.json, checked, and the architecture it names
    transformer.py   Transformer: embedding, blocks (RMSNorm, RoPE attention with GQA, SwiGLU), LM head
    kv_cache.py      KVCache: keys and values per layer, appended, read, and rolled back in O(1)
    memory.py        what the machine can hold: every size checked before it is allocated
    sampling.py      logits -> the distributions p (target) and q (draft): temperature, top-k, top-p

Everything above this folder builds on it; it imports nothing of theirs.
"""

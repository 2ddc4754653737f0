"""Plain greedy decoding speed: minispec next to transformers, same prompts, one run.

    python scripts/bench_plain.py [--dtype float32|bfloat16] [--new-tokens 64] [--repeats 3]

Both decode the same chat-formatted prompts greedily for exactly --new-tokens tokens (eos
ignored), after one warm-up run each. Reports the median tokens/s over prompts x repeats
(end to end: prefill + decode), the ratio minispec / transformers, and whether the two produced
the same tokens. Threads: torch's default (one per core).
"""

import argparse
import statistics
import time

import torch

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in three sentences why the sky is blue.",
    "List three uses of a paperclip.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)

    import transformers

    import minispec
    from minispec.speculative import generate
    from minispec.weights import ensure_default_checkpoint

    ckpt = ensure_default_checkpoint()
    ours = minispec.load_model(ckpt, dtype=dtype)
    tok = minispec.load_tokenizer(ckpt)
    ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype).eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]

    def run_ours(ids):
        t = time.perf_counter()
        out = generate(ours, ids, max_new_tokens=args.new_tokens, eos_token_ids=[])
        return out.tokens, time.perf_counter() - t

    def run_ref(ids):
        t = time.perf_counter()
        with torch.no_grad():
            out = ref.generate(torch.tensor([ids]), max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                               do_sample=False, pad_token_id=2)
        return out[0, len(ids):].tolist(), time.perf_counter() - t

    run_ours(prompts[0]), run_ref(prompts[0])  # warm-up
    speeds = {"minispec": [], "transformers": []}
    same = 0
    for _ in range(args.repeats):
        for ids in prompts:
            a, ta = run_ours(ids)
            b, tb = run_ref(ids)
            speeds["minispec"].append(len(a) / ta)
            speeds["transformers"].append(len(b) / tb)
            # transformers' min_new_tokens forbids eos, ours (eos_token_ids=[]) may emit it:
            # compare up to and excluding the first eos
            stop = a.index(2) if 2 in a else len(a)
            same += a[:stop] == b[:stop]
    med = {k: statistics.median(v) for k, v in speeds.items()}
    print(f"plain greedy, {args.dtype}, {args.new_tokens} new tokens, {len(prompts)} chat prompts x {args.repeats}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads")
    for k, v in med.items():
        print(f"  {k:13s} median {v:6.1f} tok/s")
    print(f"  ratio minispec/transformers: {med['minispec'] / med['transformers']:.2f}x; "
          f"identical tokens (up to the first eos) in {same}/{len(prompts) * args.repeats} runs")


if __name__ == "__main__":
    main()

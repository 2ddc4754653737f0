"""Speed benchmark: how close plain and speculative decoding get to this machine's limits.

    python -m minispec.bench_speed [--quick] [--out out/bench-speed] [--prompts N] [--new-tokens N]

Everything is measured in ONE run, on the same prompts, with nothing else running, and reported
as ratios against baselines from the same run (medians over prompts):

1. Streaming bandwidth: a large bf16 matrix-vector product (256 MiB of weights), with F.linear and
   with the packed oneDNN kernel; the faster one is the bandwidth B. The bound for plain decoding is
   B / weights_bytes tokens/s (every weight is read once per token).
2. Plain greedy decoding, float32 and bfloat16, of minispec's reference path ("before": model.py as
   written), minispec's fast path ("after": minispec.fast.optimize), the compiled path
   (minispec.compiled: opt-in, compiled before timing; its compile seconds are reported) and
   transformers' `generate`,
   on short chat prompts and Spec-Bench summarization prompts, a fixed number of new tokens
   (eos ignored, so every system does the same work). End-to-end tokens/s (prefill included),
   decode-only tokens/s and its fraction of the bound, and prefill tokens/s (one forward over the
   prompt).
3. Speculative decoding at temperature 0 with the exact policy on Spec-Bench summarization and RAG
   prompts (stops at eos): n-gram prompt lookup and the bf16 / int8 self-drafts at several gamma, against
   our own plain decoding (same dtype, fast path) and transformers' plain and prompt-lookup
   generation; n-gram also on the compiled path, against the compiled path's plain decoding.
   Outputs are checked to equal plain greedy decoding's.
4. DropMatch (K=5, p=0.3): its extra cost as a share of a verify step. (a) Eager (all paths in the
   verify's head call): head(h) vs policy.head_logits(h, head) on (gamma+1)-row hidden states.
   (b) In real loops, eager and lazy (paths only where a verdict needs them): an exact-policy
   n-gram run records every verify step's LM-head input and policy input; each step is then
   replayed through exact (head + decide) and through DropMatch (head_logits + decide), and the
   extra time, summed over all steps, is divided by the run's own verify time (forward + head).
   On the fast path, and on the compiled path unless --no-compiled (its verify is cheaper, and
   so is its head).
5. What a verify pass costs ("verify"): one pass of k = 1..9 new tokens on a cache holding the first
   summarization prompt, fast and compiled; then, per drafter (n-gram; the int8 and bf16
   self-drafts on the fast path) and gamma, the cost of a verify step and the acceptance length
   tau it needs for 1.8x over plain decoding: tau x pass(1) / (gamma x draft + pass(gamma + 1)).
6. Peak memory of generation (a fresh subprocess per configuration): the rise of the peak
   resident set size over the process's size before the model was loaded, against
   weights_bytes + kv_cache_bytes.

Writes speed.json and speed.md to --out (default out/bench-speed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from minispec.acceptance import ExactMatch
from minispec.errors import MinispecError

SHORT_CHAT = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in three sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "Give me two tips for learning to cook.",
]
DTYPES = ("float32", "bfloat16")


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _timed(fn, reps: int) -> float:
    """Median seconds of fn() over reps calls after one warm-up call."""
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


# ------------------------------------------------------------------------------------ bandwidth


def measure_bandwidth(reps: int = 15, with_compiled: bool = False) -> dict:
    """GB/s of a bf16 matrix-vector product over 256 MiB of weights (far larger than any cache):
    F.linear, the packed oneDNN kernel and (with_compiled) TorchInductor's autotuned C++ kernel
    with minispec.compiled's options; B is the fastest."""
    from minispec.fast import PackedLinear, packed_kernels_available

    weight = torch.randn(32768, 4096).to(torch.bfloat16)  # 256 MiB
    x = torch.randn(1, 4096).to(torch.bfloat16)
    nbytes = weight.numel() * weight.element_size()
    result = {"bytes": nbytes}
    result["f_linear_gbps"] = nbytes / _timed(lambda: torch.nn.functional.linear(x, weight), reps) / 1e9
    if packed_kernels_available():
        packed = PackedLinear(weight, None)
        del weight
        result["packed_gbps"] = nbytes / _timed(lambda: packed(x), reps) / 1e9
        del packed
    if with_compiled:
        from minispec.compiled import INDUCTOR_OPTIONS

        dense = torch.nn.Linear(4096, 32768, bias=False).to(torch.bfloat16).requires_grad_(False)
        with torch.no_grad(), torch._inductor.config.patch(INDUCTOR_OPTIONS):
            matvec = torch.compile(dense)
            result["compiled_gbps"] = nbytes / _timed(lambda: matvec(x), reps) / 1e9
    result["bandwidth_gbps"] = max(v for k, v in result.items() if k.endswith("_gbps"))
    return result


# ------------------------------------------------------------------------------- the systems


def weights_bytes(model) -> int:
    """Bytes of the model's distinct parameter tensors (a tied head counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def load_compiled(ckpt: Path, dtype: torch.dtype, warm_up_rows: tuple[int, ...] = (1,)) -> tuple:
    """A compiled-path model with its graphs compiled before anything is timed; returns (model,
    compile seconds). Warms up a decode step and a pass of each of `warm_up_rows`, on two caches
    of different sizes: dynamo first specializes on the shapes it sees and recompiles with
    dynamic sizes when they change, which would otherwise happen inside a timed run."""
    import minispec
    from minispec import compiled

    model = compiled.compile_model(minispec.load_model(ckpt, dtype=dtype))
    return model, compiled.warm_up(model, verify_rows=tuple(r for r in warm_up_rows if r > 1))


def load_systems(ckpt: Path, dtype: torch.dtype, with_transformers: bool, with_compiled: bool = False) -> dict:
    import minispec
    from minispec import fast

    systems = {"reference": minispec.load_model(ckpt, dtype=dtype),
               "fast": fast.optimize(minispec.load_model(ckpt, dtype=dtype))}
    if with_compiled:
        systems["compiled"], systems["compile_seconds"] = load_compiled(ckpt, dtype)
    if with_transformers:
        from minispec.bench import load_transformers

        hf = load_transformers(ckpt, dtype)
        if hf is not None:
            systems["transformers"] = hf
    return systems


def plain_run(name: str, model, ids: list[int], new_tokens: int, eos: list[int]) -> dict:
    """Greedy decoding of exactly `new_tokens` (eos=[]) or up to eos; end-to-end seconds."""
    from minispec.speculative import generate

    if name == "transformers":
        x = torch.tensor([ids])
        kwargs = dict(min_new_tokens=new_tokens) if not eos else {}
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, do_sample=False,
                                 eos_token_id=eos or None, pad_token_id=(eos or [2])[0], **kwargs)
        seconds = time.perf_counter() - t0
        return {"tokens": out[0, len(ids):].tolist(), "seconds": seconds}
    with torch.inference_mode():
        result = generate(model, ids, max_new_tokens=new_tokens, eos_token_ids=eos)
    return {"tokens": result.tokens, "seconds": result.stats["total_seconds"],
            "decode_tps": result.stats["decode_tokens_per_second"]}


def prefill_seconds(name: str, model, ids: list[int], reps: int) -> float:
    """Median seconds to feed the prompt into a fresh cache and get the last position's logits,
    as each system's generate does it (transformers: logits_to_keep=1; ours: speculative._prefill)."""
    from minispec.speculative import _prefill

    x = torch.tensor([ids])
    if name == "transformers":
        fn = lambda: model(x, use_cache=True, logits_to_keep=1)  # noqa: E731
    else:
        fn = lambda: _prefill(model, ids, model.new_cache(1, len(ids)))  # noqa: E731
    with torch.inference_mode():
        return _timed(fn, reps)


def bench_plain(systems: dict, prompts: dict[str, list[list[int]]], new_tokens: int, reps: int) -> list[dict]:
    """Every system on every prompt, interleaved per prompt (so drift hits all alike)."""
    records = []
    for set_name, prompt_list in prompts.items():
        for i, ids in enumerate(prompt_list):
            for name, model in systems.items():
                runs = [plain_run(name, model, ids, new_tokens, eos=[]) for _ in range(reps)]
                seconds = statistics.median(r["seconds"] for r in runs)
                records.append({
                    "set": set_name, "prompt": i, "system": name, "prompt_tokens": len(ids),
                    "new_tokens": len(runs[0]["tokens"]), "tokens": runs[0]["tokens"],
                    "tps": len(runs[0]["tokens"]) / seconds,
                    "decode_tps": _median(r.get("decode_tps") for r in runs),
                    "prefill_tps": len(ids) / prefill_seconds(name, model, ids, max(reps, 3)),
                })
    return records


# ------------------------------------------------------------------------------- speculative


def bench_speculative(ckpt: Path, dtype: torch.dtype, prompts: dict[str, list[list[int]]], gammas: list[int],
                      max_new_tokens: int, eos: list[int], hf, with_compiled: bool = False) -> list[dict]:
    """Plain vs drafters (exact policy, T=0) on our fast path, and plain vs n-gram on the compiled
    path (system "minispec-compiled"); transformers plain and prompt lookup."""
    import minispec
    from minispec import fast
    from minispec.drafters import make_drafter
    from minispec.speculative import generate

    model = minispec.load_model(ckpt, dtype=dtype)
    drafters = {"ngram": make_drafter("ngram", model)}
    if dtype == torch.float32:
        drafters["self:bf16"] = make_drafter("self:bf16", model)  # before optimize: it copies the weights
    drafters["self:int8"] = make_drafter("self:int8", model)
    fast.optimize(model)
    for drafter in drafters.values():
        fast.optimize_drafter(drafter)
    targets = {"minispec": (model, drafters)}
    if with_compiled:
        compiled_model, _ = load_compiled(ckpt, dtype, warm_up_rows=(1, *(g + 1 for g in gammas)))
        targets["minispec-compiled"] = (compiled_model, {"ngram": drafters["ngram"]})

    records = []
    for set_name, prompt_list in prompts.items():
        for i, ids in enumerate(prompt_list):
            def record(system, drafter, gamma, tokens, seconds, stats=None):
                records.append({"set": set_name, "prompt": i, "system": system, "drafter": drafter, "gamma": gamma,
                                "prompt_tokens": len(ids), "new_tokens": len(tokens), "tokens": tokens,
                                "tps": len(tokens) / seconds, "tau": None if stats is None else stats.get("tau"),
                                # after the target's prefill (a model drafter's own prefill counts here)
                                "decode_tps": None if stats is None else stats["decode_tokens_per_second"]})

            with torch.inference_mode():
                for system, (target, target_drafters) in targets.items():
                    plain = generate(target, ids, max_new_tokens=max_new_tokens, eos_token_ids=eos)
                    record(system, "plain", None, plain.tokens, plain.stats["total_seconds"], plain.stats)
                    for dname, drafter in target_drafters.items():
                        for gamma in gammas:
                            out = generate(target, ids, max_new_tokens=max_new_tokens, draft=drafter, policy="exact",
                                           gamma=gamma, eos_token_ids=eos)
                            record(system, dname, gamma, out.tokens, out.stats["total_seconds"], out.stats)
            if hf is not None:
                run = plain_run("transformers", hf, ids, max_new_tokens, eos)
                record("transformers", "plain", None, run["tokens"], run["seconds"])
                for gamma in gammas:
                    x = torch.tensor([ids])
                    t0 = time.perf_counter()
                    with torch.inference_mode():
                        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                          do_sample=False, eos_token_id=eos, pad_token_id=eos[0],
                                          prompt_lookup_num_tokens=gamma)
                    record("transformers", "prompt-lookup", gamma, out[0, len(ids):].tolist(), time.perf_counter() - t0)
    return records


VERIFY_ROWS = (1, 2, 3, 4, 6, 9)  # new tokens per pass: a decode step, then verify passes (gamma + 1)
CEILING_GAMMAS = (3, 5, 8)
TARGET_SPEEDUP = 1.8  # the issue's target for speculation over our own plain decoding


def pass_costs(model, context_ids: list[int], rows=VERIFY_ROWS, reps: int = 15) -> dict[int, float]:
    """Median ms of one pass (blocks + LM head) of k new tokens on a cache that holds `context_ids`,
    for each k in rows. Every pass is rolled back, so all see the same context. The row counts take
    turns within each repetition, so a drift in the machine's speed moves them all alike."""
    cache = model.new_cache(1, len(context_ids) + max(rows) + 1)
    samples: dict[int, list[float]] = {k: [] for k in rows}
    with torch.inference_mode():
        model.forward_hidden(torch.tensor([context_ids]), cache)  # [1, S]: the prefill
        start = cache.length
        for rep in range(reps + 1):  # the first round warms up
            for k in rows:
                new = torch.tensor([context_ids[-k:]])  # [1, k]: any tokens; the cost does not depend on them
                t0 = time.perf_counter()
                model(new, cache)
                seconds = time.perf_counter() - t0
                cache.truncate(start)
                if rep:
                    samples[k].append(seconds)
    return {k: 1000 * statistics.median(v) for k, v in samples.items()}


def ngram_draft_ms(context_ids: list[int], gamma: int, vocab_size: int, reps: int = 15) -> float:
    """Median ms of one n-gram proposal (the lookup plus its one-hot q rows) on `context_ids`."""
    from minispec.drafters import NgramDrafter
    from minispec.sampling import SamplingParams

    drafter = NgramDrafter(vocab_size=vocab_size)
    return 1000 * _timed(lambda: drafter.propose(context_ids, gamma, SamplingParams(0.0), None), reps)


def speculation_ceiling(costs: dict[int, float], draft_ms: float, gamma: int, target: float = TARGET_SPEEDUP) -> dict:
    """What a verify step of `gamma` drafts costs, and the acceptance length it needs to pay off.

    One step costs gamma * draft_ms + pass(gamma + 1) and yields tau tokens (accepted drafts plus
    the correction or bonus, 1 <= tau <= gamma + 1); plain decoding costs pass(1) per token. So

        speed-up(tau) = tau * pass(1) / (gamma * draft_ms + pass(gamma + 1))

    tau_needed: the tau at which the speed-up reaches `target`; above gamma + 1 no drafter reaches
    it at this gamma. best_speedup: the speed-up if every draft were accepted (tau = gamma + 1).
    """
    step_ms = gamma * draft_ms + costs[gamma + 1]
    return {"gamma": gamma, "draft_ms": draft_ms, "step_ms": step_ms,
            "tau_needed": target * step_ms / costs[1], "best_speedup": (gamma + 1) * costs[1] / step_ms}


def bench_verify_cost(ckpt: Path, dtype: torch.dtype, context_ids: list[int], with_compiled: bool,
                      reps: int = 25) -> tuple[list[dict], list[dict]]:
    """Pass costs (fast path, and compiled if asked) and the ceilings of each drafter at each gamma.
    Drafters: n-gram (its lookup), the int8 self-draft and, for float32, the bf16 one (a 1-row
    pass of the draft model on the same context); on the compiled path, n-gram only."""
    import minispec
    from minispec import fast
    from minispec.drafters import self_draft

    model = minispec.load_model(ckpt, dtype=dtype)
    drafts = {"self:int8": self_draft(model, "int8")}
    if dtype == torch.float32:
        drafts["self:bf16"] = fast.optimize(self_draft(model, "bf16"))
    fast.optimize(model)
    systems = {"fast": model}
    if with_compiled:  # tuned for gamma = 5 (the CLI's default), as a gamma-5 run would be
        systems["compiled"], _ = load_compiled(ckpt, dtype, warm_up_rows=(1, 6))
    vocab = model.config.vocab_size
    passes, ceilings = [], []
    for kernels, target in systems.items():
        costs = pass_costs(target, context_ids, reps=reps)
        passes.append({"kernels": kernels, "context": len(context_ids), "pass_ms": costs})
        draft_ms = {"ngram": {g: ngram_draft_ms(context_ids, g, vocab, reps) for g in CEILING_GAMMAS}}
        if kernels == "fast":
            for name, draft in drafts.items():
                step = pass_costs(draft, context_ids, rows=(1,), reps=reps)[1]
                draft_ms[name] = {g: step for g in CEILING_GAMMAS}
        for name, per_gamma in draft_ms.items():
            for gamma in CEILING_GAMMAS:
                ceilings.append({"kernels": kernels, "drafter": name,
                                 **speculation_ceiling(costs, per_gamma[gamma], gamma)})
    return passes, ceilings


def dropmatch_overhead(ckpt: Path, dtype: torch.dtype, ids: list[int], reps: int) -> list[dict]:
    import minispec
    from minispec import acceptance, fast
    from minispec.bench import measure_head_overhead

    rows = []
    for kernels in ("reference", "fast"):
        model = minispec.load_model(ckpt, dtype=dtype)
        if kernels == "fast":
            fast.optimize(model)
        policy = acceptance.get("dropmatch", p=0.3, paths=5, lazy=False)  # all paths in the head call
        with torch.inference_mode():
            for gamma in (3, 5, 8):
                rows.append({"kernels": kernels, **measure_head_overhead(model, ids, gamma, policy, reps)})
    return rows


class _RecordingExact(ExactMatch):
    """The exact policy, recording each verify step's LM-head input and policy input (for replay)."""

    def __init__(self) -> None:
        self.steps: list[tuple[torch.Tensor, object]] = []  # (hidden [g+1, d], VerifyInput)

    def head_logits(self, hidden, head):
        self._hidden = hidden.clone()
        return super().head_logits(hidden, head)

    def decide(self, inp):
        self.steps.append((self._hidden, inp))
        return super().decide(inp)


DROPMATCH_VARIANTS = {"eager": dict(lazy=False), "lazy, prefetch 0": dict(prefetch=0),
                      "lazy, prefetch 1 (default)": dict(prefetch=1), "lazy, prefetch 2": dict(prefetch=2)}


def dropmatch_loop_overhead(model, prompts: list[list[int]], gamma: int, max_new_tokens: int, eos: list[int],
                            reps: int = 3) -> list[dict]:
    """DropMatch's extra time per verify step in real n-gram loops, per variant (module docstring, 4b).

    Per recorded step, the median over `reps` of: exact = head(h) + ExactMatch()(inp);
    DropMatch = head_logits(h, head) + decide, on the same step, for each of DROPMATCH_VARIANTS.
    Totals over all steps of all prompts; share = (DropMatch - exact) / the runs' verify seconds
    (forward + head). One row per variant.
    """
    from minispec import acceptance
    from minispec.acceptance import VerifyInput
    from minispec.speculative import generate

    exact = acceptance.get("exact")
    totals = {name: 0.0 for name in ["exact", *DROPMATCH_VARIANTS]}
    positions = {name: 0 for name in DROPMATCH_VARIANTS}
    head_calls = {name: 0 for name in DROPMATCH_VARIANTS}
    verify_seconds, steps = 0.0, 0
    with torch.inference_mode():
        for ids in prompts:
            recorder = _RecordingExact()
            out = generate(model, ids, max_new_tokens=max_new_tokens, draft="ngram", policy=recorder, gamma=gamma,
                           eos_token_ids=eos)
            verify_seconds += out.stats["verify_seconds"]
            steps += len(recorder.steps)
            for step, (hidden, inp) in enumerate(recorder.steps):
                def run_exact(hidden=hidden, inp=inp):
                    exact(VerifyInput(inp.draft_tokens, inp.q_draft, model.head(hidden).float(), inp.p_target,
                                      inp.params, inp.generator, inp.draft_logits))
                    return {}

                def run_dropmatch(options, hidden=hidden, inp=inp, step=step):
                    policy = acceptance.get("dropmatch", p=0.3, paths=5, seed=step, **options)
                    clean, extras = policy.head_logits(hidden, model.head)
                    return policy(VerifyInput(inp.draft_tokens, inp.q_draft, clean.float(), inp.p_target,
                                              inp.params, inp.generator, inp.draft_logits, extras)).info

                runs = {"exact": run_exact}
                runs.update({name: (lambda o=options: run_dropmatch(o)) for name, options in DROPMATCH_VARIANTS.items()})
                samples = {name: [] for name in runs}
                for _ in range(reps):  # interleaved
                    for name, fn in runs.items():
                        t0 = time.perf_counter()
                        info = fn()
                        samples[name].append(time.perf_counter() - t0)
                        if name in positions:
                            positions[name] += info.get("path_positions", 0) / reps
                            head_calls[name] += info.get("path_head_calls", 0) / reps
                for name, values in samples.items():
                    totals[name] += statistics.median(values)
    rows = []
    for name in DROPMATCH_VARIANTS:
        extra = totals[name] - totals["exact"]
        rows.append({"variant": name, "drafter": "ngram", "gamma": gamma, "prompts": len(prompts), "steps": steps,
                     "verify_ms_per_step": 1e3 * verify_seconds / steps, "extra_ms_per_step": 1e3 * extra / steps,
                     "extra_share": extra / verify_seconds,
                     "path_positions_per_step": positions[name] / steps if name != "eager" else None,
                     "path_head_calls_per_step": head_calls[name] / steps if name != "eager" else None})
    return rows


# ------------------------------------------------------------------------------------- memory


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_child(ckpt: str, dtype_name: str, kernels: str, ids: list[int], new_tokens: int, draft: str | None) -> dict:
    """Run in a fresh process: peak RSS rise while loading+generating vs weights + KV cache bytes."""
    import minispec
    from minispec import fast
    from minispec.drafters import make_drafter
    from minispec.speculative import generate

    from minispec.model import Transformer
    from minispec.testing import tiny_config

    # The baseline is the process after each code path ran once on something tiny: the BLAS and
    # oneDNN libraries loaded, and torch's meta-device machinery (~70 MB the first time a model is
    # built on the meta device, whatever its size) initialised.
    torch.nn.functional.linear(torch.ones(2, 2), torch.ones(2, 2))
    torch.ops.mkldnn._linear_pointwise(torch.ones(2, 2), torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2), 1),
                                       None, "none", [], "")
    with torch.device("meta"):
        Transformer(tiny_config())
    base_kib = _rss_kib("VmRSS")
    model = minispec.load_model(ckpt, dtype=getattr(torch, dtype_name))
    w_bytes = weights_bytes(model)
    drafter = make_drafter(draft, model)
    draft_bytes = weights_bytes(drafter.model) if getattr(drafter, "model", model) is not model else 0
    if kernels == "fast":
        fast.optimize(model)
        fast.optimize_drafter(drafter)
    elif kernels == "compiled":  # compiles inside generate: the compiler's own memory is in the peak
        from minispec import compiled

        compiled.compile_model(model)
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    after_load_kib = _rss_kib("VmRSS")
    with torch.inference_mode():
        result = generate(model, ids, max_new_tokens=new_tokens, draft=drafter, gamma=5, eos_token_ids=[])
    peak_kib = _rss_kib("VmHWM")
    cfg = model.config
    kv_dtype = model.compute_dtype or model.dtype
    positions = len(ids) + new_tokens + (6 if drafter is not None else 0)
    kv_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * positions * torch.finfo(kv_dtype).bits // 8
    if drafter is not None and getattr(drafter, "model", None) is not None:
        dm = drafter.model
        d_dtype = dm.compute_dtype or dm.dtype
        kv_bytes += 2 * dm.config.num_layers * dm.config.num_kv_heads * dm.config.head_dim * positions \
            * torch.finfo(d_dtype).bits // 8
    budget = w_bytes + draft_bytes + kv_bytes
    return {"dtype": dtype_name, "kernels": kernels, "draft": draft, "weights_bytes": w_bytes + draft_bytes,
            "kv_bytes": kv_bytes, "after_load_rise_bytes": (after_load_kib - base_kib) * 1024,
            "peak_rise_bytes": (peak_kib - base_kib) * 1024, "ratio": (peak_kib - base_kib) * 1024 / budget,
            "tokens": len(result.tokens)}


def measure_memory(ckpt: Path, ids: list[int], new_tokens: int, with_compiled: bool = False) -> list[dict]:
    rows = []
    for dtype_name in DTYPES:
        for kernels in ("reference", "fast", "compiled") if with_compiled else ("reference", "fast"):
            for draft in ([None, "self:bf16"] if dtype_name == "float32" and kernels != "compiled" else [None]):
                code = ("import json,sys; from minispec.bench_speed import memory_child; "
                        "print(json.dumps(memory_child(*json.loads(sys.argv[1]))))")
                arg = json.dumps([str(ckpt), dtype_name, kernels, ids, new_tokens, draft])
                out = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, check=True)
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


# ------------------------------------------------------------------------------------ summary


def summarise_plain(records: list[dict], wbytes: dict, bandwidth: float) -> list[dict]:
    rows = []
    for dtype_name in DTYPES:
        for set_name in sorted({r["set"] for r in records}):
            group = [r for r in records if r["dtype"] == dtype_name and r["set"] == set_name]
            if not group:
                continue
            med = lambda system, key: _median(r[key] for r in group if r["system"] == system)  # noqa: E731
            bound = bandwidth / wbytes[dtype_name]
            row = {"dtype": dtype_name, "set": set_name, "bound_tps": bound,
                   "prompt_tokens": _median(r["prompt_tokens"] for r in group)}
            for system in ("reference", "fast", "compiled", "transformers"):
                row[f"{system}_tps"] = med(system, "tps")
                row[f"{system}_decode_tps"] = med(system, "decode_tps")
                row[f"{system}_prefill_tps"] = med(system, "prefill_tps")
            hf = row["transformers_tps"]
            for system in ("reference", "fast", "compiled"):
                if row[f"{system}_tps"] is None:
                    continue
                row[f"{system}_vs_hf"] = None if not hf or row[f"{system}_tps"] is None else row[f"{system}_tps"] / hf
                row[f"{system}_of_bound"] = None if row[f"{system}_decode_tps"] is None else row[f"{system}_decode_tps"] / bound
                hfp = row["transformers_prefill_tps"]
                row[f"{system}_prefill_vs_hf"] = None if not hfp else row[f"{system}_prefill_tps"] / hfp
            # tokens identical to the reference path's (greedy: the same up to near-ties in bf16)
            ref = {r["prompt"]: r["tokens"] for r in group if r["system"] == "reference"}
            row["fast_same_tokens"] = sum(r["tokens"] == ref[r["prompt"]] for r in group if r["system"] == "fast")
            fast_tokens = {r["prompt"]: r["tokens"] for r in group if r["system"] == "fast"}
            row["compiled_same_as_fast"] = sum(r["tokens"] == fast_tokens[r["prompt"]] for r in group
                                               if r["system"] == "compiled")
            row["prompts"] = len(ref)
            rows.append(row)
    return rows


def summarise_speculative(records: list[dict]) -> list[dict]:
    rows = []
    keys = sorted({(r["dtype"], r["set"]) for r in records})
    for dtype_name, set_name in keys:
        group = [r for r in records if r["dtype"] == dtype_name and r["set"] == set_name]
        plains = {system: {r["prompt"]: r for r in group if r["system"] == system and r["drafter"] == "plain"}
                  for system in {r["system"] for r in group}}
        hf_plain_tps = _median(r["tps"] for r in group if r["system"] == "transformers" and r["drafter"] == "plain")
        configs = sorted({(r["system"], r["drafter"], r["gamma"] or 0) for r in group})
        for system, drafter, gamma in configs:
            sel = [r for r in group if (r["system"], r["drafter"], r["gamma"] or 0) == (system, drafter, gamma)]
            plain = plains[system] if system.startswith("minispec") else plains["minispec"]  # same kernels
            tps = _median(r["tps"] for r in sel)
            decode_tps = _median(r.get("decode_tps") for r in sel)
            plain_decode = _median(r.get("decode_tps") for r in plain.values())
            rows.append({
                "dtype": dtype_name, "set": set_name, "system": system, "drafter": drafter, "gamma": gamma or None,
                "tps": tps, "tau": _median(r["tau"] for r in sel), "decode_tps": decode_tps,
                "decode_vs_our_plain": None if decode_tps is None or not plain_decode else decode_tps / plain_decode,
                "vs_our_plain": tps / _median(r["tps"] for r in plain.values()),
                "vs_hf_plain": None if not hf_plain_tps else tps / hf_plain_tps,
                "same_as_plain": sum(r["tokens"] == plain[r["prompt"]]["tokens"] for r in sel), "prompts": len(sel),
            })
        ours = [r for r in rows if r["dtype"] == dtype_name and r["set"] == set_name
                and r["system"].startswith("minispec") and r["drafter"] != "plain"]
        hf_pl = [r for r in rows if r["dtype"] == dtype_name and r["set"] == set_name and r["drafter"] == "prompt-lookup"]
        if ours and hf_pl:
            best, best_hf = max(ours, key=lambda r: r["tps"]), max(hf_pl, key=lambda r: r["tps"])
            for r in rows:
                if r["dtype"] == dtype_name and r["set"] == set_name:
                    r["best_ours_vs_best_hf_prompt_lookup"] = best["tps"] / best_hf["tps"]
                    r["best_ours_config"] = f"{best['system']} {best['drafter']} g{best['gamma']}"
                    r["best_hf_config"] = f"prompt-lookup g{best_hf['gamma']}"
    return rows


def fmt(v, spec=".2f", suffix=""):
    return "—" if v is None else f"{v:{spec}}{suffix}"


def render(result: dict) -> str:
    m, bw = result["meta"], result["bandwidth"]
    lines = [f"# minispec speed benchmark", "",
             f"`{m['command']}` — {m['machine']['cpu']}, {m['machine']['cores']} cores, torch {m['machine']['torch']}, "
             f"transformers {m['machine']['transformers']}, {m['seconds']:.0f} s, load average at start {m['load_average']}.", "",
             f"Streaming bandwidth (bf16 matrix-vector product, 256 MiB): F.linear {bw['f_linear_gbps']:.1f} GB/s, "
             f"packed oneDNN {fmt(bw.get('packed_gbps'), '.1f')} GB/s, compiled (TorchInductor) "
             f"{fmt(bw.get('compiled_gbps'), '.1f')} GB/s; B = {bw['bandwidth_gbps']:.1f} GB/s.", "",
             "## Plain greedy decoding", "",
             f"{m['new_tokens']} new tokens (eos ignored), median over prompts. tok/s is end to end (prefill included); "
             "'of bound' is decode-only tok/s over B / weights_bytes; prefill is one forward over the prompt.", "",
             "| dtype | prompts | prompt len | transformers tok/s | before (reference) tok/s | after (fast) tok/s "
             "| before / hf | after / hf | before of bound | after of bound | prefill after / hf | prefill before / hf "
             "| after = before tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["plain"]:
        lines.append(f"| {r['dtype']} | {r['set']} | {fmt(r['prompt_tokens'], '.0f')} | {fmt(r['transformers_tps'], '.1f')} "
                     f"| {fmt(r['reference_tps'], '.1f')} | {fmt(r['fast_tps'], '.1f')} | {fmt(r['reference_vs_hf'], '.2f', 'x')} "
                     f"| **{fmt(r['fast_vs_hf'], '.2f', 'x')}** | {fmt(r['reference_of_bound'], '.0%')} "
                     f"| **{fmt(r['fast_of_bound'], '.0%')}** | **{fmt(r['fast_prefill_vs_hf'], '.2f', 'x')}** "
                     f"| {fmt(r['reference_prefill_vs_hf'], '.2f', 'x')} | {r['fast_same_tokens']}/{r['prompts']} |")
    if any(r.get("compiled_tps") for r in result["plain"]):
        compile_s = m.get("compile_seconds", {})
        lines += ["", "Compiled path (minispec.compiled, opt-in: `--kernels compiled`), same prompts, interleaved with "
                  "the rows above; compiled before timing (decode step: "
                  + ", ".join(f"{d} {v:.0f} s" for d, v in compile_s.items()) + " of compiling in this process).", "",
                  "| dtype | prompts | compiled tok/s | compiled / hf | compiled / fast | compiled decode tok/s "
                  "| compiled of bound | prefill compiled / hf | compiled = fast tokens |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in result["plain"]:
            lines.append(f"| {r['dtype']} | {r['set']} | {fmt(r.get('compiled_tps'), '.1f')} "
                         f"| **{fmt(r.get('compiled_vs_hf'), '.2f', 'x')}** "
                         f"| {fmt(r['compiled_tps'] / r['fast_tps'] if r.get('compiled_tps') else None, '.2f', 'x')} "
                         f"| {fmt(r.get('compiled_decode_tps'), '.1f')} | **{fmt(r.get('compiled_of_bound'), '.0%')}** "
                         f"| {fmt(r.get('compiled_prefill_vs_hf'), '.2f', 'x')} "
                         f"| {r.get('compiled_same_as_fast', 0)}/{r['prompts']} |")
    lines += ["", "## Speculative decoding, T=0, exact policy (fast path; stops at eos)", "",
              "tok/s is end to end (prefill included); decode tok/s counts the tokens after the prefill's "
              "first one over the time after the target's prefill (a model drafter's own prefill falls in it).", "",
              "| dtype | prompts | system | drafter | gamma | tau | tok/s | vs our plain | vs transformers plain "
              "| decode tok/s | decode vs our plain | = plain greedy |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["speculative"]:
        lines.append(f"| {r['dtype']} | {r['set']} | {r['system']} | {r['drafter']} | {fmt(r['gamma'], 'd')} "
                     f"| {fmt(r['tau'])} | {fmt(r['tps'], '.1f')} | {fmt(r['vs_our_plain'], '.2f', 'x')} "
                     f"| {fmt(r['vs_hf_plain'], '.2f', 'x')} | {fmt(r.get('decode_tps'), '.1f')} "
                     f"| {fmt(r.get('decode_vs_our_plain'), '.2f', 'x')} | {r['same_as_plain']}/{r['prompts']} |")
    lines += ["", "'= plain greedy': outputs identical to our plain greedy decoding. float32 must match; in bfloat16 "
              "a (gamma+1)-row verify and a 1-row decode step round differently, so outputs may part at near-ties."]
    best = {}
    for r in result["speculative"]:
        if "best_ours_vs_best_hf_prompt_lookup" in r:
            best[(r["dtype"], r["set"])] = (r["best_ours_vs_best_hf_prompt_lookup"], r.get("best_ours_config", "?"),
                                            r.get("best_hf_config", "?"))
    if best:
        lines += ["", "Best minispec speculative config / best transformers prompt-lookup config (tok/s): "
                  + "; ".join(f"{d} {s}: **{v:.2f}x** ({ours} / {theirs})" for (d, s), (v, ours, theirs) in best.items())]
    if result["dropmatch"]:
        lines += ["", "## DropMatch (K=5, p=0.3), eager: extra LM-head rows as a share of a verify step", "",
                  "The head call alone (head(h) vs policy.head_logits(h, head) with lazy=False); the JS test and "
                  "the vote are not in these figures (they are in the next table).", "",
                  "| dtype | kernels | gamma | verify ms | head ms | DropMatch head ms | extra / verify |",
                  "|---|---|---|---|---|---|---|"]
        for r in result["dropmatch"]:
            lines.append(f"| {r['dtype']} | {r['kernels']} | {r['gamma']} | {r['verify_ms']:.1f} | {r['head_ms']:.2f} "
                         f"| {r['dropmatch_head_ms']:.2f} | **{r['extra_share_of_verify']:.1%}** |")
    if result.get("dropmatch_loop"):
        lines += ["", "## DropMatch (K=5, p=0.3) in real loops: everything the policy adds, eager and lazy", "",
                  "Every verify step of exact-policy n-gram runs on the RAG prompts (T = 0), replayed through exact "
                  "(head + decide) and DropMatch (head_logits + decide); extra time summed over all steps, divided "
                  "by the runs' own verify time (forward + head). 'positions' = positions per step whose verdict "
                  "needed the dropout paths; 'head calls' = extra LM-head calls per step.", "",
                  "| dtype | kernels | gamma | prompts | steps | DropMatch | verify ms/step | extra ms/step "
                  "| positions/step | head calls/step | extra / verify |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in result["dropmatch_loop"]:
            lines.append(f"| {r['dtype']} | {r['kernels']} | {r['gamma']} | {r['prompts']} | {r['steps']} "
                         f"| {r['variant']} | {r['verify_ms_per_step']:.1f} | {r['extra_ms_per_step']:.2f} "
                         f"| {fmt(r['path_positions_per_step'])} | {fmt(r['path_head_calls_per_step'])} "
                         f"| **{r['extra_share']:.1%}** |")
    if result.get("verify_passes"):
        rows = sorted({k for r in result["verify_passes"] for k in r["pass_ms"]}, key=int)
        lines += ["", "## What a verify pass costs, and the acceptance length speculation needs", "",
                  "ms of one pass (blocks + LM head) of k new tokens on a cache holding the first summarization "
                  "prompt, median; k = 1 is a decode step, k = gamma + 1 a verify pass; '/ step' = pass(k) / pass(1).", "",
                  "| dtype | kernels | context | " + " | ".join(f"k={k} ms" for k in rows) + " | "
                  + " | ".join(f"k={k} / step" for k in rows if int(k) > 1) + " |",
                  "|---|---|---|" + "---|" * (2 * len(rows) - 1)]
        for r in result["verify_passes"]:
            costs = {int(k): v for k, v in r["pass_ms"].items()}
            lines.append(f"| {r['dtype']} | {r['kernels']} | {r['context']} | "
                         + " | ".join(f"{costs[int(k)]:.1f}" for k in rows) + " | "
                         + " | ".join(f"{costs[int(k)] / costs[1]:.2f}" for k in rows if int(k) > 1) + " |")
        lines += ["", f"A step of gamma drafts costs gamma x draft + pass(gamma+1) and yields tau tokens "
                  f"(1 <= tau <= gamma+1): speed-up = tau x pass(1) / step. 'tau needed' reaches "
                  f"{TARGET_SPEEDUP}x; above gamma + 1 (marked) no drafter can, at that gamma. "
                  "'all accepted' = the speed-up at tau = gamma + 1.", "",
                  "| dtype | kernels | drafter | gamma | draft ms | step ms | tau needed | all accepted |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in result["verify_ceilings"]:
            out_of_reach = r["tau_needed"] > r["gamma"] + 1
            lines.append(f"| {r['dtype']} | {r['kernels']} | {r['drafter']} | {r['gamma']} | {r['draft_ms']:.2f} "
                         f"| {r['step_ms']:.1f} | **{r['tau_needed']:.2f}**{' (> gamma+1)' if out_of_reach else ''} "
                         f"| {r['best_speedup']:.2f}x |")
    if result.get("memory"):
        lines += ["", "## Peak memory of generation", "",
                  "| dtype | kernels | draft | weights MB | KV MB | RSS rise after load MB | peak rise MB | peak / (weights + KV) |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in result["memory"]:
            lines.append(f"| {r['dtype']} | {r['kernels']} | {r['draft'] or '—'} | {r['weights_bytes'] / 1e6:.0f} "
                         f"| {r['kv_bytes'] / 1e6:.1f} | {r['after_load_rise_bytes'] / 1e6:.0f} "
                         f"| {r['peak_rise_bytes'] / 1e6:.0f} | **{r['ratio']:.2f}** |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    from minispec.bench import _Parser, _one_int

    p = _Parser(prog="python -m minispec.bench_speed", description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", type=Path, default=None, help="checkpoint folder (default: weights/smollm2-135m-instruct)")
    p.add_argument("--out", type=Path, default=Path("out/bench-speed"))
    p.add_argument("--prompts", type=_one_int("--prompts"), default=4, help="prompts per set (default 4)")
    p.add_argument("--new-tokens", type=_one_int("--new-tokens"), default=64, help="plain decoding: new tokens (default 64)")
    p.add_argument("--spec-tokens", type=_one_int("--spec-tokens"), default=128,
                   help="speculative section: max new tokens (default 128, stops at eos)")
    p.add_argument("--reps", type=_one_int("--reps"), default=1, help="runs per prompt and system (median)")
    p.add_argument("--quick", action="store_true", help="2 prompts per set, 32 tokens, one gamma, no memory section")
    p.add_argument("--no-transformers", dest="transformers", action="store_false")
    p.add_argument("--no-memory", dest="memory", action="store_false")
    p.add_argument("--no-compiled", dest="compiled", action="store_false",
                   help="leave out the compiled path (minispec.compiled; compiling takes minutes)")
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--sections", type=_sections, default=SECTIONS,
                   help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)")
    return p


SECTIONS = ("plain", "speculative", "dropmatch", "verify", "memory")


def _sections(text: str) -> tuple[str, ...]:
    chosen = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in chosen if t not in SECTIONS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"--sections = {text!r}; expected a comma-separated subset of {','.join(SECTIONS)}")
    return chosen


def run(args) -> dict:
    import minispec
    from minispec import fast
    from minispec.bench import _load_average, default_data_dir, load_prompts, machine_info, load_transformers
    from minispec.weights import ensure_default_checkpoint

    t_start = time.perf_counter()
    ckpt = args.ckpt or ensure_default_checkpoint()
    tokenizer = minispec.load_tokenizer(ckpt)
    n = 2 if args.quick else args.prompts
    new_tokens = 32 if args.quick else args.new_tokens
    spec_tokens = 48 if args.quick else args.spec_tokens
    gammas = [5] if args.quick else [3, 5, 8]
    data_dir = args.data_dir or default_data_dir()
    chat = [tokenizer.apply_chat_template([{"role": "user", "content": t}]) for t in SHORT_CHAT[:n]]
    spec = {s: [p.ids for p in load_prompts([s], n, data_dir, tokenizer)] for s in ("summarization", "rag")}
    plain_prompts = {"chat": chat, "summarization": spec["summarization"]}
    eos = tokenizer.eos_token_ids
    meta = {"command": "python -m minispec.bench_speed " + " ".join(sys.argv[1:]), "machine": machine_info(),
            "load_average": _load_average(), "new_tokens": new_tokens, "spec_tokens": spec_tokens, "gammas": gammas}
    print(f"bench_speed: {n} prompts per set; bandwidth ...", file=sys.stderr)
    bandwidth = measure_bandwidth(with_compiled=args.compiled and "plain" in args.sections)
    plain, speculative, dropmatch, dropmatch_loop, wbytes = [], [], [], [], {}
    verify_passes, verify_ceilings = [], []
    sections = args.sections
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        hf = None
        if "plain" in sections:
            print(f"bench_speed: plain decoding, {dtype_name} ...", file=sys.stderr)
            systems = load_systems(ckpt, dtype, args.transformers, with_compiled=args.compiled)
            if "compile_seconds" in systems:
                meta.setdefault("compile_seconds", {})[dtype_name] = systems.pop("compile_seconds")
            wbytes[dtype_name] = weights_bytes(systems["reference"])
            plain += [{"dtype": dtype_name, **r} for r in bench_plain(systems, plain_prompts, new_tokens, args.reps)]
            hf = systems.get("transformers")
            del systems
        if "speculative" in sections:
            if hf is None and args.transformers:
                hf = load_transformers(ckpt, dtype)
            print(f"bench_speed: speculative, {dtype_name} ...", file=sys.stderr)
            speculative += [{"dtype": dtype_name, **r}
                            for r in bench_speculative(ckpt, dtype, spec, gammas, spec_tokens, eos, hf,
                                                       with_compiled=args.compiled)]
        del hf
        if "dropmatch" in sections:
            print(f"bench_speed: DropMatch overhead, {dtype_name} ...", file=sys.stderr)
            dropmatch += [{"dtype": dtype_name, **r} for r in dropmatch_overhead(ckpt, dtype, spec["rag"][0], 20)]
            model = fast.optimize(minispec.load_model(ckpt, dtype=dtype))
            dropmatch_loop += [{"dtype": dtype_name, "kernels": "fast", **r}
                               for r in dropmatch_loop_overhead(model, spec["rag"], 5, spec_tokens, eos)]
            if args.compiled:  # the head graphs: tuned at the verify's 6 rows (gamma 5), then dynamic
                model, _ = load_compiled(ckpt, dtype, warm_up_rows=(1, 6))
                dropmatch_loop += [{"dtype": dtype_name, "kernels": "compiled", **r}
                                   for r in dropmatch_loop_overhead(model, spec["rag"], 5, spec_tokens, eos)]
            del model
        if "verify" in sections:
            print(f"bench_speed: verify cost, {dtype_name} ...", file=sys.stderr)
            passes, ceilings = bench_verify_cost(ckpt, dtype, spec["summarization"][0], args.compiled)
            verify_passes += [{"dtype": dtype_name, **r} for r in passes]
            verify_ceilings += [{"dtype": dtype_name, **r} for r in ceilings]
    memory = []
    if "memory" in sections and args.memory and not args.quick:
        print("bench_speed: memory ...", file=sys.stderr)
        memory = measure_memory(ckpt, spec["summarization"][0], new_tokens, with_compiled=args.compiled)
    meta["seconds"] = time.perf_counter() - t_start
    return {"meta": meta, "bandwidth": bandwidth, "weights_bytes": wbytes,
            "plain": summarise_plain(plain, wbytes, bandwidth["bandwidth_gbps"] * 1e9),
            "speculative": summarise_speculative(speculative), "dropmatch": dropmatch,
            "dropmatch_loop": dropmatch_loop, "verify_passes": verify_passes, "verify_ceilings": verify_ceilings,
            "memory": memory,
            "records": {"plain": plain, "speculative": speculative}}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = run(args)
    except MinispecError as error:
        print(f"minispec.bench_speed: error: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speed.json").write_text(json.dumps(result, indent=1))
    text = render(result)
    (args.out / "speed.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

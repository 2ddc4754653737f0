"""Weight formats on this CPU: bytes per token, what a pass of k rows costs, and what each buys end to end.

    python scripts/speed/bench_formats.py [--ckpt qwen2.5-coder-1.5b-instruct] [--draft qwen2.5-coder-0.5b-instruct]
                                          [--formats fast-float32,fast-bfloat16,fp16,int8-dynamic] [--prompts 3]
                                          [--llama-cpp DIR]

A decoding step reads every weight once, so the format of the weights sets its floor: bytes /
bandwidth. Per format (minispec.kernels kind on a dtype; a kind this CPU cannot run is skipped
with one line):

1. bytes: the weights one forward reads (the embedding excluded: one row per token); the bound
   on plain decoding, B / bytes, with B the bandwidth measured here (minispec.kernels.measure).
2. pass cost: ms of one target pass of k = 1..--rows new tokens on a cache holding the first
   HumanEval prompt (blocks + LM head, minispec.kernels.measure.pass_costs); k = 1 is a decode
   step, k = gamma + 1 a verify pass. The compute floor of a pass, k x 2 x parameters / the
   matmul rate measured here, says when a pass stops being bound by the bytes.
3. end to end on the first --prompts HumanEval prompts, T = 0, --new-tokens tokens: plain
   decoding (tok/s, share of the bound, the tokens before the first difference from float32's
   and whether the two logits there are a near-tie), and speculative decoding with the n-gram
   draft and with --draft in --draft-format at each --gammas, and with each drafter's draft length
   chosen per step by --draft-length auto up to the largest gamma (minispec.lab.step_cost: this
   format's measured pass costs; "auto<=G", with the mean drafted per drafted step) (tok/s, tau,
   speed-up over the same format's plain decoding, output = that plain decoding's).

4. the draft's own step (--draft in --draft-format, k = 1) against its bound, its bytes / B, and
   the tau each drafter must reach for 1.8x over plain decoding (tau_needed).
5. with --transformers DTYPE, transformers on the same folder in that dtype, per prompt: `generate`
   plain, with prompt lookup at the largest gamma and assisted by --draft (its default schedule);
   decode tok/s is the time of generate less that of a one-token generate on the same prompt.
6. with --llama-cpp (a llama.cpp build folder, see docs/benchmarks.md), llama.cpp on the same
   GGUF files, prompts and 2 threads: plain decoding of target and draft (`llama-bench -p 0 -n
   --new-tokens`, with and without its repacked weights) and its speculative example with the
   draft at --spec-draft-n-max 5 per prompt (benchlib.llama_*); and the ratio of minispec's
   fastest configuration to llama.cpp's fastest.

With --quality only step 3's plain decoding runs (no pass costs, no drafts): how often each
format's greedy output is float32's, and at the first difference whether float32's two logits
there are a near-tie (within 0.1). Per prompt every configuration takes its turn; ratios are
medians over prompts. Writes
bench_formats.json and .md to --out (default out/bench_formats/).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import first_difference, fmt, md_table, median, ratio

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402
from minispec.kernels import measure as probe  # noqa: E402
from minispec.lab import step_cost as prices  # noqa: E402  (this script has a step_cost of its own)

PROG = "bench_formats"
FORMATS, BYTES_PER_WEIGHT = benchlib.FORMATS, benchlib.BYTES_PER_WEIGHT


def linear_weights(model) -> int:
    """Weights of the blocks' and head's linear layers (what a forward reads, the embedding aside)."""
    c = model.config
    kv = c.num_kv_heads * c.head_dim
    block = c.hidden_size * (c.num_heads * c.head_dim + 2 * kv) + c.num_heads * c.head_dim * c.hidden_size \
        + 3 * c.hidden_size * c.intermediate_size
    return c.num_layers * block + c.vocab_size * c.hidden_size


def matmul_gflops(reps: int = 10) -> float:
    """The CPU's float32 matrix-matrix rate (GFLOP/s): a [256, 2048] x [2048, 2048] product."""
    a, b = torch.randn(256, 2048), torch.randn(2048, 2048)
    return 2 * 256 * 2048 * 2048 / probe.timed(lambda: a @ b, reps) / 1e9


def near_tie(reference, prompt: list[int], tokens: list[int], at: int, margin: float = 0.1) -> bool:
    """Whether the float32 model's logits of the two tokens that part at `at` are within `margin`."""
    with torch.inference_mode():
        logits = reference(torch.tensor([prompt + tokens[:at]]), reference.new_cache(1, len(prompt) + at))[0, -1]
    top2 = torch.topk(logits, 2).values
    return bool(top2[0] - top2[1] < margin)


def pass_seconds(model, context: list[int], ks, reps: int) -> dict[int, float]:
    """Seconds of one pass of k new rows, for each k in `ks`, on a cache holding `context` (rolled back after each)."""
    cache = model.new_cache(1, len(context) + max(ks) + 1)
    with torch.inference_mode():
        model.forward_hidden(torch.tensor([context]), cache)
    start = cache.length
    return probe.pass_costs(model, cache, ks, rollback=lambda: cache.truncate(start), reps=reps)


def step_cost(model, context: list[int], name: str, bandwidth: dict, reps: int) -> dict:
    """One decoding step of `model` (ms, on a cache holding `context`) against its bound, bytes / B."""
    nbytes = linear_weights(model) * BYTES_PER_WEIGHT[name]
    return {"format": name, "ms": 1000 * pass_seconds(model, context, [1], reps)[1], "bytes": nbytes,
            "bound_ms": 1000 * nbytes / (bandwidth["bandwidth_gbps"] * 1e9)}


def run_llama(bin_dir: Path, ckpt: Path, draft: str | None, prompts, tokenizer, n: int) -> dict:
    """llama.cpp on the GGUF files of the target and draft (known names only): plain tok/s with and
    without its repacked weights, and its speculative example per prompt."""
    from minispec.checkpoints.known import KNOWN

    names = [name for name in (ckpt.name, draft and Path(draft).name) if name in KNOWN]
    if ckpt.name not in names:
        print(f"{PROG}: --llama-cpp: {ckpt.name} is not a known checkpoint with a GGUF file; llama.cpp skipped",
              file=sys.stderr)
        return None
    ggufs = benchlib.llama_ggufs(names)
    plain = {f"{name}{'' if repack else ', no repack'}": benchlib.llama_plain_tps(bin_dir, ggufs[name], n, repack)
             for name in names for repack in (True, False)}
    runs = []
    if len(names) == 2:
        for prompt in prompts:
            r = benchlib.llama_speculative(bin_dir, ggufs[names[0]], ggufs[names[1]], tokenizer.decode(prompt.ids), n)
            runs.append({"prompt": prompt.source_id, **r})
            print(f"{PROG}: llama.cpp speculative {prompt.source_id:<14} {fmt(r.get('decode_tps'), '.1f')} tok/s",
                  file=sys.stderr, flush=True)
    return {"target": names[0], "draft": names[1] if len(names) == 2 else None, "plain_tps": plain,
            "speculative": runs}


def run_transformers(args, ckpt: Path, prompts, eos, want: dict) -> list[dict]:
    """transformers' rows (step 5): plain, prompt lookup and assisted generation, each timed whole and
    less a one-token generate on the same prompt."""
    dtype = getattr(torch, args.transformers)
    target = benchlib.load_transformers(ckpt, dtype)
    assistant = None if args.draft is None else benchlib.load_transformers(benchlib.checkpoint(args.draft), dtype)
    name, top, runs = f"transformers {args.transformers}", max(args.gammas), []
    configs = {"plain": {}, f"prompt lookup g{top}": {"prompt_lookup": top},
               **({} if assistant is None else {"assisted": {"assistant": assistant}})}
    for prompt in prompts:
        plain_tokens = None
        for config, options in configs.items():
            _, first = benchlib.hf_generate(target, prompt.ids, 1, eos, **options)
            tokens, seconds = benchlib.hf_generate(target, prompt.ids, args.new_tokens, eos, **options)
            plain_tokens = tokens if config == "plain" else plain_tokens
            differ = first_difference(tokens, want[prompt.source_id])
            runs.append({"format": name, "config": config, "prompt": prompt.source_id, "tps": len(tokens) / seconds,
                         "decode_tps": (len(tokens) - 1) / max(seconds - first, 1e-9), "tau": None,
                         "generated": len(tokens), "equals_plain": tokens == plain_tokens, "float32_prefix": differ,
                         "near_tie": None})
            print(f"{PROG}: {name:<14} {config:<22} {prompt.source_id:<14} {runs[-1]['tps']:.1f} tok/s",
                  file=sys.stderr, flush=True)
    return runs


def measure(args, ckpt) -> dict:
    import minispec
    from minispec.lab.draft_length import Priced
    from minispec.chain.drafters import ModelDrafter, make_drafter
    from minispec.decode import generate

    llama_bin = None if args.quality else benchlib.llama_bin(args.llama_cpp)  # a wrong folder is said before any work
    tokenizer = minispec.load_tokenizer(ckpt)
    prompts = benchlib.load_prompts(["humaneval"], args.prompts, tokenizer)
    eos = tokenizer.eos_token_ids
    bandwidth = probe.bandwidth()
    gflops = matmul_gflops()
    reference = minispec.load_model(ckpt, dtype=torch.float32)  # float32 greedy: the quality reference
    want = {p.source_id: generate(reference, p.ids, max_new_tokens=args.new_tokens, eos_token_ids=eos).tokens
            for p in prompts}
    draft = None
    if args.draft is not None and not args.quality:
        draft_model = benchlib.load_format(PROG, benchlib.checkpoint(args.draft), args.draft_format)
        draft = None if draft_model is None else ModelDrafter(draft_model, name=f"draft {args.draft_format}")
    draft_step = None if draft is None else step_cost(draft_model, prompts[0].ids, args.draft_format, bandwidth, args.reps)
    formats, runs = [], []
    for name in args.formats:
        model = benchlib.load_format(PROG, ckpt, name)
        if model is None:
            continue
        weights = linear_weights(model)
        if args.quality:
            formats.append({"format": name, "weights": weights, "bytes": weights * BYTES_PER_WEIGHT[name]})
            for prompt in prompts:
                tokens = generate(model, prompt.ids, max_new_tokens=args.new_tokens, eos_token_ids=eos).tokens
                differ = first_difference(tokens, want[prompt.source_id])
                runs.append({"format": name, "config": "plain", "prompt": prompt.source_id, "float32_prefix": differ,
                             "generated": len(tokens), "near_tie": None if differ is None else
                             near_tie(reference, prompt.ids, want[prompt.source_id], differ)})
            del model
            continue
        nbytes = weights * BYTES_PER_WEIGHT[name]
        seconds = pass_seconds(model, prompts[0].ids, range(1, args.rows + 1), args.reps)
        formats.append({"format": name, "weights": weights, "bytes": nbytes,
                        "bound_tps": bandwidth["bandwidth_gbps"] * 1e9 / nbytes,
                        "pass_ms": {k: 1000 * s for k, s in seconds.items()},
                        "floor_ms": {k: 1000 * k * 2 * weights / (gflops * 1e9) for k in seconds}})
        generate(model, prompts[0].ids, max_new_tokens=4, eos_token_ids=eos)  # warm-up: the first call's one-off costs
        top = max(args.gammas)
        ngram = make_drafter("ngram:3", model)
        configs = {"plain": None, **{f"n-gram g{g}": (ngram, g) for g in args.gammas},
                   f"n-gram auto<={top}": (ngram, top, Priced(top, prices.costs(model, ngram, top)))}
        if draft is not None:
            configs.update({f"{draft.name} g{g}": (draft, g) for g in args.gammas})
            configs[f"{draft.name} auto<={top}"] = (draft, top, Priced(top, prices.costs(model, draft, top)))
        for prompt in prompts:
            plain_tokens = None
            for config, spec in configs.items():
                options = {} if spec is None else {"draft": spec[0], "gamma": spec[1]}
                if spec is not None and len(spec) == 3:
                    options["draft_length"] = spec[2]
                t0 = time.perf_counter()
                result = generate(model, prompt.ids, max_new_tokens=args.new_tokens, eos_token_ids=eos, **options)
                seconds = time.perf_counter() - t0
                plain_tokens = result.tokens if spec is None else plain_tokens
                differ = first_difference(result.tokens, want[prompt.source_id])
                runs.append({"format": name, "config": config, "prompt": prompt.source_id,
                             "tps": len(result.tokens) / seconds,
                             "decode_tps": result.stats.get("decode_tokens_per_second"),
                             "tau": result.stats.get("tau"), "generated": len(result.tokens),
                             "drafted_per_drafted_step": ratio(result.stats.get("num_drafted"),
                                                               result.stats.get("drafted_steps")),
                             "costs": None if spec is None or len(spec) < 3 else spec[2].costs,
                             "equals_plain": result.tokens == plain_tokens,
                             "float32_prefix": differ, "near_tie": None if differ is None or spec is not None
                             else near_tie(reference, prompt.ids, want[prompt.source_id], differ)})
                print(f"{PROG}: {name:<14} {config:<22} {prompt.source_id:<14} {runs[-1]['tps']:.1f} tok/s",
                      file=sys.stderr, flush=True)
        del model
    if args.transformers and not args.quality:
        runs += run_transformers(args, ckpt, prompts, eos, want)
    llama = None if llama_bin is None else run_llama(llama_bin, ckpt, args.draft, prompts, tokenizer, args.new_tokens)
    return {"bandwidth": bandwidth, "matmul_gflops": gflops, "cpu": benchlib.cpu_flags_summary(),
            "draft_step": draft_step, "llama_cpp": llama,
            "settings": {"prompts": args.prompts, "new_tokens": args.new_tokens, "gammas": list(args.gammas),
                         "draft": str(args.draft), "draft_format": args.draft_format, "quality": args.quality},
            "formats": formats, "runs": runs}


def summarize(result: dict) -> list[dict]:
    rows = []
    bounds = {f["format"]: f.get("bound_tps") for f in result["formats"]}
    for name in dict.fromkeys(r["format"] for r in result["runs"]):
        mine = [r for r in result["runs"] if r["format"] == name]
        plain = {r["prompt"]: r for r in mine if r["config"] == "plain"}
        for config in dict.fromkeys(r["config"] for r in mine):
            these = [r for r in mine if r["config"] == config]
            rows.append({"format": name, "config": config, "tps": median(r["tps"] for r in these),
                         "decode_tps": median(r["decode_tps"] for r in these),
                         "x_plain": median(ratio(r["tps"], plain[r["prompt"]]["tps"]) for r in these),
                         "of_bound": None if config != "plain" or not bounds.get(name) else
                         median(r["decode_tps"] for r in these) / bounds[name],
                         "tau": median(r["tau"] for r in these) if config != "plain" else None,
                         "drafted": None if config == "plain" else
                         median(r.get("drafted_per_drafted_step") for r in these),
                         "equals_plain": sum(r["equals_plain"] for r in these), "prompts": len(these),
                         "float32_equal": sum(r["float32_prefix"] is None for r in these),
                         "near_ties": sum(bool(r["near_tie"]) for r in these)})
    return rows


def render_quality(result: dict) -> str:
    rows = []
    for f in result["formats"]:
        mine = [r for r in result["runs"] if r["format"] == f["format"]]
        parted = [r for r in mine if r["float32_prefix"] is not None]
        rows.append([f["format"], f"{len(mine) - len(parted)}/{len(mine)}",
                     ", ".join(f"{r['prompt']} at {r['float32_prefix']}" + (" (near-tie)" if r["near_tie"] else "")
                               for r in parted) or "–"])
    return ("# minispec: greedy agreement of each weight format with float32\n\n"
            + benchlib.record_markdown(result["run"]) + "\n"
            + md_table(["format", "= float32 greedy", "first difference (token index)"], rows) + "\n")


def tau_needed(pass_ms: dict, draft_ms: float, gamma: int, target: float = 1.8) -> float:
    """The tau (tokens per verify step) at which speculation runs `target` x as fast as plain decoding.

    A step of gamma drafts costs gamma x draft_ms + pass(gamma + 1) and yields tau tokens, where
    plain decoding pays pass(1) per token:

        speed-up(tau) = tau x pass(1) / (gamma x draft_ms + pass(gamma + 1))

    so tau = target x step / pass(1). Above gamma + 1 no drafter reaches the target at this gamma.
    """
    return target * (gamma * draft_ms + _ms({"pass_ms": pass_ms}, gamma + 1)) / _ms({"pass_ms": pass_ms}, 1)


def render_tau_needed(result: dict, ks: list[int], target: float = 1.8) -> str:
    """Per format, the tau needed for `target` x with the n-gram draft (a lookup: ~0 ms) and the model draft."""
    d = result.get("draft_step")
    drafters = [("n-gram", 0.0)] + ([(result["settings"]["draft"], d["ms"])] if d else [])
    gammas = [g for g in result["settings"]["gammas"] if g + 1 in ks]
    cells = lambda f: [fmt(t, ".2f") + (" (> gamma+1)" if t > g + 1 else "")
                       for _, ms in drafters for g in gammas for t in [tau_needed(f["pass_ms"], ms, g, target)]]
    return (f"The tau a drafter must reach for {target}x over plain decoding (speed-up = tau x step(1) / "
            "(gamma x draft step + pass(gamma + 1))):\n\n"
            + md_table(["format"] + [f"{name} g{g}" for name, _ in drafters for g in gammas],
                       [[f["format"]] + cells(f) for f in result["formats"]]) + "\n")


def render(result: dict) -> str:
    if result["settings"].get("quality"):
        return render_quality(result)
    bw = result["bandwidth"]
    lines = ["# minispec: weight formats on this CPU\n", benchlib.record_markdown(result["run"]),
             f"CPU flags: {result['cpu']}. Bandwidth B = {bw['bandwidth_gbps']:.1f} GB/s "
             f"({', '.join(f'{k} {v:.1f}' for k, v in bw.items() if k != 'bandwidth_gbps')}); float32 matmul "
             f"{result['matmul_gflops']:.0f} GFLOP/s.\n"]
    ks = sorted({int(k) for f in result["formats"] for k in f["pass_ms"]})
    lines.append("## Bytes and the cost of a pass of k rows\n")
    lines.append(md_table(["format", "GB per step", "bound tok/s"] + [f"k={k} ms" for k in ks]
                          + [f"k={k} / step" for k in ks if k > 1] + ["compute floor ms per row"],
                          [[f["format"], f"{f['bytes'] / 1e9:.2f}", f"{f['bound_tps']:.1f}"]
                           + [f"{f['pass_ms'][k] if k in f['pass_ms'] else f['pass_ms'][str(k)]:.0f}" for k in ks]
                           + [f"{_ms(f, k) / _ms(f, 1):.2f}" for k in ks if k > 1]
                           + [f"{_floor(f, 1):.1f}"] for f in result["formats"]]) + "\n")
    lines.append("A verify pass of k rows against what it could cost at best, the larger of one step and its compute "
                 "floor (k x 2 x weights / the float32 matmul rate):\n")
    lines.append(md_table(["format"] + [f"k={k}" for k in ks if k > 1],
                          [[f["format"]] + [f"{_ms(f, k) / max(_ms(f, 1), _floor(f, k)):.2f}" for k in ks if k > 1]
                           for f in result["formats"]]) + "\n")
    d = result.get("draft_step")
    if d:
        lines.append(f"The draft's step ({result['settings']['draft']}, {d['format']}): {d['ms']:.1f} ms against its "
                     f"bound {d['bound_ms']:.1f} ms ({d['bytes'] / 1e9:.2f} GB / B): {d['ms'] / d['bound_ms']:.2f}x "
                     "the bound.\n")
    lines.append(render_tau_needed(result, ks))
    lines.append("## End to end (HumanEval prompts, T = 0)\n")
    lines.append(md_table(["format", "config", "tok/s", "decode tok/s", "x own plain", "of bound", "tau",
                           "drafted per drafted step", "= own plain", "= float32 greedy", "near-ties"],
                          [[r["format"], r["config"], fmt(r["tps"], ".1f"), fmt(r["decode_tps"], ".1f"),
                            fmt(r["x_plain"], ".2f") + "x", fmt(r["of_bound"], ".0%"), fmt(r["tau"], ".2f"),
                            fmt(r["drafted"], ".1f"),
                            f"{r['equals_plain']}/{r['prompts']}", f"{r['float32_equal']}/{r['prompts']}",
                            str(r["near_ties"])] for r in summarize(result)]) + "\n")
    if result.get("llama_cpp"):
        lines.append(render_llama(result["llama_cpp"], summarize(result)))
    return "\n".join(lines)


def render_llama(llama: dict, rows: list[dict]) -> str:
    """llama.cpp's rows and the ratio of minispec's fastest configuration (decode tok/s) to its fastest."""
    plain = llama["plain_tps"]
    spec = [r for r in llama["speculative"] if "error" not in r]
    errors = [r for r in llama["speculative"] if "error" in r]
    table = [[f"plain {name}", fmt(tps, ".1f")] for name, tps in plain.items()]
    if llama["speculative"]:
        table.append([f"speculative, {llama['draft']} draft, draft-n-max 5 (median of {len(spec)} prompts)",
                      fmt(median(r["decode_tps"] for r in spec), ".1f")])
    target = [t for name, t in plain.items() if name.split(",")[0] == llama["target"] and t]  # the draft's alone is another model
    best_llama = max(target + [median(r["decode_tps"] for r in spec) or 0], default=None)
    mine = [r for r in rows if r["decode_tps"] and not r["format"].startswith("transformers")]
    best = max(mine, key=lambda r: r["decode_tps"], default=None)
    text = "## llama.cpp in the same run (its own GGUF files, 2 threads, decode tok/s)\n\n"
    text += md_table(["llama.cpp", "tok/s"], table) + "\n"
    if errors:
        text += f"\nIts speculative example failed on {len(errors)} prompt(s): {errors[0]['error']}\n"
    if best and best_llama:
        text += (f"\nminispec's fastest: {best['format']} {best['config']}, {best['decode_tps']:.1f} decode tok/s = "
                 f"{best['decode_tps'] / best_llama:.2f}x llama.cpp's fastest with {llama['target']} "
                 f"({best_llama:.1f} tok/s).\n")
    return text


def _ms(f: dict, k: int) -> float:
    return f["pass_ms"][k] if k in f["pass_ms"] else f["pass_ms"][str(k)]


def _floor(f: dict, k: int) -> float:
    return f["floor_ms"][k] if k in f["floor_ms"] else f["floor_ms"][str(k)]


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__, ckpt_help="the target: a folder or a known name "
                                                        "(default: qwen2.5-coder-1.5b-instruct)")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct",
                   help="a draft model's folder or known name ('none': n-gram only)")
    p.add_argument("--draft-format", choices=list(FORMATS), default="int8-dynamic", help="the draft model's format")
    p.add_argument("--formats", type=benchlib.name_list("--formats", tuple(FORMATS)),
                   default="fast-float32,fast-bfloat16,fp16,int8-dynamic", help="comma-separated target formats")
    p.add_argument("--prompts", type=ranged(int, "--prompts", lo=1, hi=164), default=3, help="HumanEval prompts")
    p.add_argument("--new-tokens", type=ranged(int, "--new-tokens", lo=1, hi=4096), default=64)
    p.add_argument("--gammas", type=benchlib.number_list(int, "--gammas", 1), default="3,5")
    p.add_argument("--rows", type=ranged(int, "--rows", lo=1, hi=64), default=8, help="pass costs for k = 1..ROWS")
    p.add_argument("--reps", type=ranged(int, "--reps", lo=1), default=5, help="timed repetitions of each pass")
    p.add_argument("--llama-cpp", type=Path, default=None,
                   help="a llama.cpp build folder (bin/llama-bench, bin/llama-speculative-simple): measured in the same run")
    p.add_argument("--transformers", choices=["float32", "bfloat16"], default=None,
                   help="transformers' plain, prompt-lookup and assisted generate in this dtype, in the same run")
    p.add_argument("--quality", action="store_true",
                   help="plain greedy decoding only: each format's agreement with float32 (no timing, no drafts)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--ckpt" not in argv:
        argv = ["--ckpt", "qwen2.5-coder-1.5b-instruct", *argv]
    parser = build_parser()
    return benchlib.run_benchmark(PROG, argv, parser, lambda args, ckpt: measure(_draft(args), ckpt), render)


def _draft(args):
    args.draft = None if args.draft == "none" else args.draft
    return args


if __name__ == "__main__":
    sys.exit(main())

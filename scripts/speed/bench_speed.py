"""Decoding speed: how close plain and speculative decoding get to the machine's memory bandwidth.

    python scripts/speed/bench_speed.py [--kernels reference,fast,compiled] [--prompts 4] [--sections plain,speculative]

Everything is measured in one run, on the same prompts, and reported as ratios against
baselines from the same run (medians over prompts):

1. Streaming bandwidth B: a bfloat16 matrix-vector product over 256 MiB of weights (far larger
   than any cache), with F.linear, with the packed oneDNN kernel of minispec.kernels.packed and,
   when the compiled kind is measured, with TorchInductor's kernel under the compiled kind's
   options; B is the fastest. Plain decoding reads every weight once per token, so its bound is
   B / weights_bytes tokens/s.
2. Plain greedy decoding ("plain"), float32 and bfloat16: minispec with each kind of
   minispec.kernels in --kernels ("reference" is model.py as written; "compiled" is compiled
   before any timing, its compile seconds reported) and transformers' `generate`, on short chat
   prompts and Spec-Bench summarization prompts, exactly --new-tokens new tokens (eos ignored, so
   every system does the same work). Per prompt the systems take turns. Numbers: tok/s end to
   end (prefill included); decode tok/s (tokens after the first over the time after the
   prefill) and its fraction of the bound; prefill tok/s (prompt tokens over the median time of
   one forward over the prompt that yields the last position's logits, as each system's generate
   does it); tokens equal to the reference kind's (greedy: equal up to near-ties).
3. Speculative decoding ("speculative") at temperature 0 with the exact policy on Spec-Bench
   summarization and RAG prompts (up to --spec-tokens or eos): each drafter of --drafters at each
   gamma on the fast kind, n-gram on the compiled kind (compiling a draft model takes as long as
   compiling the target), against the same kind's plain decoding; transformers' plain and
   prompt-lookup generation. tau from the loop's stats; "= plain greedy" counts outputs equal
   to plain greedy decoding's on the same kind (float32 must match; bfloat16 may part at
   near-ties, where a (gamma+1)-row verify rounds differently from a 1-row decode step).

Writes bench_speed.json and .md to --out (default out/bench_speed/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from minispec.kernels import measure as probe
from benchlib import fmt, md_table, median, ratio

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402

PROG = "bench_speed"
SECTIONS = ("plain", "speculative")


# ------------------------------------------------------------------------------------ bandwidth


def measure_bandwidth(with_compiled: bool = False) -> dict:
    """minispec.kernels.measure.bandwidth, and (with_compiled) TorchInductor's bfloat16 matrix-vector
    product over the same 256 MiB; bandwidth_gbps is the fastest."""
    result = probe.bandwidth()
    if with_compiled:
        from minispec.kernels.compiled import INDUCTOR_OPTIONS

        dense = torch.nn.Linear(4096, 32768, bias=False).to(torch.bfloat16).requires_grad_(False)
        x = torch.randn(1, 4096).to(torch.bfloat16)  # [1, in]
        with torch.no_grad(), torch._inductor.config.patch(INDUCTOR_OPTIONS):
            matvec = torch.compile(dense)
            result["compiled_bfloat16_gbps"] = 2 * dense.weight.numel() / benchlib.timed(lambda: matvec(x), 15) / 1e9
        result["bandwidth_gbps"] = max(result.values())
    return result


# ----------------------------------------------------------------------------- plain decoding


def plain_run(system: str, model, ids: list[int], new_tokens: int, eos: list[int]) -> dict:
    """Greedy decoding of exactly `new_tokens` (eos = []) or up to eos: tokens, seconds, decode tok/s."""
    if system == "transformers":
        tokens, seconds = benchlib.hf_generate(model, ids, new_tokens, eos)
        return {"tokens": tokens, "seconds": seconds, "decode_tps": None}
    from minispec.chain.speculative import generate_chain as generate

    result = generate(model, ids, max_new_tokens=new_tokens, eos_token_ids=eos)
    s = result.stats
    return {"tokens": result.tokens, "seconds": s["total_seconds"],
            "decode_tps": ratio(len(result.tokens) - 1, s["total_seconds"] - s["prefill_seconds"])}


def prefill_seconds(system: str, model, ids: list[int], reps: int) -> float:
    """Median seconds to feed the prompt into a fresh cache and get the last position's logits,
    as each system's generate does it (transformers: logits_to_keep=1; minispec: the LM head on
    the last row only)."""
    x = torch.tensor([ids])  # [1, P]
    if system == "transformers":
        fn = lambda: model(x, use_cache=True, logits_to_keep=1)  # noqa: E731
    else:
        fn = lambda: model.head(model.forward_hidden(x, model.new_cache(1, len(ids)))[0, -1])  # noqa: E731
    with torch.inference_mode():
        return benchlib.timed(fn, reps)


def bench_plain(systems: dict, prompts: dict[str, list[list[int]]], new_tokens: int, reps: int) -> list[dict]:
    """Every system on every prompt, taking turns per prompt (so a drift hits all alike)."""
    records = []
    for set_name, prompt_list in prompts.items():
        for i, ids in enumerate(prompt_list):
            for system, model in systems.items():
                with torch.inference_mode():
                    runs = [plain_run(system, model, ids, new_tokens, eos=[]) for _ in range(reps)]
                seconds = median(r["seconds"] for r in runs)
                records.append({
                    "set": set_name, "prompt": i, "system": system, "prompt_tokens": len(ids),
                    "new_tokens": len(runs[0]["tokens"]), "tokens": runs[0]["tokens"],
                    "tps": len(runs[0]["tokens"]) / seconds, "decode_tps": median(r["decode_tps"] for r in runs),
                    "prefill_tps": len(ids) / prefill_seconds(system, model, ids, max(reps, 3)),
                })
    return records


def summarise_plain(records: list[dict], wbytes: dict[str, int], bandwidth: float) -> list[dict]:
    """One row per (dtype, set): medians per system, ratios to transformers, fraction of the bound
    bandwidth / weights_bytes, and how many prompts gave the reference kind's tokens."""
    rows = []
    for dtype_name, set_name in sorted({(r["dtype"], r["set"]) for r in records}):
        group = [r for r in records if r["dtype"] == dtype_name and r["set"] == set_name]
        systems = list(dict.fromkeys(r["system"] for r in group))
        med = lambda system, key: median(r[key] for r in group if r["system"] == system)  # noqa: E731
        bound = bandwidth / wbytes[dtype_name]
        hf, hf_prefill = med("transformers", "tps"), med("transformers", "prefill_tps")
        reference = {r["prompt"]: r["tokens"] for r in group if r["system"] == "reference"}
        row = {"dtype": dtype_name, "set": set_name, "bound_tps": bound, "systems": systems,
               "prompt_tokens": median(r["prompt_tokens"] for r in group),
               "prompts": len({r["prompt"] for r in group})}
        for system in systems:
            row[f"{system}_tps"] = med(system, "tps")
            row[f"{system}_prefill_tps"] = med(system, "prefill_tps")
            if system == "transformers":
                continue
            row[f"{system}_decode_tps"] = med(system, "decode_tps")
            row[f"{system}_vs_hf"] = ratio(row[f"{system}_tps"], hf)
            row[f"{system}_of_bound"] = ratio(row[f"{system}_decode_tps"], bound)
            row[f"{system}_prefill_vs_hf"] = ratio(row[f"{system}_prefill_tps"], hf_prefill)
            if reference:
                row[f"{system}_same_as_reference"] = sum(r["tokens"] == reference[r["prompt"]] for r in group
                                                         if r["system"] == system)
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------- speculative


def bench_speculative(targets: dict, prompts: dict[str, list[list[int]]], gammas, max_new_tokens: int,
                      eos: list[int], hf) -> list[dict]:
    """Per prompt: each minispec system's plain decoding and its drafters at each gamma (exact
    policy, T = 0); transformers' plain and prompt-lookup generation."""
    from minispec.chain.speculative import generate_chain as generate

    records = []
    for set_name, prompt_list in prompts.items():
        for i, ids in enumerate(prompt_list):
            def record(system, drafter, gamma, tokens, seconds, stats=None):
                decode = None if stats is None else ratio(len(tokens) - 1, stats["total_seconds"] - stats["prefill_seconds"])
                records.append({"set": set_name, "prompt": i, "system": system, "drafter": drafter, "gamma": gamma,
                                "prompt_tokens": len(ids), "new_tokens": len(tokens), "tokens": tokens,
                                "tps": len(tokens) / seconds, "tau": None if stats is None else stats.get("tau"),
                                "decode_tps": decode})  # after the target's prefill (a draft's own prefill is in it)

            with torch.inference_mode():
                for system, (model, drafters) in targets.items():
                    plain = generate(model, ids, max_new_tokens=max_new_tokens, eos_token_ids=eos)
                    record(system, "plain", None, plain.tokens, plain.stats["total_seconds"], plain.stats)
                    for name, drafter in drafters.items():
                        for gamma in gammas:
                            out = generate(model, ids, max_new_tokens=max_new_tokens, draft=drafter, policy="exact",
                                           gamma=gamma, eos_token_ids=eos)
                            record(system, name, gamma, out.tokens, out.stats["total_seconds"], out.stats)
            if hf is not None:
                record("transformers", "plain", None, *benchlib.hf_generate(hf, ids, max_new_tokens, eos))
                for gamma in gammas:
                    record("transformers", "prompt-lookup", gamma,
                           *benchlib.hf_generate(hf, ids, max_new_tokens, eos, prompt_lookup=gamma))
    return records


def summarise_speculative(records: list[dict]) -> list[dict]:
    """One row per (dtype, set, system, drafter, gamma): medians, and ratios to the same system's
    plain decoding (transformers: to the fast kind's, else the first minispec system's) and to
    transformers' plain generate; the best minispec config over the best prompt lookup."""
    rows = []
    for dtype_name, set_name in sorted({(r["dtype"], r["set"]) for r in records}):
        group = [r for r in records if r["dtype"] == dtype_name and r["set"] == set_name]
        plains = {}
        for r in group:
            if r["drafter"] == "plain":
                plains.setdefault(r["system"], {})[r["prompt"]] = r
        ours = [s for s in plains if s != "transformers"]
        our_default = "fast" if "fast" in plains else (ours[0] if ours else None)
        hf_plain = median(r["tps"] for r in plains.get("transformers", {}).values())
        configs = list(dict.fromkeys((r["system"], r["drafter"], r["gamma"]) for r in group))
        new = []
        for system, drafter, gamma in configs:
            sel = [r for r in group if (r["system"], r["drafter"], r["gamma"]) == (system, drafter, gamma)]
            plain = plains.get(system if system != "transformers" else our_default, {})
            tps, decode_tps = median(r["tps"] for r in sel), median(r["decode_tps"] for r in sel)
            new.append({
                "dtype": dtype_name, "set": set_name, "system": system, "drafter": drafter, "gamma": gamma,
                "tps": tps, "tau": median(r["tau"] for r in sel), "decode_tps": decode_tps,
                "vs_our_plain": ratio(tps, median(r["tps"] for r in plain.values())),
                "decode_vs_our_plain": ratio(decode_tps, median(r["decode_tps"] for r in plain.values())),
                "vs_hf_plain": ratio(tps, hf_plain),
                "same_as_plain": sum(r["prompt"] in plain and r["tokens"] == plain[r["prompt"]]["tokens"] for r in sel),
                "prompts": len(sel),
            })
        spec = [r for r in new if r["system"] != "transformers" and r["drafter"] != "plain"]
        lookup = [r for r in new if r["drafter"] == "prompt-lookup"]
        if spec and lookup:
            best, best_hf = max(spec, key=lambda r: r["tps"]), max(lookup, key=lambda r: r["tps"])
            for r in new:
                r["best_ours_vs_best_hf_prompt_lookup"] = ratio(best["tps"], best_hf["tps"])
                r["best_ours_config"] = f"{best['system']} {best['drafter']} g{best['gamma']}"
                r["best_hf_config"] = f"prompt-lookup g{best_hf['gamma']}"
        rows += new
    return rows


# ------------------------------------------------------------------------------------- markdown


def render(result: dict) -> str:
    s, bw = result["settings"], result["bandwidth"]
    parts = ["# minispec: decoding speed\n", benchlib.record_markdown(result["run"]),
             "Streaming bandwidth (a one-row matrix-vector product over 256 MiB of weights): "
             + ", ".join(f"{key.removesuffix('_gbps').replace('_', ' ')} {fmt(value, '.1f')} GB/s"
                         for key, value in bw.items() if key.endswith("_gbps") and key != "bandwidth_gbps")
             + f"; B = {fmt(bw['bandwidth_gbps'], '.1f')} GB/s.\n"]
    if result["compile_seconds"]:
        parts.append("Compiled kind: " + ", ".join(f"{d} {v:.0f} s" for d, v in result["compile_seconds"].items())
                     + " of compiling before any timing.\n")
    if result["plain"]:
        parts += ["## Plain greedy decoding\n",
                  f"{s['new_tokens']} new tokens (eos ignored), median over prompts. tok/s is end to end (prefill "
                  "included); 'of bound' = decode tok/s / (B / weights_bytes); prefill = one forward over the prompt; "
                  "'= reference' = prompts whose tokens equal the reference kind's.\n"]
        for row in result["plain"]:
            ours = [x for x in row["systems"] if x != "transformers"]
            parts += [f"### {row['dtype']}, {row['set']} ({row['prompts']} prompts, median {fmt(row['prompt_tokens'], '.0f')} "
                      f"prompt tokens; bound {fmt(row['bound_tps'], '.1f')} tok/s)\n",
                      md_table(["system", "tok/s", "vs transformers", "decode tok/s", "of bound", "prefill tok/s",
                                "prefill vs transformers", "= reference"],
                               [[x, fmt(row[f"{x}_tps"], ".1f"), fmt(row.get(f"{x}_vs_hf"), ".2f", "x"),
                                 fmt(row.get(f"{x}_decode_tps"), ".1f"), fmt(row.get(f"{x}_of_bound"), ".0%"),
                                 fmt(row[f"{x}_prefill_tps"], ".0f"), fmt(row.get(f"{x}_prefill_vs_hf"), ".2f", "x"),
                                 f"{row[f'{x}_same_as_reference']}/{row['prompts']}"
                                 if f"{x}_same_as_reference" in row else "–"]
                                for x in ours + (["transformers"] if "transformers" in row["systems"] else [])]) + "\n"]
    if result["speculative"]:
        parts += ["## Speculative decoding, T = 0, exact policy (stops at eos)\n",
                  f"Up to {s['spec_tokens']} new tokens. tok/s is end to end; decode tok/s counts the tokens after the "
                  "first over the time after the target's prefill. 'vs our plain' = over the same kind's plain "
                  "decoding (transformers rows: the fast kind's); '= plain greedy' = outputs equal to that plain "
                  "decoding's.\n",
                  md_table(["dtype", "prompts", "system", "drafter", "gamma", "tau", "tok/s", "vs our plain",
                            "vs transformers plain", "decode tok/s", "decode vs our plain", "= plain greedy"],
                           [[r["dtype"], r["set"], r["system"], r["drafter"], fmt(r["gamma"], "d"), fmt(r["tau"]),
                             fmt(r["tps"], ".1f"), fmt(r["vs_our_plain"], ".2f", "x"), fmt(r["vs_hf_plain"], ".2f", "x"),
                             fmt(r["decode_tps"], ".1f"), fmt(r["decode_vs_our_plain"], ".2f", "x"),
                             f"{r['same_as_plain']}/{r['prompts']}"] for r in result["speculative"]]) + "\n"]
        best = {(r["dtype"], r["set"]): r for r in result["speculative"] if "best_ours_vs_best_hf_prompt_lookup" in r}
        if best:
            parts.append("Best minispec speculative config / best transformers prompt-lookup config (tok/s): " + "; ".join(
                f"{d} {st}: **{fmt(r['best_ours_vs_best_hf_prompt_lookup'], '.2f', 'x')}** ({r['best_ours_config']} / "
                f"{r['best_hf_config']})" for (d, st), r in best.items()) + "\n")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------- main


DRAFTERS = ("ngram", "self:bf16", "self:int8")


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__, kernels="reference,fast,compiled",
                               kernels_help="compiling takes minutes; speculative decoding runs on fast and compiled")
    p.add_argument("--sections", type=benchlib.name_list("--sections", SECTIONS), default="plain,speculative",
                   help="comma-separated")
    p.add_argument("--prompts", type=ranged(int, "--prompts", lo=1), default=4, help="prompts per set")
    p.add_argument("--new-tokens", type=ranged(int, "--new-tokens", lo=1), default=64, help="plain decoding: new tokens")
    p.add_argument("--spec-tokens", type=ranged(int, "--spec-tokens", lo=1), default=128,
                   help="speculative decoding: most new tokens (stops at eos)")
    p.add_argument("--gammas", type=benchlib.number_list(int, "--gammas", 1), default="3,5,8",
                   help="comma-separated draft lengths (the compiled kind is tuned for the first)")
    p.add_argument("--drafters", type=benchlib.name_list("--drafters", DRAFTERS), default="ngram,self:bf16,self:int8",
                   help="comma-separated, on the fast kind (self:bf16 with a float32 target only)")
    p.add_argument("--reps", type=ranged(int, "--reps", lo=1), default=1, help="plain runs per prompt and system (median)")
    p.add_argument("--no-transformers", dest="transformers", action="store_false", help="leave transformers out")
    return p


def run(args, ckpt: Path) -> dict:
    """Bandwidth, then per dtype the plain and speculative sections: the result's entries."""
    import minispec

    tokenizer = minispec.load_tokenizer(ckpt)
    ids = lambda name: [p.ids for p in benchlib.load_prompts([name], args.prompts, tokenizer)]  # noqa: E731
    summarization = ids("summarization")
    plain_prompts = {"chat": ids("chat"), "summarization": summarization}
    spec_prompts = {"summarization": summarization, "rag": ids("rag")}
    eos = list(tokenizer.eos_token_ids)
    print(f"{PROG}: bandwidth ...", file=sys.stderr)
    bandwidth = measure_bandwidth(with_compiled="compiled" in args.kernels)
    plain, speculative, wbytes, compile_seconds = [], [], {}, {}
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        systems, targets = {}, {}
        for kind in args.kernels:
            if not benchlib.runs_here(PROG, dtype_name, kind):
                continue
            spec_kind = kind != "reference" and "speculative" in args.sections
            drafters = () if not spec_kind else ("ngram",) if kind == "compiled" else \
                tuple(d for d in args.drafters if d != "self:bf16" or dtype == torch.float32)
            print(f"{PROG}: loading {dtype_name}, {kind} ...", file=sys.stderr)
            loaded = benchlib.load_minispec(ckpt, dtype, kind, drafters=drafters,
                                            verify_rows=[g + 1 for g in args.gammas] if spec_kind else ())
            wbytes[dtype_name] = loaded.weights_bytes
            if loaded.compile_seconds is not None:
                compile_seconds[dtype_name] = loaded.compile_seconds
            systems[kind] = loaded.model
            if spec_kind:
                targets[kind] = (loaded.model, loaded.drafters)
        hf = benchlib.load_transformers(ckpt, dtype) if args.transformers else None
        if hf is not None:
            systems["transformers"] = hf
        if "plain" in args.sections:
            print(f"{PROG}: plain decoding, {dtype_name} ...", file=sys.stderr)
            plain += [{"dtype": dtype_name, **r} for r in bench_plain(systems, plain_prompts, args.new_tokens, args.reps)]
        if "speculative" in args.sections:
            print(f"{PROG}: speculative decoding, {dtype_name} ...", file=sys.stderr)
            speculative += [{"dtype": dtype_name, **r}
                            for r in bench_speculative(targets, spec_prompts, args.gammas, args.spec_tokens, eos, hf)]
        del systems, targets, hf
    return {"settings": {"new_tokens": args.new_tokens, "spec_tokens": args.spec_tokens, "gammas": list(args.gammas),
                         "prompts": args.prompts, "reps": args.reps},
            "bandwidth": bandwidth, "weights_bytes": wbytes, "compile_seconds": compile_seconds,
            "plain": summarise_plain(plain, wbytes, bandwidth["bandwidth_gbps"] * 1e9),
            "speculative": summarise_speculative(speculative),
            "records": {"plain": plain, "speculative": speculative}}


def main(argv: list[str] | None = None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), run, render)


if __name__ == "__main__":
    sys.exit(main())

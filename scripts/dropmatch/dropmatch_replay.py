"""DropMatch replayed along fixed text: what it would decide at every position, from one forward.

    python scripts/dropmatch/dropmatch_replay.py [--sets rag:10,gsm8k:50] [--ps 0.3,0.01] [--paths 3,5,10] [--stride 2]

A sweep over DropMatch's settings through the real loop costs a generation per setting and
prompt. Most of what a sweep asks needs far less. Fix the text: the prompt and the target's own
greedy continuation. Then ONE target forward over it gives, at every position t,

    hidden[t]          the LM-head input (after the final norm): what DropMatch drops out;
                       head(hidden[t]) is the clean head, the base policy's view
    exit_hidden[N][t]  block N's output through the final norm: an early-exit draft's LM-head
                       input (captured by a hook in the same forward)

(a self-draft's or a separate draft model's rows come from one forward of that model over the
same text; a separate draft must share the target's tokenizer and vocabulary), and every
DropMatch setting replays on these rows: the draft token at t is the drafter's proposal given
the same context (an early exit's argmax, an n-gram lookup; at T = 1 a draw from the draft's
softmax). `replay` computes the verdicts with the policy's own methods (path_logits,
base_acceptances, verdicts); `sweep` computes the same verdicts for every K, criterion,
drafter and temperature from ONE set of dropout paths per p (tests hold the two equal).
Reported per (drafter, T, p, K), pooled over prompts, with 95% bootstrap intervals over prompts:

    base             share of drafted positions the base accepts (exact at T = 0, sampling at T = 1)
    accept           share the policy accepts (its base OR DropMatch), per criterion; gain = accept - base
    largest vote     the paper's Table 2: share of positions by the largest number of the K heads
                     that agree on one token (K of K = all heads agree)
    all = clean      share of positions where every head's argmax is the clean argmax
    JS sides         the paper's Table 3: JS(q, pbar) and the radius, where the heads disperse
                     and where they agree

What it does not give: tau and quality. A position DropMatch accepts against the target's argmax
moves a real run off this text, so tau, agreement, NLL and task scores come from real runs of the
loop (scripts/dropmatch/dropmatch_quality.py); the replay is for finding where to look.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import fmt, md_table

import torch  # noqa: E402

from minispec.acceptance.base import VerifyInput  # noqa: E402
from minispec.acceptance.dropmatch.rule import CRITERIA, DropMatch, js_divergence, vote_acceptances  # noqa: E402
from minispec.acceptance.sampling import sample_acceptances  # noqa: E402
from minispec.cli import ranged  # noqa: E402
from minispec.errors import MinispecError  # noqa: E402
from minispec.model.sampling import SamplingParams, greedy_token, logits_to_probs  # noqa: E402

PROG = "dropmatch_replay"


@dataclass
class Recording:
    """The fixed text's rows. Row j is position start + j, which predicts token start + j + 1.

    Logits are not kept (a [n, V] float32 row block is 25 MB per 128 tokens): they are the head
    applied to these hidden rows, recomputed chunk by chunk where they are needed."""

    ids: list[int]  # prompt + continuation
    start: int  # len(prompt) - 1: the first position whose prediction is part of the continuation
    hidden: torch.Tensor  # [n, d] the LM-head input at positions start .. len(ids) - 2
    exit_hidden: dict[int, torch.Tensor]  # N -> [n, d] block N's output through the final norm

    @property
    def next_tokens(self) -> list[int]:
        """The token each row is followed by in the text: [n]."""
        return self.ids[self.start + 1:]


@torch.inference_mode()
def record(model, prompt: list[int], continuation: list[int], exit_layers=()) -> Recording:
    """One forward over prompt + continuation, keeping the rows of the continuation's positions."""
    ids = prompt + continuation
    start, captured = len(prompt) - 1, {}
    hooks = [model.layers[n - 1].register_forward_hook(lambda _m, _i, out, n=n: captured.__setitem__(n, out))
             for n in exit_layers]
    try:
        hidden = model.forward_hidden(torch.tensor([ids], device=model.device))[0, start:-1]  # [n, d]
    finally:
        for hook in hooks:
            hook.remove()
    exit_hidden = {n: model.norm(x[0, start:-1]) for n, x in captured.items()}  # N -> [n, d]
    return Recording(ids, start, hidden, exit_hidden)


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    """bf16 logits to float32; float32 and float64 as they are."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def ngram_drafts(rec: Recording, max_ngram: int = 3) -> torch.Tensor:
    """The n-gram drafter's proposal at every row (its first draft token given the text so far),
    or -1 where it finds no match: [n]."""
    from minispec.chain.drafters import NgramDrafter

    lookup = NgramDrafter(max_ngram).lookup
    return torch.tensor([(lookup(rec.ids[:rec.start + 1 + j], 1) or [-1])[0] for j in range(len(rec.next_tokens))],
                        dtype=torch.long)


@dataclass
class DraftRows:
    """One drafter's proposal at every pooled row: tokens [N] (-1: none) and, for a drafter with a
    distribution, the LM-head input it scores [N, d] and its head (logits = head(hidden))."""

    tokens: torch.Tensor  # [N] its greedy proposal (-1 where an n-gram finds no match)
    hidden: torch.Tensor | None = None  # [N, d] or None (one-hot drafts)
    head: Callable[[torch.Tensor], torch.Tensor] | None = None

    def logits(self, rows: torch.Tensor) -> torch.Tensor | None:
        return None if self.hidden is None else _upcast(self.head(self.hidden[rows]))  # [c, V]


@torch.inference_mode()
def replay(policy: DropMatch, rec: Recording, head, draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None,
           params: SamplingParams = SamplingParams(), chunk: int = 32,
           criteria: tuple[str, ...] | None = None, target_logits: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """DropMatch's per-position verdicts on the rows where draft_tokens >= 0, computed by the
    policy's own methods (path_logits, base_acceptances, verdicts): each a [m] tensor.

    draft_tokens [n] (-1: nothing drafted at that row), draft_logits [n, V] or None (one-hot
    drafts); target_logits [n, V] (default: head(rec.hidden)). Rows go through the policy in
    chunks, each chunk one VerifyInput whose "drafts" are the chunk's rows: the verdicts per
    position do not depend on each other (only the prefix rule, which a replay does not apply,
    does). Masks come from the policy's own generator, one [K, c+1, d] draw per chunk, as a loop
    step of gamma = c draws them. `criteria` (default: the policy's) are all judged on the same
    paths: "accepted:<criterion>" is the policy's verdict with that criterion (OR its base if
    or_base). Also: "base", "all_clean" (every head keeps the clean argmax), "largest_vote"
    (votes of the most chosen head token), "js_draft" = JS(q || pbar), "radius" = max_k JS(p_k || pbar).
    This is the slow, literal replay: `sweep` computes the same for many settings at once.
    """
    criteria = criteria or (policy.criterion,)
    judges = {c: copy.copy(policy) for c in criteria}
    for criterion, judge in judges.items():
        judge.criterion = criterion
    rows = (draft_tokens >= 0).nonzero()[:, 0]  # [m]
    keys = ["base", "all_clean", "largest_vote", "js_draft", "radius"] + [f"accepted:{c}" for c in criteria]
    out: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    for part in rows.split(chunk) if len(rows) else ():
        hidden = rec.hidden[part]  # [c, d]
        clean_rows = _upcast(head(hidden)) if target_logits is None else target_logits[part]  # [c, V]
        target = torch.cat([clean_rows, clean_rows[-1:]])  # [c+1, V]: a bonus row
        tokens = draft_tokens[part]  # [c]
        logits = None if draft_logits is None else draft_logits[part].to(target.dtype)  # [c, V]
        q_draft = (torch.nn.functional.one_hot(tokens, target.shape[1]).to(target.dtype)
                   if logits is None else logits_to_probs(logits, params))  # [c, V]
        inp = VerifyInput(tokens, q_draft, target, logits_to_probs(target, params), params,
                          torch.Generator().manual_seed(0), logits, hidden=torch.cat([hidden, hidden[-1:]]), head=head)
        clean = greedy_token(target)  # [c+1]
        path_logits = policy.path_logits(inp.hidden, head, target)[:, :-1]  # [K, c, V]
        head_tokens = greedy_token(path_logits)  # [K, c]
        base = policy.base_acceptances(inp, clean)  # [c]
        out["base"].append(base)
        for criterion, judge in judges.items():
            own = judge.verdicts(inp, path_logits, head_tokens)  # [c]
            out[f"accepted:{criterion}"].append(own | base if policy.or_base else own)
        out["all_clean"].append((head_tokens == clean[:-1]).all(dim=0))
        out["largest_vote"].append(largest_vote(head_tokens))
        js_draft, radius = js_terms(policy, inp, path_logits)
        out["js_draft"].append(js_draft)
        out["radius"].append(radius)
    return {k: torch.cat(v) if v else torch.zeros(0) for k, v in out.items()}


def largest_vote(head_tokens: torch.Tensor) -> torch.Tensor:
    """[c]: how many of the K heads chose the most chosen token. head_tokens [K, c]."""
    same = head_tokens.unsqueeze(1) == head_tokens.unsqueeze(0)  # [K, K, c]
    return same.sum(dim=1).amax(dim=0)


@torch.inference_mode()
def sweep(rows_hidden: torch.Tensor, head, drafts: dict[str, DraftRows], p: float, paths: tuple[int, ...],
          temperatures: tuple[float, ...] = (0.0,), majority: str = "strict", chunk: int = 32,
          seed: int = 0, js_temperature: float = 1.0) -> dict:
    """Every (K, drafter, T) verdict of DropMatch(p) at every row, from ONE set of dropout paths.

    rows_hidden [N, d]: the target's LM-head inputs (pooled over prompts). The K_max = max(paths)
    paths of a chunk come from DropMatch(p, K_max, seed).path_logits (masks [K_max, c+1, d], as
    replay draws them); K < K_max uses the first K of them (the paths are i.i.d., so the first K
    ARE a K-path DropMatch). The JS test's two sides are computed once per (K, drafter) and
    shared by every criterion and temperature (at T = 1 the JS test's temperature is 1, as it
    is at T = 0 with js_temperature = 1). Per (K, drafter, T), [m] tensors over the drafter's
    drafted rows: "rows" (their index), "base" (exact at T = 0; at T = 1 speculative sampling's
    u < p(x)/q(x)), "own:<criterion>" (DropMatch's own verdict), "token" (the draft token; at
    T = 1 drawn from q), "js_draft", "radius", "all_clean", "largest_vote".
    At T = 1 the draft token is a sample from the drafter's softmax (an n-gram's token as is),
    and the uniforms come from a generator seeded per chunk: sweeps are reproducible.
    """
    k_max = max(paths)
    policy = DropMatch(p=p, paths=k_max, seed=seed, majority=majority, js_temperature=js_temperature)
    out: dict = {}
    for index, part in enumerate(torch.arange(rows_hidden.shape[0]).split(chunk)):
        hidden = rows_hidden[part]  # [c, d]
        clean_logits = _upcast(head(hidden))  # [c, V]
        clean = greedy_token(clean_logits)  # [c]
        path_logits = policy.path_logits(torch.cat([hidden, hidden[-1:]]), head,
                                         torch.cat([clean_logits, clean_logits[-1:]]))[:, :-1]  # [K_max, c, V]
        head_tokens = greedy_token(path_logits)  # [K_max, c]
        head_probs = torch.softmax(path_logits / js_temperature, dim=-1)  # [K_max, c, V]: p_k
        p_target = torch.softmax(clean_logits, dim=-1)  # [c, V] at T = 1
        draft_views = {}
        for name, draft in drafts.items():
            have = draft.tokens[part] >= 0  # [c]
            if not bool(have.any()):
                continue
            logits = draft.logits(part)  # [c, V] or None
            tokens = draft.tokens[part].clamp(min=0)  # [c]
            q_draft = (torch.nn.functional.one_hot(tokens, clean_logits.shape[1]).to(clean_logits.dtype)
                       if logits is None else torch.softmax(logits / js_temperature, dim=-1))  # [c, V]
            draft_views[name] = (have, tokens, q_draft)
        for num_paths in paths:
            own_logits = path_logits[:num_paths]  # [K, c, V]
            centroid = own_logits.mean(dim=0) if p > 0 else own_logits[0]  # [c, V]
            pbar = torch.softmax(centroid / js_temperature, dim=-1)  # [c, V]
            radius = js_divergence(head_probs[:num_paths], pbar).amax(dim=0)  # [c]
            tokens_k = head_tokens[:num_paths]  # [K, c]
            all_clean = (tokens_k == clean).all(dim=0)  # [c]
            votes_top = largest_vote(tokens_k)  # [c]
            for name, (have, greedy_tokens, q_draft) in draft_views.items():
                js_draft = js_divergence(q_draft, pbar)  # [c]
                for temperature in temperatures:
                    if temperature == 0:
                        tokens, base = greedy_tokens, greedy_tokens == clean
                    else:
                        generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
                        tokens = (greedy_tokens if drafts[name].hidden is None
                                  else torch.multinomial(q_draft, 1, generator=generator)[:, 0])  # [c]
                        base = sample_acceptances(p_target, q_draft, tokens, generator)  # [c]
                    js = js_draft <= radius
                    vote = vote_acceptances(tokens_k, tokens, majority)
                    own = {"js_or_majority": js | vote, "js": js, "majority": vote,
                           "naive": vote_acceptances(tokens_k, tokens, "naive")}
                    values = {"rows": part, "base": base, "token": tokens, "js_draft": js_draft, "radius": radius,
                              "all_clean": all_clean, "largest_vote": votes_top,
                              **{f"own:{c}": v for c, v in own.items()}}
                    bucket = out.setdefault((num_paths, name, temperature), {k: [] for k in values})
                    for k, v in values.items():
                        bucket[k].append(v[have])
    return {key: {k: torch.cat(v) for k, v in bucket.items()} for key, bucket in out.items()}


def js_terms(policy: DropMatch, inp: VerifyInput, path_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two sides of the JS test as DropMatch.js_test computes them: JS(q || pbar) and
    max_k JS(p_k || pbar), each [c]. path_logits [K, c, V]."""
    temperature = policy.js_temperature if inp.params.greedy else inp.params.temperature
    centroid = path_logits.mean(dim=0) if policy.p > 0 else path_logits[0]  # [c, V]
    pbar = torch.softmax(centroid / temperature, dim=-1)  # [c, V]
    draft_probs = (inp.q_draft.to(path_logits.dtype) if inp.draft_logits is None
                   else torch.softmax(inp.draft_logits.to(path_logits.dtype) / temperature, dim=-1))  # [c, V]
    radius = js_divergence(torch.softmax(path_logits / temperature, dim=-1), pbar).amax(dim=0)  # [c]
    return js_divergence(draft_probs, pbar), radius


def summarise(verdicts: dict[str, torch.Tensor], row_prompt: torch.Tensor, paths: int, criteria=CRITERIA,
              or_base: bool = True, resamples: int = 1000) -> dict:
    """One (drafter, p, K, T) of a sweep, pooled over prompts (every drafted position counts once):
    shares, the gain of each criterion over its base with a 95% bootstrap interval over prompts,
    the paper's Table 2 (positions by largest vote) and Table 3 (mean JS of the draft and radius to
    the centroid, where the heads disperse vs where all K agree). row_prompt [N]: each row's prompt."""
    share = lambda x: float(x.double().mean()) if len(x) else None  # noqa: E731
    base = verdicts["base"]
    row = {"positions": len(base), "base": share(base), "all_clean": share(verdicts["all_clean"]),
           "accept": {}, "gain_ci": {},
           "largest_vote": [share(verdicts["largest_vote"] == k) for k in range(1, paths + 1)]}  # Table 2
    prompt = row_prompt[verdicts["rows"]]  # [m]
    num_prompts = int(row_prompt.max()) + 1 if len(row_prompt) else 0
    per_prompt = lambda x: torch.zeros(num_prompts, dtype=torch.float64).index_add_(0, prompt, x.double())  # noqa: E731
    drafted = per_prompt(torch.ones_like(base))
    for criterion in criteria:
        own = verdicts[f"own:{criterion}"]
        accepted = own | base if or_base else own
        row["accept"][criterion] = share(accepted)
        row["gain_ci"][criterion] = bootstrap_ratio_ci(per_prompt(accepted.long() - base.long()), drafted, resamples)
    concentrated = verdicts["largest_vote"] == paths  # [m]: all K heads chose one token
    row["dispersed"] = share(~concentrated)
    for side in ("js_draft", "radius"):  # Table 3
        row[f"{side}_dispersed"] = share(verdicts[side][~concentrated])
        row[f"{side}_concentrated"] = share(verdicts[side][concentrated])
    return row


def bootstrap_ratio_ci(numerator: torch.Tensor, denominator: torch.Tensor, resamples: int = 1000,
                       seed: int = 0) -> list[float] | None:
    """95% percentile interval of sum(numerator) / sum(denominator) over prompts resampled with
    replacement (numerator, denominator [P], one entry per prompt)."""
    if resamples <= 0 or len(numerator) == 0:
        return None
    picks = torch.randint(len(numerator), (resamples, len(numerator)), generator=torch.Generator().manual_seed(seed))
    ratios = numerator[picks].sum(dim=1) / denominator[picks].sum(dim=1).clamp(min=1e-12)  # [resamples]
    low, high = torch.quantile(ratios.double(), torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return [low, high]


def render(result: dict) -> str:
    s = result["settings"]
    rows, criteria = result["rows"], s["criteria"]
    k_max = max(s["paths"])
    label = lambda r: [r["drafter"], f"{r['temperature']:g}", f"{r['p']:g}", str(r["paths"])]  # noqa: E731
    head = ["drafter", "T", "p", "K"]
    ci = lambda r, c: "" if r["gain_ci"].get(c) is None else " [{:+.1%}, {:+.1%}]".format(*r["gain_ci"][c])  # noqa: E731
    accept = md_table(head + ["positions", "base"] + [f"{c}: accept (gain [95% CI])" for c in criteria],
                      [label(r) + [str(r["positions"]), fmt(r["base"], ".1%")]
                       + [f"{fmt(r['accept'][c], '.1%')} ({fmt(r['accept'][c] - r['base'], '+.1%')}{ci(r, c)})"
                          for c in criteria] for r in rows])
    agreement = [r for r in rows if r["temperature"] == s["temperatures"][0] and r["drafter"] == rows[0]["drafter"]]
    table2 = md_table(["p", "K", "all = clean"] + [f"votes {k}" for k in range(1, k_max + 1)],
                      [[f"{r['p']:g}", str(r["paths"]), fmt(r["all_clean"], ".1%")]
                       + [fmt(v, ".1%") for v in r["largest_vote"]] + ["" for _ in range(k_max - r["paths"])]
                       for r in agreement])
    table3 = md_table(head + ["dispersed", "JS draft, disp.", "radius, disp.", "JS draft, conc.", "radius, conc."],
                      [label(r) + [fmt(r["dispersed"], ".0%")] + [fmt(r[k], ".4f") for k in (
                          "js_draft_dispersed", "radius_dispersed", "js_draft_concentrated", "radius_concentrated")]
                       for r in rows if r["temperature"] == s["temperatures"][0]])
    return "\n".join([
        "# minispec: DropMatch replayed along the target's greedy text\n", benchlib.record_markdown(result["run"]),
        f"{s['num_prompts']} prompts ({', '.join(f'{n} {k}' for k, n in s['prompts_by_set'].items())}); greedy "
        f"continuations of up to {s['max_new_tokens']} tokens, {s['positions']} positions (fp32, fast kernels); "
        f"majority {s['majority']}, base OR-ed (exact at T = 0, speculative sampling at T = 1). Shares over drafted "
        "positions; intervals: 95% bootstrap over prompts.\n",
        "## Acceptance: the base and each criterion (its gain over the base)\n", accept,
        "\n## Head agreement (the paper's Table 2): positions by the most votes any one token got\n",
        "Independent of the drafter and of T. 'all = clean': every head keeps the clean argmax.\n", table2,
        "\n## JS to the centroid (the paper's Table 3)\n",
        "Means of the JS test's two sides, JS(q, pbar) of the draft and the radius max_k JS(p_k, pbar), at "
        "positions where the heads disperse ('disp.') and where all K choose one token ('conc.').\n", table3, ""])


def continuations(model, prompts, max_new_tokens: int, eos: list[int], cache_dir, ckpt, batch: int = 8) -> list[list[int]]:
    """The target's greedy continuation of each prompt (plain decoding, `batch` prompts at a time:
    each row is what it would be alone), cached on disk per prompt: <cache_dir>/greedy-<key>.json
    maps each prompt's ids to its continuation, one file per (max_new_tokens, eos, checkpoint: its
    path and the size and time of its files)."""
    from minispec.batch.speculative import generate_batch

    key = hashlib.sha256(json.dumps([max_new_tokens, eos, _checkpoint_key(ckpt)]).encode()).hexdigest()[:16]
    path = cache_dir / f"greedy-{key}.json"
    cached = json.loads(path.read_text()) if path.is_file() else {}
    missing = list(dict.fromkeys(json.dumps(p.ids) for p in prompts if json.dumps(p.ids) not in cached))
    for first in range(0, len(missing), batch):
        group = missing[first:first + batch]
        print(f"{PROG}: greedy continuations {first + 1}-{first + len(group)} of {len(missing)}", file=sys.stderr)
        results = generate_batch(model, [json.loads(ids) for ids in group], max_new_tokens=max_new_tokens,
                                 eos_token_ids=eos)
        cached.update({ids: r.tokens for ids, r in zip(group, results)})
    if missing:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cached))
        tmp.replace(path)
    return [cached[json.dumps(p.ids)] for p in prompts]


def _checkpoint_key(ckpt) -> list:
    files = sorted(Path(ckpt).glob("*.safetensors"))
    return [str(Path(ckpt).resolve())] + [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def measure(args, ckpt) -> dict:
    import minispec

    tokenizer = minispec.load_tokenizer(ckpt)
    model = benchlib.load_minispec(ckpt, torch.float32, "fast").model
    eos = list(tokenizer.eos_token_ids)
    for n in args.exit_layers:
        if n > model.config.num_layers:
            raise MinispecError(f"--exit-layers {n}: the model has {model.config.num_layers} blocks; expected "
                                f"depths from 1 to {model.config.num_layers}")
    for folder in map(resolve_draft, args.draft_models):
        check_draft_vocabulary(folder, model)
    prompts = [p for name, n in args.sets for p in benchlib.load_prompts([name], n, tokenizer)]
    texts = continuations(model, prompts, args.max_new_tokens, eos, benchlib.ROOT / "out" / "dropmatch", ckpt)
    hidden, row_prompt, drafts = pooled_rows(args, ckpt, model, prompts, texts)
    hidden, row_prompt = hidden[::args.stride], row_prompt[::args.stride]
    drafts = {name: DraftRows(d.tokens[::args.stride], None if d.hidden is None else d.hidden[::args.stride], d.head)
              for name, d in drafts.items()}
    rows = []
    partial = benchlib.out_dir(PROG, args.out) / "rows.partial.jsonl"  # what a crash leaves
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_text("")
    for p in args.ps:
        print(f"{PROG}: p={p} ...", file=sys.stderr)
        judged = sweep(hidden, model.head, drafts, p, args.paths, args.temperatures, args.majority)
        for (paths, name, temperature), verdicts in judged.items():
            rows.append({"drafter": name, "temperature": temperature, "p": p, "paths": paths,
                         **summarise(verdicts, row_prompt, paths, args.criteria)})
            with partial.open("a") as f:
                f.write(json.dumps(benchlib.finite(rows[-1])) + "\n")
    rows.sort(key=lambda r: (list(drafts).index(r["drafter"]), r["temperature"], r["p"], r["paths"]))
    by_set: dict[str, int] = {}
    for prompt in prompts:
        by_set[prompt.set] = by_set.get(prompt.set, 0) + 1
    return {"settings": {"sets": [f"{name}:{n}" for name, n in args.sets], "prompts_by_set": by_set,
                         "num_prompts": int(row_prompt.max()) + 1, "stride": args.stride,
                         "positions": int(hidden.shape[0]), "max_new_tokens": args.max_new_tokens,
                         "ps": list(args.ps), "paths": list(args.paths), "criteria": list(args.criteria),
                         "temperatures": list(args.temperatures), "majority": args.majority,
                         "drafters": list(drafts)},
            "rows": rows}


def pooled_rows(args, ckpt, model, prompts, texts) -> tuple[torch.Tensor, torch.Tensor, dict[str, DraftRows]]:
    """Every prompt's rows pooled: the target's LM-head inputs [N, d], each row's prompt [N], and
    each drafter's proposals. Cached on disk (out/dropmatch/rows-<key>.pt) by the texts, the
    drafters and the checkpoint: a sweep over other settings starts from the cache."""
    import minispec
    from minispec.chain.drafters import make_drafter

    draft_dirs = {f"model:{Path(d).name}": d for d in map(resolve_draft, args.draft_models)}
    key = hashlib.sha256(json.dumps([[p.ids for p in prompts], texts, list(args.exit_layers), list(args.self_drafts),
                                     args.ngram, _checkpoint_key(ckpt)]
                                    + [_checkpoint_key(d) for d in draft_dirs.values()]).encode()).hexdigest()[:16]
    path = benchlib.ROOT / "out" / "dropmatch" / f"rows-{key}.pt"
    heads = {"target": model.head}
    if path.is_file():
        saved = torch.load(path)
    else:
        recordings = [record(model, p.ids, t, exit_layers=args.exit_layers) for p, t in zip(prompts, texts) if t]
        saved = {"hidden": torch.cat([r.hidden for r in recordings]),  # [N, d]
                 "row_prompt": torch.cat([torch.full((len(r.next_tokens),), i) for i, r in enumerate(recordings)]),
                 "drafts": {}}
        if args.ngram:
            saved["drafts"]["ngram:3"] = (torch.cat([ngram_drafts(r) for r in recordings]), None, None)
        for n in args.exit_layers:
            exit_hidden = torch.cat([r.exit_hidden[n] for r in recordings])
            saved["drafts"][f"early-exit:{n}"] = (_greedy_rows(model.head, exit_hidden), exit_hidden, "target")
        for precision in args.self_drafts:
            draft_model = make_drafter(f"self:{precision}", minispec.load_model(ckpt, dtype=torch.float32)).model
            heads[f"self:{precision}"] = draft_model.head
            with torch.inference_mode():
                own = torch.cat([draft_model.forward_hidden(torch.tensor([r.ids]))[0, r.start:-1] for r in recordings])
            saved["drafts"][f"self:{precision}"] = (_greedy_rows(draft_model.head, own), own, f"self:{precision}")
        for name, folder in draft_dirs.items():
            draft_model = load_draft_model(folder, model)
            heads[name] = draft_model.head
            with torch.inference_mode():
                own = torch.cat([draft_model.forward_hidden(torch.tensor([r.ids]))[0, r.start:-1] for r in recordings])
            saved["drafts"][name] = (_greedy_rows(draft_model.head, own), own, name)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(saved, tmp)
        tmp.replace(path)
    for name in saved["drafts"]:
        if name.startswith("self:") and name not in heads:  # a cached self-draft: its head only
            heads[name] = make_drafter(name, minispec.load_model(ckpt, dtype=torch.float32)).model.head
        if name.startswith("model:") and name not in heads:  # a cached separate draft: its head only
            heads[name] = load_draft_model(draft_dirs[name], model).head
    drafts = {name: DraftRows(tokens, hidden, None if head is None else heads[head])
              for name, (tokens, hidden, head) in saved["drafts"].items()}
    return saved["hidden"], saved["row_prompt"], drafts


def resolve_draft(spec: str):
    """A --draft-models entry: a checkpoint folder or a known name (fetched on first use)."""
    from minispec.checkpoints.hub import resolve_checkpoint

    return resolve_checkpoint(spec, what="--draft-models")


def check_draft_vocabulary(folder, target) -> None:
    """A separate draft must have the target's vocabulary (read from its config, before any work)."""
    from minispec.model.config import ModelConfig

    vocab = ModelConfig.from_hf(json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))).vocab_size
    if vocab != target.config.vocab_size:
        raise MinispecError(f"--draft-models {folder}: a vocabulary of {vocab} tokens; expected the target's "
                            f"{target.config.vocab_size} (a separate draft must share the target's tokenizer)")


def load_draft_model(folder, target):
    """A separate draft model in float32 with fast kernels."""
    check_draft_vocabulary(folder, target)
    return benchlib.load_minispec(folder, torch.float32, "fast").model


@torch.inference_mode()
def _greedy_rows(head, hidden: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """argmax head(hidden) row by row chunk: [N]."""
    return torch.cat([greedy_token(_upcast(head(part))) for part in hidden.split(chunk)])


def set_counts(text: str) -> tuple[tuple[str, int], ...]:
    """'a:10,b:50' -> (('a', 10), ('b', 50)): prompt sets with their counts."""
    pairs = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, count = item.partition(":")
        if name not in benchlib.PROMPT_SETS or not count.isdigit() or int(count) < 1:
            raise benchlib.argparse.ArgumentTypeError(
                f"--sets = {text!r}: {item!r}; expected 'name:N' with N >= 1 and a name from {','.join(benchlib.PROMPT_SETS)}")
        pairs.append((name, int(count)))
    if not pairs:
        raise benchlib.argparse.ArgumentTypeError(f"--sets = {text!r}; expected 'name:N,...'")
    return tuple(pairs)


def or_none(parse):
    """An argparse type: `parse`, or 'none' for no items at all."""
    return lambda text: () if text.strip() == "none" else parse(text)


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__)
    p.add_argument("--sets", type=set_counts, default="translation:10,summarization:10,qa:10,math_reasoning:10,rag:10,"
                   "gsm8k:50", help="comma-separated prompt sets, each 'name:N' (its first N prompts)")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=2), default=128,
                   help="most tokens of each greedy continuation (stops at eos)")
    p.add_argument("--ps", type=benchlib.number_list(float, "--ps", 0, 1, hi_open=True), default="0.005,0.01,0.02,0.05,0.1,0.2,0.3,0.5",
                   help="comma-separated dropout probabilities")
    p.add_argument("--paths", type=benchlib.number_list(int, "--paths", 1), default="3,5,10",
                   help="comma-separated K (the first K of max(K) paths)")
    p.add_argument("--criteria", type=benchlib.name_list("--criteria", CRITERIA), default=",".join(CRITERIA),
                   help="comma-separated DropMatch criteria, all judged on the same dropout paths")
    p.add_argument("--temperatures", type=benchlib.number_list(float, "--temperatures", 0), default="0,1",
                   help="0 and/or 1 (the JS test reads temperature 1 at both)")
    p.add_argument("--majority", choices=["strict", "plurality"], default="strict")
    p.add_argument("--exit-layers", type=or_none(benchlib.number_list(int, "--exit-layers", 1)), default="26,28,29",
                   help="comma-separated early-exit depths (blocks run before the final norm and head), or none")
    p.add_argument("--self-drafts", type=or_none(benchlib.name_list("--self-drafts", ("int8", "bf16"))), default="int8",
                   help="self-draft precisions, or none")
    p.add_argument("--draft-models", type=lambda text: tuple(t.strip() for t in text.split(",") if t.strip()),
                   default="", help="comma-separated separate draft models (folders or known names), sharing the "
                   "target's tokenizer")
    p.add_argument("--no-ngram", dest="ngram", action="store_false", help="leave out the n-gram drafter")
    p.add_argument("--stride", type=ranged(int, "--stride", lo=1), default=1,
                   help="judge every stride-th pooled position (the sweep's cost falls in proportion)")
    return p


def main(argv: list[str] | None = None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), measure, render)


if __name__ == "__main__":
    sys.exit(main())

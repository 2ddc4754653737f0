"""DropMatch replayed along fixed text: what it would decide at every position, from one forward.

    python scripts/dropmatch_replay.py [--sets rag,summarization,gsm8k] [--prompts 4] [--ps 0.01,0.05,0.3]

A sweep over DropMatch's settings through the real loop costs a generation per setting and
prompt. Most of what a sweep asks needs far less. Fix the text: the prompt and the target's own
greedy continuation. Then ONE target forward over it gives, at every position t,

    hidden[t]         the LM-head input (after the final norm): what DropMatch drops out
    target_logits[t]  the clean head, head(hidden[t]): the base policy's view
    exit_logits[N][t] an early-exit draft's logits: block N's output through the final norm and
                      the head (captured by a hook in the same forward)

and every DropMatch setting (p, K, criterion, majority, temperature) replays on these rows: the
draft token at t is the drafter's proposal given the same context (an early exit's argmax, or
an n-gram lookup), and the verdict at t is computed by the policy's own code
(DropMatch.path_logits, base_acceptances, verdicts) on the rows of many positions at once.
Reported per (drafter, p, K):

    accept           share of drafted positions the policy accepts (its base OR DropMatch)
    base             share the base (exact at T = 0) accepts
    gain             accept - base, the positions DropMatch adds
    largest vote     the paper's Table 2: share of positions by the largest number of the K heads
                     that agree on one token (K of K = all heads agree)
    all = clean      share of positions where every head's argmax is the clean argmax

What it does not give: tau and quality. A position DropMatch accepts against the target's argmax
moves a real run off this text, so tau, agreement and NLL come from real runs of the loop
(scripts/bench_policies.py); the replay is for finding where to look.
"""

from __future__ import annotations

import sys
import copy
from dataclasses import dataclass

import benchlib
from benchlib import fmt, md_table

import torch  # noqa: E402

from minispec.acceptance.base import VerifyInput  # noqa: E402
from minispec.acceptance.dropmatch import CRITERIA, DropMatch, js_divergence  # noqa: E402
from minispec.cli import ranged  # noqa: E402
from minispec.sampling import SamplingParams, greedy_token, logits_to_probs  # noqa: E402

PROG = "dropmatch_replay"


@dataclass
class Recording:
    """The fixed text's rows. Row j is position start + j, which predicts token start + j + 1."""

    ids: list[int]  # prompt + continuation
    start: int  # len(prompt) - 1: the first position whose prediction is part of the continuation
    hidden: torch.Tensor  # [n, d] the LM-head input at positions start .. len(ids) - 2
    target_logits: torch.Tensor  # [n, V] head(hidden)
    exit_logits: dict[int, torch.Tensor]  # N -> [n, V] early exit after block N

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
    exit_logits = {n: _upcast(model.head(model.norm(x[0, start:-1]))) for n, x in captured.items()}  # N -> [n, V]
    return Recording(ids, start, hidden, _upcast(model.head(hidden)), exit_logits)


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    """bf16 logits to float32; float32 and float64 as they are."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def ngram_drafts(rec: Recording, max_ngram: int = 3) -> torch.Tensor:
    """The n-gram drafter's proposal at every row (its first draft token given the text so far),
    or -1 where it finds no match: [n]."""
    from minispec.drafters import NgramDrafter

    lookup = NgramDrafter(max_ngram).lookup
    return torch.tensor([(lookup(rec.ids[:rec.start + 1 + j], 1) or [-1])[0] for j in range(len(rec.next_tokens))])


@torch.inference_mode()
def replay(policy: DropMatch, rec: Recording, head, draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None,
           params: SamplingParams = SamplingParams(), chunk: int = 32,
           criteria: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """DropMatch's per-position verdicts on the rows where draft_tokens >= 0: each a [m] tensor.

    draft_tokens [n] (-1: nothing drafted at that row), draft_logits [n, V] or None (one-hot
    drafts). Rows go through the policy in chunks, each chunk one VerifyInput whose "drafts" are
    the chunk's rows: the verdicts per position do not depend on each other (only the prefix
    rule, which a replay does not apply, does). Masks come from the policy's own generator, one
    draw per chunk. `criteria` (default: the policy's) are all judged on the same paths:
    "accepted:<criterion>" is the policy's verdict with that criterion (OR its base if or_base).
    Also: "base", "all_clean" (every head keeps the clean argmax), "largest_vote" (votes of the
    most chosen head token), "js_draft" = JS(q || pbar) and "radius" = max_k JS(p_k || pbar).
    """
    criteria = criteria or (policy.criterion,)
    judges = {c: copy.copy(policy) for c in criteria}
    for criterion, judge in judges.items():
        judge.criterion = criterion
    rows = (draft_tokens >= 0).nonzero()[:, 0]  # [m]
    keys = ["base", "all_clean", "largest_vote", "js_draft", "radius"] + [f"accepted:{c}" for c in criteria]
    out: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    for part in rows.split(chunk):
        hidden = rec.hidden[part]  # [c, d]
        target_logits = torch.cat([rec.target_logits[part], rec.target_logits[part[-1:]]])  # [c+1, V]: a bonus row
        tokens = draft_tokens[part]  # [c]
        logits = None if draft_logits is None else draft_logits[part].to(target_logits.dtype)  # [c, V]
        q_draft = (torch.nn.functional.one_hot(tokens, target_logits.shape[1]).to(target_logits.dtype)
                   if logits is None else logits_to_probs(logits, params))  # [c, V]
        inp = VerifyInput(tokens, q_draft, target_logits, logits_to_probs(target_logits, params), params,
                          torch.Generator().manual_seed(0), logits, hidden=torch.cat([hidden, hidden[-1:]]), head=head)
        clean = greedy_token(target_logits)  # [c+1]
        path_logits = policy.path_logits(inp.hidden, head, target_logits)[:, :-1]  # [K, c, V]
        head_tokens = greedy_token(path_logits)  # [K, c]
        base = policy.base_acceptances(inp, clean)  # [c]
        out["base"].append(base)
        for criterion, judge in judges.items():
            own = judge.verdicts(inp, path_logits, head_tokens)  # [c]
            out[f"accepted:{criterion}"].append(own | base if policy.or_base else own)
        out["all_clean"].append((head_tokens == clean[:-1]).all(dim=0))
        same = head_tokens.unsqueeze(1) == head_tokens.unsqueeze(0)  # [K, K, c]
        out["largest_vote"].append(same.sum(dim=1).amax(dim=0))  # [c]: votes of the most chosen token
        js_draft, radius = js_terms(policy, inp, path_logits)
        out["js_draft"].append(js_draft)
        out["radius"].append(radius)
    return {k: torch.cat(v) if v else torch.zeros(0) for k, v in out.items()}


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


def summarise(verdicts: list[dict[str, torch.Tensor]], paths: int) -> dict:
    """Pooled over prompts (every drafted position counts once): shares, the paper's Table 2
    (positions by largest vote) and Table 3 (mean JS of the draft and radius to the centroid, in
    positions where the heads disperse vs where all K agree)."""
    pooled = {k: torch.cat([v[k] for v in verdicts]) for k in verdicts[0]}
    m = len(pooled["base"])
    share = lambda x: float(x.double().mean()) if len(x) else None  # noqa: E731
    row = {"positions": m, "base": share(pooled["base"]), "all_clean": share(pooled["all_clean"]),
           "accept": {k.split(":", 1)[1]: share(v) for k, v in pooled.items() if k.startswith("accepted:")},
           "largest_vote": [share(pooled["largest_vote"] == k) for k in range(1, paths + 1)]}  # Table 2
    concentrated = pooled["largest_vote"] == paths  # [m]: all K heads chose one token
    row["dispersed"] = share(~concentrated)
    for side in ("js_draft", "radius"):  # Table 3
        row[f"{side}_dispersed"] = share(pooled[side][~concentrated])
        row[f"{side}_concentrated"] = share(pooled[side][concentrated])
    return row


def render(result: dict) -> str:
    s = result["settings"]
    rows, criteria, k_max = result["rows"], s["criteria"], max(s["paths"])
    label = lambda r: [r["drafter"], f"{r['p']:g}", str(r["paths"])]  # noqa: E731
    accept = md_table(["drafter", "p", "K", "positions", "base"] + [f"{c} (gain)" for c in criteria],
                      [label(r) + [str(r["positions"]), fmt(r["base"], ".1%")]
                       + [f"{fmt(r['accept'][c], '.1%')} ({fmt(r['accept'][c] - r['base'], '+.1%')})" for c in criteria]
                       for r in rows])
    table2 = md_table(["drafter", "p", "K", "all = clean"] + [f"votes {k}" for k in range(1, k_max + 1)],
                      [label(r) + [fmt(r["all_clean"], ".1%")] + [fmt(v, ".0%") for v in r["largest_vote"]]
                       + ["" for _ in range(k_max - r["paths"])] for r in rows])
    table3 = md_table(["drafter", "p", "K", "dispersed", "JS draft, disp.", "radius, disp.", "JS draft, conc.",
                       "radius, conc."],
                      [label(r) + [fmt(r["dispersed"], ".0%")] + [fmt(r[k], ".4f") for k in (
                          "js_draft_dispersed", "radius_dispersed", "js_draft_concentrated", "radius_concentrated")]
                       for r in rows])
    return "\n".join([
        "# minispec: DropMatch replayed along the target's greedy text\n", benchlib.record_markdown(result["run"]),
        f"{s['prompts']} prompt(s) per set of {', '.join(s['sets'])}; greedy continuations of up to "
        f"{s['max_new_tokens']} tokens (fp32, fast kernels); majority {s['majority']}, T = 0, base exact (OR-ed). "
        "Shares over drafted positions.\n",
        "## Acceptance: the base and each criterion (its gain over the base)\n", accept,
        "\n## Head agreement (the paper's Table 2): positions by the most votes any one token got\n", table2,
        "\n## JS to the centroid (the paper's Table 3)\n",
        "Means of the JS test's two sides, JS(q, pbar) of the draft and the radius max_k JS(p_k, pbar), at "
        "positions where the heads disperse ('disp.') and where all K choose one token ('conc.').\n", table3, ""])


def measure(args, ckpt) -> dict:
    import minispec
    from minispec.speculative import generate

    tokenizer = minispec.load_tokenizer(ckpt)
    model = benchlib.load_minispec(ckpt, torch.float32, "fast").model
    recordings = []
    for prompt in benchlib.load_prompts(args.sets, args.prompts, tokenizer):
        out = generate(model, prompt.ids, max_new_tokens=args.max_new_tokens, eos_token_ids=tokenizer.eos_token_ids)
        recordings.append(record(model, prompt.ids, out.tokens, exit_layers=args.exit_layers))
    drafters = {"ngram:3": [(ngram_drafts(r), None) for r in recordings]}
    for n in args.exit_layers:
        drafters[f"early-exit:{n}"] = [(greedy_token(r.exit_logits[n]), r.exit_logits[n]) for r in recordings]
    rows = []
    for name, drafts in drafters.items():
        for p in args.ps:
            for paths in args.paths:
                print(f"{PROG}: {name}, p={p}, K={paths} ...", file=sys.stderr)
                policy = DropMatch(p=p, paths=paths, majority=args.majority)
                verdicts = [replay(policy, r, model.head, tokens, logits, criteria=args.criteria)
                            for r, (tokens, logits) in zip(recordings, drafts)]
                rows.append({"drafter": name, "p": p, "paths": paths, **summarise(verdicts, paths)})
    return {"settings": {"sets": list(args.sets), "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
                         "ps": list(args.ps), "paths": list(args.paths), "criteria": list(args.criteria),
                         "majority": args.majority, "exit_layers": list(args.exit_layers)},
            "rows": rows}


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__)
    p.add_argument("--sets", type=benchlib.name_list("--sets", benchlib.PROMPT_SETS), default="rag,summarization,gsm8k",
                   help="comma-separated prompt sets")
    p.add_argument("--prompts", type=ranged(int, "--prompts", lo=1), default=4, help="prompts per set")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=2), default=128,
                   help="most tokens of each greedy continuation (stops at eos)")
    p.add_argument("--ps", type=benchlib.number_list(float, "--ps", 0), default="0.005,0.01,0.02,0.05,0.1,0.3",
                   help="comma-separated dropout probabilities")
    p.add_argument("--paths", type=benchlib.number_list(int, "--paths", 1), default="5", help="comma-separated K")
    p.add_argument("--criteria", type=benchlib.name_list("--criteria", CRITERIA), default=",".join(CRITERIA),
                   help="comma-separated DropMatch criteria, all judged on the same dropout paths")
    p.add_argument("--majority", choices=["strict", "plurality"], default="strict")
    p.add_argument("--exit-layers", type=benchlib.number_list(int, "--exit-layers", 1), default="24,27",
                   help="comma-separated early-exit depths (blocks run before the final norm and head)")
    return p


def main(argv: list[str] | None = None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), measure, render)


if __name__ == "__main__":
    sys.exit(main())

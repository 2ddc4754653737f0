"""How well the closed-form estimate predicts DropMatch's measured head agreement, across p.

    python scripts/dropmatch/dropmatch_calibration.py [--prompts 20] [--widths 64,128,256,512,1024]

On the real model: the LM-head inputs along the target's own greedy continuations (the
positions DropMatch judges; the same cached continuations as scripts/dropmatch/dropmatch_replay.py), and
on random tiny models of several widths d (random tokens through a random 2-layer model). For
each, at every p of --ps and K of --paths:

    estimates  minispec.lab.dropout_calibration.EstimatedAgreement: first order and Gaussian
    measured   MeasuredAgreement: K Monte Carlo masks per position (common random numbers)

and the p each picks for the agreement levels of --levels (bisection), with the measured
agreement at each estimate's p. Outputs: out/dropmatch_calibration/ (.json, .md, and the
figure of scripts/dropmatch/dropmatch_plot.py as .png, with matplotlib).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import fmt, md_table
from dropmatch_replay import continuations, or_none, set_counts

import torch  # noqa: E402

from minispec.lab.dropout_calibration import EstimatedAgreement, MeasuredAgreement, calibrate_p  # noqa: E402
from minispec.cli import ranged  # noqa: E402

PROG = "dropmatch_calibration"


def curves(hidden: torch.Tensor, weight: torch.Tensor, head, ps, paths, levels, seed: int = 0) -> dict:
    """Both estimates and the measurement at every (K, p), and the p each picks per level."""
    out = {}
    for k in paths:
        measured = MeasuredAgreement(hidden, head, k, seed=seed)
        estimates = {m.replace("-", "_"): EstimatedAgreement(hidden, weight, k, method=m)
                     for m in EstimatedAgreement.METHODS}
        picks = []
        for level in levels:
            pick = {"level": level, "p_measured": calibrate_p(measured, level, steps=12)}
            for name, estimate in estimates.items():
                pick[f"p_{name}"] = calibrate_p(estimate, level)
                pick[f"measured_at_p_{name}"] = measured(pick[f"p_{name}"])
            picks.append(pick)
        out[str(k)] = {"measured": [measured(p) for p in ps], "picks": picks,
                       **{name: [e(p) for p in ps] for name, e in estimates.items()}}
    return out


def random_rows(width: int, vocab: int, positions: int, seed: int) -> tuple[torch.Tensor, torch.nn.Module]:
    """LM-head inputs of a random 2-layer model of hidden size `width` over random tokens."""
    from minispec.model.config import ModelConfig
    from minispec.testing import random_model

    heads = max(1, width // 64)
    cfg = ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=width, intermediate_size=2 * width,
                      num_layers=2, num_heads=heads, num_kv_heads=heads, head_dim=width // heads, rms_norm_eps=1e-5,
                      rope_theta=10000.0, rope_scaling=None, max_position_embeddings=positions + 1,
                      tie_word_embeddings=False, qk_norm=False)
    model = random_model(cfg, seed, dtype=torch.float32, scale=3.0)
    ids = torch.randint(vocab, (1, positions), generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        return model.forward_hidden(ids)[0], model


def measure(args, ckpt) -> dict:
    import minispec

    tokenizer = minispec.load_tokenizer(ckpt)
    model = minispec.load_model(ckpt, dtype=torch.float32)
    fast = benchlib.load_minispec(ckpt, torch.float32, "fast").model
    prompts = [p for name, n in args.sets for p in benchlib.load_prompts([name], n, tokenizer)]
    texts = continuations(fast, prompts, args.max_new_tokens, list(tokenizer.eos_token_ids),
                          benchlib.ROOT / "out" / "dropmatch", ckpt)
    with torch.inference_mode():
        hidden = torch.cat([model.forward_hidden(torch.tensor([p.ids + t]))[0, len(p.ids) - 1:-1]
                            for p, t in zip(prompts, texts) if t])  # [N, d]
    hidden = hidden[torch.linspace(0, hidden.shape[0] - 1, min(args.positions, hidden.shape[0])).long()]  # spread out
    weight = model.lm_head.weight.detach()
    print(f"{PROG}: the real model, {hidden.shape[0]} positions ...", file=sys.stderr)
    results = {"real": {"width": hidden.shape[1], "positions": hidden.shape[0],
                        **curves(hidden, weight, model.head, args.ps, args.paths, args.levels)}}
    for width in args.widths:
        print(f"{PROG}: random model, d = {width} ...", file=sys.stderr)
        rows, tiny = random_rows(width, args.vocab, args.random_positions, seed=width)
        results[f"random d={width}"] = {"width": width, "positions": rows.shape[0],
                                        **curves(rows, tiny.lm_head.weight.detach(), tiny.head, args.ps, args.paths,
                                                 args.levels)}
    return {"settings": {"sets": [f"{n}:{k}" for n, k in args.sets], "max_new_tokens": args.max_new_tokens,
                         "positions": args.positions,
                         "ps": list(args.ps), "paths": list(args.paths), "levels": list(args.levels),
                         "widths": list(args.widths), "vocab": args.vocab, "random_positions": args.random_positions},
            "models": results}


def render(result: dict) -> str:
    s, models = result["settings"], result["models"]
    curve_rows, pick_rows = [], []
    for name, m in models.items():
        for k in map(str, s["paths"]):
            c = m[k]
            curve_rows.append([name, k] + [f"{fmt(v, '.2f')} / {fmt(f, '.2f')} / {fmt(g, '.2f')}"
                                           for v, f, g in zip(c["measured"], c["first_order"], c["gaussian"])])
            pick_rows += [[name, k, f"{pk['level']:g}", fmt(pk["p_measured"], ".4f"), fmt(pk["p_first_order"], ".4f"),
                           fmt(pk["measured_at_p_first_order"], ".2f"), fmt(pk["p_gaussian"], ".4f"),
                           fmt(pk["measured_at_p_gaussian"], ".2f")] for pk in c["picks"]]
    return "\n".join([
        "# minispec: DropMatch's head agreement, estimated and measured\n", benchlib.record_markdown(result["run"]),
        f"Real model: {models['real']['positions']} positions (evenly spread) of its greedy continuations ({', '.join(s['sets'])}, "
        f"up to {s['max_new_tokens']} tokens). Random models: {s['random_positions']} random tokens through a random "
        f"2-layer model of width d, vocabulary {s['vocab']}. Agreement = share of positions where all K heads keep the "
        "clean argmax.\n",
        "## Agreement: measured / first-order estimate / Gaussian estimate\n",
        md_table(["model", "K"] + [f"p={p:g}" for p in s["ps"]], curve_rows),
        "\n## The p each picks for a target agreement, and the measured agreement there\n",
        md_table(["model", "K", "level", "p measured", "p first order", "measured there", "p Gaussian",
                  "measured there"], pick_rows), ""])


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__)
    p.add_argument("--sets", type=set_counts, default="translation:10,summarization:10,qa:10,math_reasoning:10,rag:10,"
                   "gsm8k:50", help="the calibration prompts, each 'name:N' (cached continuations are reused)")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=2), default=128)
    p.add_argument("--positions", type=ranged(int, "--positions", lo=1), default=640,
                   help="real-model positions used, evenly spread over all the continuations' positions")
    p.add_argument("--ps", type=benchlib.number_list(float, "--ps", 0, 1, hi_open=True), default="0.001,0.002,0.005,0.01,0.02,0.05,0.1,0.2,0.3,0.5")
    p.add_argument("--paths", type=benchlib.number_list(int, "--paths", 1), default="1,5")
    p.add_argument("--levels", type=benchlib.number_list(float, "--levels", 0.01, 1), default="0.5,0.8,0.9,0.95")
    p.add_argument("--widths", type=or_none(benchlib.number_list(int, "--widths", 8)), default="64,128,256,512,1024",
                   help="random models' widths, or none")
    p.add_argument("--vocab", type=ranged(int, "--vocab", lo=2), default=4096)
    p.add_argument("--random-positions", type=ranged(int, "--random-positions", lo=1), default=512)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    status = benchlib.run_benchmark(PROG, argv, parser, measure, render)
    if status == 0:
        out = benchlib.out_dir(PROG, parser.parse_args(sys.argv[1:] if argv is None else argv).out)
        try:
            import dropmatch_plot

            print(dropmatch_plot.plot_agreement(dropmatch_plot.load([out / f"{PROG}.json"]), out / f"{PROG}.png"))
        except ModuleNotFoundError:
            print(f"{PROG}: matplotlib is not installed; no plot written", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())

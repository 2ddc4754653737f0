"""torch's 4-bit CPU kernel against the formats minispec runs: would 4-bit weights pay on this CPU?

    python scripts/speed/bench_4bit.py [--ckpt qwen2.5-coder-1.5b-instruct] [--rows 8] [--copies 24]

llama.cpp reads about 4.5 bits a weight (Q4_K); minispec's smallest target format, int8-dynamic,
reads 8. The only 4-bit matmul torch ships for x86 CPUs is `aten._weight_int4pack_mm_for_cpu`
(weights in groups of 32, w = (q - 8) s + z, s and z in the activations' dtype). This times one
product of the checkpoint's MLP shape, [intermediate, hidden], for k = 1..--rows rows, cycling
through --copies copies of the weight so that nothing stays in the caches (a model's step reads
every matrix once), for:

    int4 bf16     int4pack with bfloat16 activations and scales (the fast path; its scales cannot
                  hold a GGUF Q4_K scale exactly: d x sc needs up to 17 significant bits)
    int4 float32  int4pack with float32 activations and scales (exact for Q4_K scales)
    int8-dynamic  fbgemm, minispec.kernels.fbgemm.DynamicInt8Linear
    fp16          fbgemm, minispec.kernels.fbgemm.Fp16Linear

and reports ms per product, GB/s of weight bytes (4-bit: half a byte a weight, scales aside) and
each kind's cost against int8-dynamic's at the same k. A kind this CPU or build lacks is skipped
in one line. Writes bench_4bit.json and .md to --out (default out/bench_4bit/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import MinispecError, md_table

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402
from minispec.kernels import fbgemm, measure  # noqa: E402

PROG = "bench_4bit"
GROUP = 32  # weights per scale, as in a GGUF block
BYTES = {"int4 bf16": 0.5, "int4 float32": 0.5, "int8-dynamic": 1.0, "fp16": 2.0}


def int4_layer(weight: torch.Tensor, dtype: torch.dtype):
    """A function x -> x @ W^T through int4pack, W [out, in] quantized per group of 32 (min/max)."""
    out_features, in_features = weight.shape
    w = weight.reshape(out_features, in_features // GROUP, GROUP)  # [out, groups, 32]
    low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp(min=1e-8)
    q = ((w - low) / scale).round().clamp(0, 15).to(torch.int32).reshape(out_features, in_features)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    zero = low + 8 * scale  # w = (q - 8) s + z
    scales_and_zeros = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], -1).transpose(0, 1).contiguous().to(dtype)
    return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(dtype), packed, GROUP, scales_and_zeros)


def layers(kind: str, weight: torch.Tensor):
    if kind.startswith("int4"):
        return int4_layer(weight, torch.bfloat16 if kind == "int4 bf16" else torch.float32)
    return (fbgemm.DynamicInt8Linear if kind == "int8-dynamic" else fbgemm.Fp16Linear)(weight, None)


def runs_here(kind: str) -> bool:
    """Whether this build and CPU run `kind`; if not, one line on stderr."""
    try:
        layers(kind, torch.randn(64, 64))(torch.randn(1, 64))
        return True
    except (RuntimeError, AttributeError, NotImplementedError) as error:
        print(f"{PROG}: skipping {kind} on this CPU: {str(error).splitlines()[0][:120]}", file=sys.stderr)
        return False


def measure_kinds(args, ckpt: Path) -> dict:
    import minispec

    config = minispec.ModelConfig.from_hf(ckpt)
    shape = (config.intermediate_size, config.hidden_size)  # [out, in]: the MLP's gate / up matrix
    if shape[1] % GROUP:
        raise MinispecError(f"--ckpt {ckpt}: hidden size {shape[1]} is not a multiple of {GROUP}")
    generator = torch.Generator().manual_seed(0)
    kinds = [kind for kind in BYTES if runs_here(kind)]
    seconds = {}
    with torch.inference_mode():
        for kind in kinds:
            copies = [layers(kind, torch.randn(*shape, generator=generator) / shape[1] ** 0.5)
                      for _ in range(args.copies)]
            for k in range(1, args.rows + 1):
                x = torch.randn(k, shape[1], generator=generator)
                run = lambda x=x, copies=copies: [layer(x) for layer in copies]  # noqa: E731
                seconds[f"{kind}|{k}"] = measure.timed(run, args.reps) / args.copies
            print(f"{PROG}: {kind} done", file=sys.stderr, flush=True)
    return {"shape": list(shape), "kinds": kinds, "rows": args.rows, "copies": args.copies,
            "cpu": benchlib.cpu_flags_summary(), "seconds": seconds}


def render(result: dict) -> str:
    out_features, in_features = result["shape"]
    ks = range(1, result["rows"] + 1)
    sec = result["seconds"]
    base = "int8-dynamic" if "int8-dynamic" in result["kinds"] else None
    rows = []
    for kind in result["kinds"]:
        gbps = [out_features * in_features * BYTES[kind] / sec[f"{kind}|{k}"] / 1e9 for k in ks]
        rows.append([kind] + [f"{1000 * sec[f'{kind}|{k}']:.3f}" for k in ks] + [f"{gbps[0]:.1f}"]
                    + ([f"{sec[f'{kind}|{k}'] / sec[f'{base}|{k}']:.2f}" for k in (1, max(ks))] if base else []))
    head = ["kind"] + [f"k={k} ms" for k in ks] + ["GB/s at k=1"] + \
        (["k=1 / int8-dynamic", f"k={max(ks)} / int8-dynamic"] if base else [])
    return "\n".join([f"# minispec: torch's 4-bit CPU kernel on a [{out_features}, {in_features}] weight\n",
                      benchlib.record_markdown(result["run"]), f"CPU flags: {result['cpu']}. {result['copies']} copies "
                      "cycled per timing; ms per product.\n", md_table(head, rows) + "\n"])


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__)
    p.set_defaults(ckpt=Path("qwen2.5-coder-1.5b-instruct"))
    p.add_argument("--rows", type=ranged(int, "--rows", lo=1, hi=64), default=8, help="rows k = 1..ROWS")
    p.add_argument("--copies", type=ranged(int, "--copies", lo=1, hi=256), default=24,
                   help="copies of the weight cycled per timing (more than the caches hold)")
    p.add_argument("--reps", type=ranged(int, "--reps", lo=1, hi=1000), default=5, help="timed repetitions")
    return p


def main(argv: list[str] | None = None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), measure_kinds, render)


if __name__ == "__main__":
    sys.exit(main())

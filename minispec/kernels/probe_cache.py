"""The kernel probe's answers kept on disk: a choice made by measurement is made once per machine.

--draft-kernels auto times each candidate kind on this CPU (measure.fastest_kind) and takes the
fastest; --draft-length auto prices each draft length (step_cost.costs). Timings are noisy, and
two kinds that are close could swap places from one run to the next. Their roundings differ
(bfloat16 against float16 weights), so the draft's probabilities q_draft would differ too, and at
T > 0 the same seed would give other text. Keeping the first
answer makes the choice, and so the output, repeatable on one machine:

    key    = the machine (CPU model and flags, logical CPUs, torch threads, torch version, the ISA caps
             ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA / FBGEMM_ENABLE_INSTRUCTIONS) and the
             question (candidate kinds, layer shape, dtype)
    value  = the kind measured fastest, or the step costs (a string of comma-separated numbers)

The answers live in probe.json in MINISPEC_HOME if set, else in minispec's user cache folder
(checkpoints.disk.user_cache_dir). Delete the file to measure again. A file that cannot be read
or holds an answer outside the candidates counts as no answer; a folder that cannot be written
leaves the choice uncached (it still works, measured each run).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path

import torch

from minispec.checkpoints.disk import minispec_home, user_cache_dir
from minispec.cli import read_file
from minispec.errors import MinispecError

CACHE_BYTES = 1 << 20  # the probe cache's cap: a few hundred answers take a few kB

CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS")


def cache_path() -> Path:
    """probe.json in MINISPEC_HOME if that variable is set, else in the user cache folder."""
    home = minispec_home()
    return (home if home is not None else user_cache_dir()) / "probe.json"


def cpu_name() -> str:
    """The CPU's model name and a digest of its feature flags (Linux: /proc/cpuinfo; a virtual
    machine may report only "AMD EPYC", and its flags tell the generations apart), else what
    platform reports."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    name = next((line.partition(":")[2].strip() for line in lines if line.startswith("model name")), None)
    flags = next((line.partition(":")[2].strip() for line in lines if line.startswith("flags")), "")
    if name is None:
        return platform.processor() or platform.machine()
    return f"{name} flags:{hashlib.sha256(flags.encode()).hexdigest()[:12]}"


def machine_key() -> str:
    """What a kernel's speed depends on besides the question: the CPU, the threads, torch, the caps."""
    caps = ",".join(f"{name}={os.environ[name]}" for name in CAPS if os.environ.get(name))
    return f"{cpu_name()}|cpus={os.cpu_count()}|threads={torch.get_num_threads()}|torch={torch.__version__}|{caps}"


def load(question: str, answers: tuple[str, ...] | None = None, path: Path | None = None) -> str | None:
    """The stored answer to `question` on this machine, if there is one and it is among `answers` (any
    string where answers is None: the caller checks it)."""
    try:
        stored = json.loads(read_file(path or cache_path(), "probe cache", CACHE_BYTES))
        answer = stored.get(machine_key(), {}).get(question)
    except (MinispecError, ValueError, AttributeError, RuntimeError):  # no file, not JSON, not a dict, ~user unknown
        return None
    if answers is None:
        return answer if isinstance(answer, str) else None
    return answer if answer in answers else None


def store(question: str, answer: str, path: Path | None = None) -> bool:
    """Keep `answer` to `question` for this machine; False (and nothing changed) if it cannot be written.
    The file is replaced whole (a temp file renamed over it), so a reader never sees half of it."""
    try:
        path = path or cache_path()
        try:
            stored = json.loads(read_file(path, "probe cache", CACHE_BYTES))
            stored = stored if isinstance(stored, dict) else {}
        except (MinispecError, ValueError):
            stored = {}
        mine = stored.get(machine_key())
        stored[machine_key()] = {**(mine if isinstance(mine, dict) else {}), question: answer}
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".probe-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(stored, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except (OSError, RuntimeError):  # a read-only or missing home, a full disk: uncached, still chosen
        return False
    return True

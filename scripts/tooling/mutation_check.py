"""Mutation check: does the property suite catch the bugs people actually hit?

    python scripts/tooling/mutation_check.py [--only NAME ...] [--class CLASS ...] [--skip-baseline] [--timeout SECONDS]

Copies the package and its tests to a temporary folder, checks that the unmutated suite passes
there, then applies one realistic bug at a time (the catalogue, mutants.toml beside this file) and runs the suite with
`pytest -x`. A mutant is killed when some test fails; the table names the first failing test
and the time it took. The last line reads `killed K of N mutants`; the exit status is non-zero
if any mutant survived (or the baseline failed).

The suite runs under the `mutation` hypothesis profile: the ci profile's examples and
derandomization, without shrinking (we only need to know *that* a test fails) and without the
example database (so one mutant's failures are not replayed against the next).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from minispec.cli import Parser, ranged

ROOT = Path(__file__).resolve().parents[2]


CATALOGUE_FILE = Path(__file__).with_name("mutants.toml")
# Each class of bug and the property that covers all of its members (docs/testing.md names the tests).
CLASSES = {
    "model": "logits and cache contents equal an uncached forward pass (and transformers) at every position",
    "conversion": "a converted checkpoint equals the reference conversion, tensor for tensor and token for token",
    "rule": "each acceptance rule's decisions and output law equal its written definition, in float64",
    "slice": "the rule's definition property drawn at temperatures far from 1, with top-k / top-p, near its threshold",
    "loop": "speculative output equals the target alone (greedy: token for token; sampling: in law)",
    "figure": "every reported number equals its documented definition, recomputed from the run's record",
    "isolation": "a batch row's tokens and figures equal the same prompt run alone; inputs are never written into",
    "store": "a kept answer's key varies with every input the answer depends on; kept answers are checked",
    "files": "a conversion or download interrupted or refused at any point leaves nothing half-written",
    "bad-input": "every bad file, flag, option or environment variable gives one line naming the field at fault",
    "boundary": "whatever a plug-in returns or raises (a policy, an engine, a cache factory, a callback) is one verdict or one line",
    "numeric": "what is not a distribution, a count or a matching shape is refused; statistics equal scipy's",
    "oracle": "each command's exit status and output, run end to end, say what its verdicts say",
    "lab": "the lab's meters and schedules equal their definitions on runs built to separate them",
    "suite": "minispec.testing's checks fail on the planted bugs they are written to catch",
}
FIELDS = {"name": str, "class": str, "file": str, "old": str, "new": str, "why": str, "first": list}


@dataclass(frozen=True)
class Mutant:
    name: str
    kind: str  # the catalogue's `class`: which kind of property kills it (docs/testing.md)
    file: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    why: str  # where this bug comes from
    first: tuple[str, ...] = ()  # test files to run first (the suite still runs whole): kills come sooner


def load_catalogue(path: Path = CATALOGUE_FILE) -> list[Mutant]:
    """Every [[mutant]] table of the catalogue file, each field checked; one line names what is wrong."""
    try:
        tables = tomllib.loads(path.read_text(encoding="utf-8")).get("mutant", [])
    except (OSError, tomllib.TOMLDecodeError) as err:
        sys.exit(f"mutation_check: error: {path}: {err}")
    mutants = []
    for i, table in enumerate(tables):
        where = f"{path.name}: mutant {i + 1} ({table.get('name', 'unnamed')})"
        if set(table) - set(FIELDS) or set(FIELDS) - {"first"} - set(table):
            sys.exit(f"mutation_check: error: {where}: expected the fields {sorted(FIELDS)} ('first' optional)")
        for field, kind in FIELDS.items():
            if field in table and not isinstance(table[field], kind):
                sys.exit(f"mutation_check: error: {where}: {field} must be a {kind.__name__}")
        if table["class"] not in CLASSES:
            sys.exit(f"mutation_check: error: {where}: class {table['class']!r} is not one of {sorted(CLASSES)}")
        mutants.append(Mutant(table["name"], table["class"], table["file"], table["old"], table["new"], table["why"],
                              tuple(table.get("first", ()))))
    names = [m.name for m in mutants]
    if len(set(names)) != len(names):
        sys.exit(f"mutation_check: error: {path.name}: repeated names {sorted({n for n in names if names.count(n) > 1})}")
    return mutants


CATALOGUE = load_catalogue()


def copy_project(dest: Path) -> None:
    for name in ("minispec", "tests", "scripts", "docs", ".ci"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    (dest / "weights").symlink_to(ROOT / "weights")  # the converted checkpoint, shared read-only


# Test files that load the real checkpoint or run many generations go last, so that a mutant
# the fast tiny-model properties catch is killed in seconds. Every file still runs.
SLOW_LAST = ("test_testing.py", "test_readme.py", "test_cli.py", "test_real_checkpoint.py",
             "test_transformers_equivalence.py")


# The catalogue's own test reads the source for each mutant's target text: under a mutant that text
# is gone by construction, so it would "kill" every mutant the other tests miss. It is left out.
NOT_RUN = ("test_mutation_catalogue.py",)


def test_files(workdir: Path) -> list[str]:
    files = sorted(p.name for p in (workdir / "tests").glob("test_*.py") if p.name not in NOT_RUN)
    order = [f for f in files if f not in SLOW_LAST] + [f for f in SLOW_LAST if f in files]
    return [f"tests/{f}" for f in order]


def run_suite(workdir: Path, timeout: float, first: tuple[str, ...] = ()) -> tuple[bool, str, float]:
    """(passed, first failing test or '', seconds). `first`: test files to run before the rest."""
    env = {**os.environ, "MINISPEC_PROFILE": "mutation", "PYTHONDONTWRITEBYTECODE": "1"}
    files = [*first, *(f for f in test_files(workdir) if f not in first)]
    # the real pair's tests (marker `pair`) need an optional 9 GB download that CI does not make: every
    # mutant must be killed by the suite CI runs, so they are left out even where the pair is present
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not pair", *files]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"(timed out after {timeout:.0f}s)", time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    if proc.returncode == 0:
        return True, "", seconds
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.MULTILINE)
    return False, failed.group(1) if failed else f"(pytest exit {proc.returncode})", seconds


def check_import_location(workdir: Path) -> None:
    out = subprocess.run([sys.executable, "-c", "import minispec; print(minispec.__file__)"], cwd=workdir,
                         capture_output=True, text=True, check=True).stdout.strip()
    if not out.startswith(str(workdir)):
        sys.exit(f"mutation_check: error: the suite would import minispec from {out}, not from the mutated copy")


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="mutation_check", description="Apply realistic bugs one at a time and check the suite catches each.")
    ap.add_argument("--only", nargs="*", default=None, help="run only these mutants (by name)")
    ap.add_argument("--class", dest="kinds", nargs="*", default=None, choices=sorted(CLASSES),
                    help="run only the mutants of these classes")
    ap.add_argument("--skip-baseline", action="store_true", help="don't first check that the unmutated suite passes")
    ap.add_argument("--timeout", type=ranged(float, "--timeout", lo=0, lo_open=True), default=600,
                    help="seconds per suite run; a hang counts as killed")
    ap.add_argument("--list", action="store_true", help="list the catalogue and exit")
    args = ap.parse_args(argv)
    mutants = [m for m in CATALOGUE if (args.only is None or m.name in args.only)
               and (args.kinds is None or m.kind in args.kinds)]
    if args.list:
        for m in mutants:
            print(f"{m.name:36s} {m.kind:10s} {m.file:36s} {m.why}")
        return 0
    if args.only and {m.name for m in mutants} != set(args.only) and args.kinds is None:
        unknown = sorted(set(args.only) - {m.name for m in CATALOGUE})
        sys.exit(f"mutation_check: error: --only: unknown mutant(s) {unknown}; see --list")

    with tempfile.TemporaryDirectory(prefix="minispec-mutants-") as tmp:
        workdir = Path(tmp)
        copy_project(workdir)
        check_import_location(workdir)
        if not args.skip_baseline:
            ok, failed, seconds = run_suite(workdir, args.timeout)
            print(f"baseline (no mutation): {'passes' if ok else 'FAILS at ' + failed} in {seconds:.0f}s", flush=True)
            if not ok:
                return 2
        print(f"{'mutant':36s} {'killed by':72s} {'time':>6s}", flush=True)
        killed = 0
        for m in mutants:
            path = workdir / m.file
            pristine = path.read_text()
            if pristine.count(m.old) != 1:
                sys.exit(f"mutation_check: error: mutant {m.name}: its target text occurs {pristine.count(m.old)} "
                         f"times in {m.file}; expected exactly once (update the catalogue)")
            path.write_text(pristine.replace(m.old, m.new))
            try:
                passed, failed, seconds = run_suite(workdir, args.timeout, m.first)
            finally:
                path.write_text(pristine)
            killed += not passed
            print(f"{m.name:36s} {('SURVIVED' if passed else failed)[:72]:72s} {seconds:5.0f}s", flush=True)
        print(f"killed {killed} of {len(mutants)} mutants")
        return 0 if killed == len(mutants) else 1


if __name__ == "__main__":
    sys.exit(main())

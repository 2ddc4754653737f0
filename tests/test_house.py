"""The house's own rules, read from the code: imports run one way, and the reading guide is one text.

- No import cycle in the package and no private name (`_x`) imported from another module:
  every import statement counts, at module level or inside a function (a lazy import is still
  an arrow a reader follows).
- The folders import downward (MAY_IMPORT): the toolbox (errors, checks, cli) below model/, below
  acceptance/, below chain/ (chapter 1), below trees/ and batch/ (chapters 2 and 3), which never reach
  each other; the wings checkpoints/ and kernels/ build on model/. Only the front door (decode.py),
  the CLI (generate/) and testing/ call a chapter's loop. A new file obeys its folder's rule by
  where it is saved.
- README's reading guide is the package docstring's, word for word.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import minispec

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minispec"

# The house by folder: each folder (or top-level module) may import only what is listed beside it, so
# a new file joins its chapter's rules by where it is saved. The toolbox (errors, checks, cli) is below
# everything; model/ below acceptance/, below the chain, below trees and batches; the wings beside.
TOOLBOX = {"errors", "checks", "cli"}
MAY_IMPORT = {
    "errors": set(), "checks": {"errors"}, "cli": {"errors"},
    "model": TOOLBOX,
    "acceptance": TOOLBOX | {"model"},
    "chain": TOOLBOX | {"model", "acceptance"},
    "trees": TOOLBOX | {"model", "acceptance", "chain"},
    "batch": TOOLBOX | {"model", "acceptance", "chain"},
    "checkpoints": TOOLBOX | {"model"},
    "kernels": TOOLBOX | {"model", "checkpoints"},
    "weights": {"checkpoints"},
    "decode": {"errors", "chain", "trees", "batch"},
    # The lab, beside the chapters: it studies the method, so it may use all of it; nothing above
    # lists "lab", so nothing in the reference imports it (only the command line and testing/ may).
    "lab": TOOLBOX | {"model", "acceptance", "chain", "trees", "batch", "checkpoints", "kernels"},
}
ABOVE = {"generate", "testing"}  # may import any folder
# One file on the reading path reaches the wings: a draft named by checkpoint or precision is loaded there.
EXCEPTIONS = {"minispec.chain.drafters": {"checkpoints", "kernels"}}
LOOPS = {"minispec.chain.speculative", "minispec.trees.speculative", "minispec.batch.speculative"}
LOOP_IMPORTERS = {"decode"} | ABOVE  # only the front door, the CLI and testing/ call a chapter's loop
# What the other chapters take from chapter 1's file: the parts of a step, never a loop.
STEP_PARTS = {"PhaseTimer", "prefill", "first_token", "verify_input", "finish_reason", "commit"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(module: str) -> list[tuple[str, str | None, int]]:
    """(imported module, the name taken or None, line) for every import statement of `module`."""
    path = MODULES[module]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append((submodule, None, node.lineno) if submodule in MODULES else (base, alias.name, node.lineno))
    return found


def edges(module: str) -> set[str]:
    """The package's modules that `module` imports (a package's face is its __init__)."""
    out = set()
    for target, _, _ in imports(module):
        while target not in MODULES and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in MODULES and target != module and target != "minispec":
            out.add(target)
    return out


GRAPH = {module: edges(module) for module in MODULES}


def reachable(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for nxt in GRAPH[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_no_import_cycles():
    cycles = sorted(m for m in MODULES if m in reachable(m))
    assert not cycles, f"modules on an import cycle: {cycles}"


def private_names(found: list[tuple[str, str | None, int]]) -> list[str]:
    """The imports among `found` that take a private name from a minispec module."""
    return [f"{name} from {target} (line {line})" for target, name, line in found
            if target.startswith("minispec") and name and name.startswith("_") and not name.startswith("__")]


def test_no_private_name_is_imported_from_another_module():
    private = {m: private_names(imports(m)) for m in MODULES}
    assert not any(private.values()), {m: p for m, p in private.items() if p}


def folder(module: str) -> str:
    """The folder (or top-level module) a module is saved in: minispec.chain.request -> chain."""
    return module.split(".")[1] if module != "minispec" else ""


def folder_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Every import that crosses folders against MAY_IMPORT, EXCEPTIONS and the loop rule."""
    breaches = []
    for module, targets in sorted(graph.items()):
        home = folder(module)
        if module == "minispec" or home in ABOVE:
            continue
        allowed = MAY_IMPORT[home] | EXCEPTIONS.get(module, set())
        for target in sorted(targets):
            there = folder(target)
            if there != home and there not in allowed:
                breaches.append(f"{module} imports {target}: {home}/ may import only {sorted(allowed)}")
    return breaches


def loop_breaches(imported: dict[str, list[tuple[str, str | None, int]]]) -> list[str]:
    """Every import of another chapter's loop from outside the front door, the CLI and testing/: a
    chapter may take the parts of a step (STEP_PARTS) from chapter 1's file, never a loop."""
    breaches = []
    for module, found in sorted(imported.items()):
        home = folder(module)
        if module == "minispec" or home in LOOP_IMPORTERS:
            continue
        for target, name, line in found:
            if target in LOOPS and folder(target) != home and name not in STEP_PARTS:
                breaches.append(f"{module} imports {name or 'the module'} from the loop {target} (line {line}): "
                                f"only {sorted(LOOP_IMPORTERS)} may; a chapter takes only {sorted(STEP_PARTS)}")
    return breaches



def test_nothing_in_the_reference_imports_the_lab(monkeypatch):
    """The lab (minispec/lab/) measures the method; the method never depends on it: no module outside
    the lab imports it but the command line (generate/) and testing/, which sit above everything. A
    planted import of the lab from a chapter is a breach."""
    monkeypatch.setitem(GRAPH, "minispec.chain.request", GRAPH["minispec.chain.request"] | {"minispec.lab.pacing"})
    assert any("chain.request imports minispec.lab.pacing" in line for line in folder_breaches(GRAPH))
    monkeypatch.undo()
    importers = sorted(m for m, targets in GRAPH.items() if folder(m) not in {"lab", "generate", "testing"}
                       and any(folder(t) == "lab" for t in targets))
    assert importers == []
    assert all(folder != "lab" and "lab" not in allowed for folder, allowed in MAY_IMPORT.items() if folder != "lab")


def test_every_folder_has_a_rule():
    assert {folder(m) for m in MODULES if m != "minispec"} <= set(MAY_IMPORT) | ABOVE


def test_the_folders_import_downward():
    assert not folder_breaches(GRAPH)
    assert not loop_breaches({module: imports(module) for module in MODULES})
    assert GRAPH["minispec.decode"] - {"minispec.errors"} == LOOPS  # the front door hands off, nothing more


def test_the_rules_above_catch_a_back_edge_a_cycle_and_a_private_import(monkeypatch):
    """The checks are not vacuous: a planted edge back up is a breach and a cycle, a planted private
    import is named, and a chapter that calls another's loop is caught."""
    assert "minispec.chain.request" not in reachable("minispec.chain.request")
    monkeypatch.setitem(GRAPH, "minispec.model.kv_cache", GRAPH["minispec.model.kv_cache"] | {"minispec.chain.request"})
    assert folder_breaches(GRAPH) == ["minispec.model.kv_cache imports minispec.chain.request: model/ may import only "
                                      "['checks', 'cli', 'errors']"]
    assert "minispec.chain.request" in reachable("minispec.chain.request")
    monkeypatch.undo()
    monkeypatch.setitem(GRAPH, "minispec.trees.walks", GRAPH["minispec.trees.walks"] | {"minispec.batch.drafters"})
    assert any("trees.walks imports minispec.batch.drafters" in line for line in folder_breaches(GRAPH))
    monkeypatch.undo()
    planted = {"minispec.batch.drafters": [("minispec.chain.speculative", "speculative_decode", 7),
                                           ("minispec.chain.speculative", "commit", 8)],
               "minispec.trees.walks.base": [("minispec.batch.speculative", None, 3)]}
    assert loop_breaches(planted) == [
        "minispec.batch.drafters imports speculative_decode from the loop minispec.chain.speculative (line 7): only "
        f"['decode', 'generate', 'testing'] may; a chapter takes only {sorted(STEP_PARTS)}",
        "minispec.trees.walks.base imports the module from the loop minispec.batch.speculative (line 3): only "
        f"['decode', 'generate', 'testing'] may; a chapter takes only {sorted(STEP_PARTS)}"]
    assert private_names([("minispec.chain.request", "_hidden", 3), ("minispec.chain.request", "commit", 4)]) == \
        ["_hidden from minispec.chain.request (line 3)"]


def reading_guide(text: str) -> str:
    """The lines from the one that starts with 'Chapter 1' up to the first blank line or code fence."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("Chapter 1")), None)
    assert first is not None, "no reading guide starting with 'Chapter 1'"
    end = next((i for i in range(first, len(lines)) if not lines[i].strip() or lines[i].startswith("```")),
               len(lines))
    return "\n".join(line.rstrip() for line in lines[first:end])


def test_readme_reading_guide_is_the_package_docstring():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert reading_guide(readme) == reading_guide(minispec.__doc__)
    for name in re.findall(r"\b([a-z_/]+(?:\.py|/))(?=[\s,:)]|$)", reading_guide(minispec.__doc__)):
        assert list(PACKAGE.rglob(name.rstrip("/"))), f"the reading guide names {name}, which is not in the package"


def test_minispec_generate_is_the_command_line_and_the_front_door_is_minispec_decode_generate():
    """Each name means one thing whatever was imported first: minispec.generate is the command line's
    package (`python -m minispec.generate`), minispec.decode.generate the function that decodes."""
    import subprocess
    import sys

    code = ("import types, minispec, minispec.decode, minispec.generate.flags\n"
            "from minispec import generate as cli\n"
            "from minispec.decode import generate\n"
            "assert isinstance(cli, types.ModuleType) and cli.__name__ == 'minispec.generate' and callable(cli.main)\n"
            "assert callable(generate) and generate.__module__ == 'minispec.decode'\n"
            "assert type(minispec) is types.ModuleType")
    for first in ("import minispec.generate", "import minispec.decode", "import minispec"):
        proc = subprocess.run([sys.executable, "-c", f"{first}\n{code}"], capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr


def test_one_speculative_step_reads_in_a_few_files():
    """The step a learner follows (draft, verify, decide, roll back, commit: scripts/tooling/step_lines.py
    traces the package functions it runs) stays short: at most 4 files and 160 lines of function
    bodies outside the model's own files, with the sampling rule and a draft model. A hook or a
    branch for one policy put back into the step shows here first."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts" / "tooling"))
    import step_lines

    traced = step_lines.traced_step_functions("sampling", "model")
    counted = {(path, line) for path, line, _ in traced if path.parent.name != "model"}
    files = {path for path, _ in counted}
    lines = sum(step_lines.body_lines(path, line) for path, line in counted)
    assert PACKAGE / "chain" / "speculative.py" in files and len(files) <= 4, sorted(files)
    assert 100 <= lines <= 160, lines  # a trace that missed the step would count far fewer

"""The house's own rules, read from the code: imports run one way, and the reading guide is one text.

- No import cycle in the package and no private name (`_x`) imported from another module:
  every import statement counts, at module level or inside a function (a lazy import is still
  an arrow a reader follows).
- The chapters import downward: chapter 1's modules below the chain loop reach no loop and no
  module of the tree or batch chapters; the tree and batch chapters never reach each other, nor
  the chain's loop (speculative.py): what every loop needs is in loop.py. Only the front door (decode.py), the CLI, the tracer and minispec.testing sit above
  all three.
- README's reading guide is the package docstring's, word for word.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import minispec

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minispec"

TREES = {"minispec.tree", "minispec.tree_drafters", "minispec.tree_speculative", "minispec.acceptance.trees"}
BATCHES = {"minispec.ragged_cache", "minispec.batch_drafters", "minispec.batch"}
LOOPS = {"minispec.speculative", "minispec.tree_speculative", "minispec.batch"}
ABOVE = ("minispec.decode", "minispec.generate", "minispec.testing", "minispec.trace")  # may import any chapter


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


def test_the_chapters_import_downward():
    core = [m for m in MODULES if m not in TREES | BATCHES | LOOPS and not m.startswith(ABOVE) and m != "minispec"]
    for module in core:
        assert not reachable(module) & (TREES | BATCHES | LOOPS), f"{module} (chapter 1) reaches a loop or chapter 2/3"
    for module in TREES:
        assert not reachable(module) & (BATCHES | {"minispec.speculative"}), f"{module} reaches the batch or chain loop"
    for module in BATCHES:
        assert not reachable(module) & (TREES | {"minispec.speculative"}), f"{module} reaches the tree or chain loop"
    assert GRAPH["minispec.decode"] == LOOPS  # the front door hands off, nothing more


def test_the_rules_above_catch_a_cycle_and_a_private_import(monkeypatch):
    """The checks are not vacuous: a planted edge back up is a cycle, a planted private import is named."""
    assert "minispec.loop" not in reachable("minispec.loop")
    monkeypatch.setitem(GRAPH, "minispec.loop", GRAPH["minispec.loop"] | {"minispec.speculative"})
    assert "minispec.loop" in reachable("minispec.loop")
    assert private_names([("minispec.loop", "_hidden", 3), ("minispec.loop", "commit", 4)]) == \
        ["_hidden from minispec.loop (line 3)"]


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
    for module in re.findall(r"\b([a-z_/]+\.py)\b", reading_guide(minispec.__doc__)):
        candidates = list(PACKAGE.rglob(Path(module).name))
        assert candidates, f"the reading guide names {module}, which is not in the package"

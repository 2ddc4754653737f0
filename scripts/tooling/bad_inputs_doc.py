"""Write docs/bad_inputs.md: the bad-input table of tests/test_bad_inputs.py, every row run as the test runs it.

    python scripts/tooling/bad_inputs_doc.py           # run every row (about 30 s), write the doc
    python scripts/tooling/bad_inputs_doc.py --check   # exit 1 if the doc differs from what the rows give now

A row that does not behave as the table says (no one-line error, another exit status) is
reported and nothing is written: the doc only ever shows rows that pass.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import test_bad_inputs as table  # noqa: E402  (the table lives with its test)


def build(rows: list[table.Row]) -> tuple[str, list[str]]:
    """The doc's text, and one line per row that failed its checks."""
    failures, outcomes = [], []
    with tempfile.TemporaryDirectory(prefix="minispec-bad-inputs-") as tmp:
        tiny = table.build_tiny_checkpoint(Path(tmp) / "TINY")
        for i, row in enumerate(rows):
            folder = Path(tmp) / f"row{i}" / "CKPT"
            folder.parent.mkdir()
            outcome = table.run_row(row, tiny, folder)
            try:
                table.check_outcome(row, outcome, folder)
            except AssertionError as err:
                failures.append(f"{row.case}: {err}")
            outcomes.append(outcome)
    return table.render_doc(rows, outcomes), failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the doc instead of writing it")
    parser.add_argument("--out", type=Path, default=table.DOC, help="the markdown file")
    args = parser.parse_args(argv)
    text, failures = build(table.ROWS)
    for failure in failures:
        print(f"row {failure}", file=sys.stderr)
    if failures:
        return 1
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
        if current != text:
            sys.stderr.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                                       str(args.out), "rows as run now"))
            print(f"{args.out} is out of date: run python scripts/tooling/bad_inputs_doc.py", file=sys.stderr)
            return 1
        print(f"{args.out} is current ({len(table.ROWS)} rows)")
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(table.ROWS)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The scripts that read another script's JSON result (rules_table, bench_plot, dropmatch_plot) read it
through one reader, benchlib.read_result: whatever file they are given that is not that script's
result (another script's, one without a run record, not JSON, a folder, a device, one lacking a
key the reader needs) is one line naming the flag and the file, exit 2, never a traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
for folder in ("scripts", "scripts/rules", "scripts/dropmatch"):
    sys.path.insert(0, str(ROOT / folder))

import bench_plot  # noqa: E402
import dropmatch_plot  # noqa: E402
import rules_table  # noqa: E402

# (reader, argv before the file, the flag named, the script whose result it reads, a key it needs)
READERS = [(rules_table.main, ["--pair"], "--pair", "bench_humaneval", "task_ids"),
           (rules_table.main, ["--chains"], "--chains", "bench_policies", "records"),
           (rules_table.main, ["--trees"], "--trees", "bench_tree_rules", None),
           (bench_plot.main, [], "result", "bench_policies", "summary"),
           (dropmatch_plot.main, ["--quality"], "--quality", "dropmatch_quality", "rows"),
           (dropmatch_plot.main, ["--calibration"], "--calibration", "dropmatch_calibration", "models")]


def result_of(script: str, **keys) -> dict:
    return {"run": {"command": f"python scripts/somewhere/{script}.py --flag"}, **keys}


def bad_files(tmp_path: Path, made_by: str, needed: str | None) -> dict[str, tuple[Path, str]]:
    """name -> (file, what its line must say)."""
    files = {}
    for name, content, says in (("other-script", json.dumps(result_of("bench_formats", records=[], summary={})),
                                 "a result of scripts/somewhere/bench_formats.py"),
                                ("no-run-record", json.dumps({"records": []}), "no run record"),
                                ("run-record-not-a-dict", json.dumps({"run": ["x"]}), "no run record"),
                                ("a-list", "[1, 2]", "no run record"),
                                ("not-json", "{nope", "not JSON"),
                                ("not-utf8", b"\xff\xfe{", "not JSON")):
        path = tmp_path / f"{name}.json"
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        files[name] = (path, says)
    files["a-folder"] = (tmp_path, "a folder")
    files["a-device"] = (Path("/dev/zero"), "a device")
    if needed is not None:
        path = tmp_path / "lacks-a-key.json"
        path.write_text(json.dumps(result_of(made_by)))
        files["lacks-a-key"] = (path, repr(needed))
    return files


@pytest.mark.parametrize("main, argv, flag, made_by, needed", READERS, ids=lambda v: getattr(v, "__module__", v))
def test_a_file_that_is_not_the_result_a_reader_takes_is_one_line_naming_its_flag(main, argv, flag, made_by, needed,
                                                                                   tmp_path, capsys):
    for name, (path, says) in bad_files(tmp_path, made_by, needed).items():
        code = main([*argv, str(path)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, (name, err)
        assert f"{flag} {path}" in err[0] and says in err[0] and "scripts/" in err[0], (name, err[0])


def test_a_records_file_cut_off_mid_write_resumes_and_a_foreign_line_is_one_line(tmp_path, capsys):
    """benchlib.read_records, which every resumable script reads its records with: a last line without
    its newline (a run killed while writing) is dropped and said; a line that is not a record of the
    script (not JSON, not an object, without the key's fields) is one MinispecError naming file:line."""
    import benchlib
    from minispec.errors import MinispecError

    key = lambda r: (r["config"], r["task_id"])  # noqa: E731
    file = tmp_path / "records.jsonl"
    file.write_text('{"config": "a", "task_id": 1}\n\n{"config": "b", "task_id": 2}\n{"config": "c", "ta')
    assert list(benchlib.read_records(file, key)) == [("a", 1), ("b", 2)]
    assert "cut off mid-write" in capsys.readouterr().err
    for number, bad in ((2, "{nope"), (2, "[1, 2]"), (2, '{"config": "b"}'), (2, "3")):
        file.write_text('{"config": "a", "task_id": 1}\n' + bad + "\n")
        with pytest.raises(MinispecError, match=rf"^{file}:{number}: not one of this script's records"):
            benchlib.read_records(file, key)
    assert benchlib.read_records(tmp_path / "none.jsonl", key) == {}

"""benchlib's llama.cpp runners on stand-in programs: the folder check, and what is read from the
programs' output (llama-bench's JSON, the speculative example's log). The real programs are
measured by scripts/speed/bench_formats.py --llama-cpp."""

import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import benchlib  # noqa: E402
import bench_formats  # noqa: E402
from minispec.errors import MinispecError  # noqa: E402


def stand_in(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def build(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir, "llama-bench", """case "$*" in *"--repack 1"*) t=21.5;; *) t=17.25;; esac
echo '[{"n_gen": 64, "avg_ts": '$t'}]'
""")
    stand_in(bin_dir, "llama-speculative-simple", """echo "encoded   30 tokens in    0.500 seconds, speed:   60.000 t/s" >&2
echo "decoded   64 tokens in    4.000 seconds, speed:   16.000 t/s" >&2
echo "n_drafted = 50" >&2
echo "n_accept  = 40" >&2
""")
    return tmp_path


def test_a_folder_without_the_programs_is_one_line_naming_the_flag(tmp_path):
    (tmp_path / "bin").mkdir()
    stand_in(tmp_path / "bin", "llama-bench", "true\n")
    with pytest.raises(MinispecError, match=r"^--llama-cpp .*bin/llama-speculative-simple$"):
        benchlib.llama_bin(tmp_path)
    assert benchlib.llama_bin(None) is None


def test_the_runners_read_speed_and_acceptance_from_the_programs_output(build):
    bin_dir = benchlib.llama_bin(build)
    assert benchlib.llama_plain_tps(bin_dir, Path("t.gguf"), 64, repack=True) == 21.5
    assert benchlib.llama_plain_tps(bin_dir, Path("t.gguf"), 64, repack=False) == 17.25
    r = benchlib.llama_speculative(bin_dir, Path("t.gguf"), Path("d.gguf"), "def f():", 64)
    assert r == {"decode_tps": 16.0, "generated": 64, "acceptance": 0.8}


def test_a_failing_program_is_a_record_not_a_crash(tmp_path):
    (tmp_path / "bin").mkdir()
    stand_in(tmp_path / "bin", "llama-bench", "echo oops; exit 1\n")
    stand_in(tmp_path / "bin", "llama-speculative-simple", "echo 'error: unknown model type' >&2; exit 1\n")
    bin_dir = benchlib.llama_bin(tmp_path)
    assert benchlib.llama_plain_tps(bin_dir, Path("t.gguf"), 8) is None
    assert benchlib.llama_speculative(bin_dir, Path("t.gguf"), Path("d.gguf"), "x", 8) == \
        {"error": "error: unknown model type"}


def test_the_ratio_is_minispecs_fastest_over_llama_cpps_fastest():
    llama = {"target": "t", "draft": "d", "plain_tps": {"t": 20.0, "t, no repack": 16.0, "d": 45.0, "d, no repack": 44.0},
             "speculative": [{"decode_tps": 12.0}, {"decode_tps": 14.0}, {"error": "x"}]}
    rows = [{"format": "fp16", "config": "plain", "decode_tps": 10.0},
            {"format": "int8-dynamic", "config": "n-gram g5", "decode_tps": 30.0}]
    text = bench_formats.render_llama(llama, rows)
    assert "int8-dynamic n-gram g5, 30.0 decode tok/s = 1.50x llama.cpp's fastest with t (20.0 tok/s)" in text  # not d
    assert "failed on 1 prompt(s): x" in text

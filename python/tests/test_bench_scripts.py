# The benchmark scripts beside the package (python/bench_*.py) as a user runs them, on shrunken
# models on the CPU: each finishes, prints its table with memeff's row, and writes its JSON.
# Their numbers come from the GPU machine (docs/benchmarks.md); here only that they run.
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.dirname(HERE)  # python/


def run_script(name, *args, tmp_path):
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, name), *args, "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ,
                          "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads(out.read_text())


def test_bench_train_runs(tmp_path):
    stdout, report = run_script("bench_train.py", "--batch", "2", "--seq", "32", "--width", "32",
                                "--heads", "2", "--layers", "1", "--steps", "1", "--warmup", "1",
                                "--backends", "memeff,default,math", tmp_path=tmp_path)
    assert "| memeff |" in stdout and "| default |" in stdout
    assert [r["backend"] for r in report["results"]] == ["memeff", "default", "math"]
    assert all(r["ms"] > 0 for r in report["results"])


@pytest.mark.parametrize("extra", [[], ["--bert-pad", "0.5", "--llama-pad", "0.5"]],
                         ids=["plain", "padded"])
def test_bench_hf_runs(tmp_path, extra):
    pytest.importorskip("transformers")
    stdout, report = run_script("bench_hf.py", "--steps", "1", "--warmup", "1",
                                "--backends", "memeff,default", *extra, tmp_path=tmp_path)
    assert [m["model"] for m in report["models"]] == ["bert", "llama"]
    for model in report["models"]:
        assert [r["backend"] for r in model["results"]] == ["memeff", "default"]
        assert all("error" not in r for r in model["results"]), model
    assert ("right-padded" in stdout) == bool(extra)


def test_bench_profile_runs(tmp_path):
    pytest.importorskip("transformers")
    stdout, report = run_script("bench_profile.py", "--models", "bert", "--steps", "1",
                                "--warmup", "1", "--backends", "memeff,default",
                                tmp_path=tmp_path)
    assert "host: memeff ops" in stdout
    (model,) = report["models"]
    memeff, default = model["results"]
    assert memeff["host"]["memeff ops"][1] > 0  # memeff's op ran in its step ...
    assert default["host"]["memeff ops"][1] == 0  # ... and not in torch's

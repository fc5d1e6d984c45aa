"""README.md as documentation that runs: its set-up commands and every ```python block.

Each block runs as written in its own interpreter (fresh global state), with ``DNNBIND_DATA`` in a
temporary directory and the MNIST mirrors pointed at a port nothing listens on, so nothing is
downloaded (``mnist.load_data()`` takes its offline fallback, the digits shipped with dnnbind).
Blocks run on the NumPy backend, except those whose first line says ``# needs an NVIDIA GPU``:
they are marked ``gpu`` (skipped, with the reason, off-GPU) and run on CUDA. Every block's output
is checked against the numbers it promises.
"""

from __future__ import annotations

import ast
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
GPU_MARK = "# needs an NVIDIA GPU"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, flags=re.MULTILINE | re.DOTALL)


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/"


def _params():
    params = []
    for i, code in enumerate(_blocks("python")):
        first = code.splitlines()[0] if code.strip() else ""
        marks = [pytest.mark.gpu] if first.startswith(GPU_MARK) else []
        params.append(pytest.param(i, code, id=f"block{i}-{'gpu' if marks else 'cpu'}", marks=marks))
    return params


def _expect(code: str, out: str) -> None:
    """The checks each block's output must pass, keyed by what the block does."""
    lines = out.strip().splitlines()
    assert lines, "the block printed nothing"
    last = lines[-1]
    if "mnist.load_data()" in code:
        loss, accuracy = ast.literal_eval(last[last.index("["):])
        assert 0 < loss < 1.0 and accuracy > 0.8, last  # one epoch on 8,000 real digits; chance is 0.1
        assert any(re.match(r"63/63 .*accuracy: [0-9.]+ - loss: [0-9.]+", line) for line in lines), out  # the epoch
    elif "cuda.Kernel" in code:
        assert last == "[0. 2. 4. 6.]", last
    elif "to_device" in code:
        shape, diff = re.fullmatch(r"(\(.*\)) (\S+)", last).groups()
        assert ast.literal_eval(shape) == (8, 16, 16, 16) and float(diff) < 0.1, last
    elif "conv2d_forward" in code:
        assert last == "(8, 16, 16, 16)", last
    elif "set_global_policy" in code:
        assert last == "bfloat16 float32", last
    elif "GradientTape" in code:
        first, final = (float(v) for v in last.split())
        assert final < 0.25 * first, last  # a custom layer and train_step with no backward written do train
    else:
        pytest.fail(f"a new README block: add the numbers it must print to _expect\n{code}")


@pytest.mark.parametrize("index, code", _params())
def test_readme_python_block_runs_as_written(index, code, tmp_path):
    on_gpu = code.startswith(GPU_MARK)
    env = dict(os.environ, DNNBIND_DATA=str(tmp_path / "data"), DNNBIND_MNIST_MIRRORS=_dead_url(),
               DNNBIND_DEVICE="cuda" if on_gpu else "cpu",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # a deprecated name called from a block (dnnbind.ops.<primitive>, now dnnbind.kernels) fails it
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning:__main__", "-c", code], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"README block {index} failed:\n{code}\n--- output ---\n{proc.stdout}{proc.stderr}"
    _expect(code, proc.stdout)


def test_readme_has_exactly_two_setup_commands():
    """One command sets up and runs the main job (no flags), one sets up and runs the tests."""
    commands = [c.strip() for c in _blocks("bash")]
    setup = [c for c in commands if "pip install" in c]
    assert len(setup) == 2, setup
    main, tests = setup
    assert main.endswith("&& python examples/mnist.py"), main
    assert "pytest" in tests and main.startswith("python3 -m venv .venv && ") and tests.startswith("python3 -m venv")
    # the CPU-only install is prose inside the set-up section, not a third command
    section = README[README.index("## Set-up"):README.index("## Supported versions")]
    assert "`pip install -e .`" in section and "NumPy backend" in section


def test_readme_states_the_layout_defaults():
    assert "kernels default to NCHW" in README.replace("\n", " ")
    assert "layers default to NHWC" in README.replace("\n", " ")


def test_readme_blocks_are_found():
    blocks = _params()
    assert len(blocks) >= 5
    assert sum(1 for b in blocks if b.marks) >= 2  # the device blocks are marked, not dropped

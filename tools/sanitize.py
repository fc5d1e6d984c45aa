#!/usr/bin/env python3
"""Run NVIDIA compute-sanitizer over dnnbind's GPU tests and graph-replayed training steps.

Each target (one GPU test file, or the replayed train/test/predict steps of one benchmark
model) runs in its own ``compute-sanitizer --tool TOOL python ...`` process, so a chunk fits
the device machine's 10-minute call; ``--jobs`` runs several at once on the one GPU.
Results accumulate in ``OUT/summary.json`` (a later call merges into it) and are printed
and written as ``OUT/summary.md``:

* memcheck, initcheck, synccheck: the sanitizer's ``ERROR SUMMARY`` count;
* racecheck: the hazards, split into dnnbind's own kernels (NVRTC ``extern "C"`` names) and
  library kernels (cuDNN/cuBLAS, C++ names with ``::``), as only the first are ours to fix;
* for every tool, the kernels the reports came from, and pytest's outcome under the tool.

Usage (on a machine with a GPU and compute-sanitizer)::

    python tools/sanitize.py --tool memcheck --jobs 4              # every GPU test file + 3 models
    python tools/sanitize.py --tool racecheck --tests tests/test_kernels_losses_gpu.py --no-models
    python tools/sanitize.py --tool memcheck --shard 2/3 --out san  # a third of the targets
    python tools/sanitize.py --tool memcheck --models mnist_cnn --no-tests
    python tools/sanitize.py --tool memcheck --no-models --tests tests/test_ops_registry_gpu.py --select float32

compute-sanitizer is looked up in ``$COMPUTE_SANITIZER``, ``PATH``, ``$CUDA_HOME/bin`` and
``/usr/local/cuda/bin``. ``--report-api-errors no`` is always passed: cuda-bindings probes
``cuGetProcAddress`` for entry points the driver lacks, and those probes are not errors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
MODELS = ("mnist_cnn", "vgg_cifar", "airbench94")
ENV_FLAG = "DNNBIND_UNDER_SANITIZER"  # set for the sanitized process: nested sanitizer tests skip

_ERRORS = re.compile(r"ERROR SUMMARY: (\d+) error")
_HAZARDS = re.compile(r"RACECHECK SUMMARY: (\d+) hazard")
_KERNEL = re.compile(r"\bat (?:void )?([^\s(]+(?:<[^>]*>)?)[^+\n]*\+0x[0-9a-f]+")
_PYTEST_LAST = re.compile(r"^=*\s*(\d+ (?:passed|failed|skipped|error).*?) in [\d.]+s")

# The step script a model target runs: warm-up, capture and replays of the three step kinds.
STEP_SCRIPT = r"""
import sys
sys.path.insert(0, {bench!r})
import numpy as np, dnnbind
from dnnbind import backend, cuda
from train_step import MODELS, build_dnnbind, make_batch
name, precision, steps = {name!r}, {precision!r}, {steps}
dnnbind.mixed_precision.set_global_policy(precision)
model = build_dnnbind(name, "auto")
batch = min(MODELS[name]["batch"], {max_batch})
x, y = make_batch(name, batch)
device = backend.default_device()
xd, yd = backend.asarray(x, device), backend.asarray(y, device)
for _ in range(steps):
    model.train_on_batch(xd, yd, return_dict=True)
for _ in range(3):
    model.test_on_batch(xd, yd, return_dict=True)
    out = model.predict_on_batch(xd)
cuda.current_stream().synchronize()
stats = model._step_graphs.stats
assert stats["captures"] >= 3 and stats["replays"] >= steps - 2 and stats["failures"] == 0, stats
assert np.isfinite(out).all()
print("steps ok", name, precision, stats)
"""


def find_compute_sanitizer() -> "str | None":
    """The compute-sanitizer executable, or None."""
    candidates = [os.environ.get("COMPUTE_SANITIZER"), shutil.which("compute-sanitizer")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(os.path.join(home, "bin", "compute-sanitizer"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def gpu_test_files() -> list[str]:
    """Test files that hold at least one ``@pytest.mark.gpu`` test."""
    files = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        text = path.read_text()
        if "mark.gpu" in text and "test_sanitizer_gpu" not in path.name:
            files.append(str(path.relative_to(ROOT)))
    return files


def targets(args) -> list[dict]:
    found = []
    if not args.no_tests:
        for f in args.tests or gpu_test_files():
            found.append({"name": f, "kind": "tests", "file": f})
    if not args.no_models:
        for m in args.models or MODELS:
            for precision in args.precisions:
                found.append({"name": f"steps:{m}:{precision}", "kind": "model", "model": m,
                              "precision": precision})
    if args.shard:
        index, count = (int(v) for v in args.shard.split("/"))
        found = found[index - 1::count]
    return found


# Library kernels with plain C names: cuBLAS(Lt)'s nvjet/xmma GEMMs (e.g. nvjet_sm90_qqtst_..._relubias_TNT,
# sm90_xmma_gemm_...), CUTLASS, cuDNN's runtime-fusion and NCCL kernels
_LIBRARY_NAMES = re.compile(r"^(nvjet_|sm\d+_|cutlass|xmma|cudnn|cublas|nccl|ampere_|hopper_|volta_|turing_)",
                            re.IGNORECASE)


def classify(kernel: str) -> str:
    """'dnnbind' for our NVRTC kernels (plain extern "C" names), 'library' for cuDNN/cuBLAS/NCCL ones
    (C++ names, or the C-named families above)."""
    return "library" if ("::" in kernel or "<" in kernel or _LIBRARY_NAMES.match(kernel)) else "dnnbind"


def report_kernels(text: str) -> dict[str, int]:
    """How many of the sanitizer's reports in ``text`` name each kernel (classify() splits them)."""
    kernels: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("=========") and ("Invalid" in line or "Race" in line or "Uninitialized" in line
                                             or " at " in line):
            m = _KERNEL.search(line)
            if m:
                kernels[m.group(1)] = kernels.get(m.group(1), 0) + 1
    return kernels


def run_target(sanitizer: str, tool: str, target: dict, out: Path, timeout: float, max_batch: int,
               print_limit: int = 1000, select: "str | None" = None) -> dict:
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{tool}-{target['name']}")
    log = out / f"{tag}.log"
    if target["kind"] == "tests":
        # -n 0: one process per target (pyproject's addopts start a pytest-xdist worker per core, and a
        # sanitizer following 16 workers, each compiling the kernels again, runs out of the call's time)
        cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-m", "gpu", "-p", "no:cacheprovider", target["file"]]
        if select:
            cmd += ["-k", select]
    else:
        script = STEP_SCRIPT.format(bench=str(ROOT / "benchmarks"), name=target["model"],
                                    precision=target["precision"], steps=6, max_batch=max_batch)
        cmd = [sys.executable, "-c", script]
    full = [sanitizer, "--tool", tool, "--report-api-errors", "no", "--print-limit", str(print_limit)]
    if tool == "racecheck":
        full += ["--racecheck-report", "all"]
    full += cmd
    env = dict(os.environ, **{ENV_FLAG: tool, "PYTHONUNBUFFERED": "1"})
    start = time.monotonic()
    try:
        proc = subprocess.run(full, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
        text, rc, timed_out = proc.stdout, proc.returncode, False
    except subprocess.TimeoutExpired as exc:
        text = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc, timed_out = None, True
    seconds = time.monotonic() - start
    log.write_text(text)
    counts = _ERRORS.findall(text) if tool != "racecheck" else _HAZARDS.findall(text)
    kernels = report_kernels(text)
    outcome = ""
    for line in reversed(text.splitlines()):
        m = _PYTEST_LAST.search(line)
        if m:
            outcome = m.group(1)
            break
    if target["kind"] == "model":
        outcome = "steps ok" if "steps ok" in text else "steps FAILED"
    return {
        "tool": tool, "target": target["name"], "errors": int(counts[-1]) if counts else None,
        "kernels": kernels,
        "dnnbind_kernel_reports": sum(n for k, n in kernels.items() if classify(k) == "dnnbind"),
        "library_kernel_reports": sum(n for k, n in kernels.items() if classify(k) == "library"),
        "exit_status": rc, "timed_out": timed_out, "outcome": outcome, "seconds": round(seconds, 1),
        "log": log.name,
    }


def write_summary(out: Path, results: list[dict]) -> dict:
    path = out / "summary.json"
    merged = {}
    if path.exists():
        merged = {(r["tool"], r["target"]): r for r in json.loads(path.read_text())}
    for r in results:
        merged[(r["tool"], r["target"])] = r
    rows = sorted(merged.values(), key=lambda r: (r["tool"], r["target"]))
    path.write_text(json.dumps(rows, indent=1))
    totals: dict = {}
    lines = ["| tool | target | errors/hazards | in dnnbind kernels | in library kernels | outcome | s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        t = totals.setdefault(r["tool"], {"targets": 0, "errors": 0, "dnnbind": 0, "library": 0, "incomplete": 0})
        t["targets"] += 1
        t["errors"] += r["errors"] or 0
        t["dnnbind"] += r["dnnbind_kernel_reports"]
        t["library"] += r["library_kernel_reports"]
        t["incomplete"] += r["errors"] is None
        errors = "no summary (crashed or timed out)" if r["errors"] is None else r["errors"]
        lines.append(f"| {r['tool']} | {r['target']} | {errors} | {r['dnnbind_kernel_reports']} | "
                     f"{r['library_kernel_reports']} | {r['outcome']} | {r['seconds']} |")
    lines += ["", "| tool | targets | errors/hazards | in dnnbind kernels | in library kernels | without summary |",
              "|---|---|---|---|---|---|"]
    for tool, t in sorted(totals.items()):
        lines.append(f"| {tool} | {t['targets']} | {t['errors']} | {t['dnnbind']} | {t['library']} | "
                     f"{t['incomplete']} |")
    kernels: dict = {}
    for r in rows:
        for k, n in r["kernels"].items():
            kernels[(r["tool"], k)] = kernels.get((r["tool"], k), 0) + n
    if kernels:
        lines += ["", "Kernels named in reports (tool, kernel, report lines):"]
        lines += [f"- {tool}: `{k}` ({n}, {classify(k)})" for (tool, k), n in sorted(kernels.items())]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return totals


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tool", action="append", choices=TOOLS, help="repeatable; default: all four")
    parser.add_argument("--tests", nargs="*", help="test files (default: every file with GPU tests)")
    parser.add_argument("--models", nargs="*", choices=MODELS, help="benchmark models (default: all three)")
    parser.add_argument("--precisions", nargs="+", default=["float32", "mixed_bfloat16"])
    parser.add_argument("--select", help="pytest -k expression for the test targets (a slice of a large file)")
    parser.add_argument("--no-tests", action="store_true")
    parser.add_argument("--no-models", action="store_true")
    parser.add_argument("--shard", help="i/n: run every n-th target starting at the i-th (1-based)")
    parser.add_argument("--jobs", type=int, default=1, help="sanitized processes at once")
    parser.add_argument("--timeout", type=float, default=540, help="seconds per target")
    parser.add_argument("--max-batch", type=int, default=4096,
                        help="cap on a model target's batch (the sanitizer slows kernels down)")
    parser.add_argument("--print-limit", type=int, default=1000,
                        help="reports printed per target (all are counted; kernels are named from the printed)")
    parser.add_argument("--out", default="sanitizer-results")
    args = parser.parse_args(argv)

    sanitizer = find_compute_sanitizer()
    if sanitizer is None:
        print("compute-sanitizer not found (set COMPUTE_SANITIZER, or put the CUDA toolkit's bin on PATH)",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(tool, t) for tool in (args.tool or TOOLS) for t in targets(args)]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda job: run_target(sanitizer, job[0], job[1], out, args.timeout,
                                                       args.max_batch, args.print_limit, args.select), jobs))
    for r in results:
        print(f"{r['tool']:9s} {r['target']:45s} errors={r['errors']} outcome={r['outcome']} {r['seconds']}s",
              file=sys.stderr)
    totals = write_summary(out, results)
    bad = any(t["errors"] or t["incomplete"] for tool, t in totals.items() if tool == "memcheck")
    bad = bad or any(t["dnnbind"] for tool, t in totals.items() if tool == "racecheck")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Python-sandbox throughput: calls/s against a fresh interpreter per call, measured in the same run.

Measures (saved to results/bench/sandbox.json):
- baseline: ``subprocess.run([python, "-c", code])`` one call after another (no limits, no isolation
  beyond the process: the cheapest way to get a separate process per call);
- ``PythonSandbox.run`` one call after another (latency p50 / p95, calls/s);
- ``PythonSandbox.run_many`` over the pool (calls/s), memo off;
- an ES-like batch in which members repeat each other's code (``--repeat`` copies of each distinct
  code), with the memo on;
- CPU time per call (baseline: the children of this process; sandbox: the zygotes and their
  children), which depends much less on the machine's load than wall-clock rates.

The codes are short agent-style snippets (arithmetic and a print). Every number is a ratio against
the baseline measured in this run, because absolute timings depend on the machine and its load.

Before / after kernel isolation (issue 24), measured in the same run, in alternating rounds (the best
round of each counts, as the machine is shared): ``before`` is the sandbox of ``--before-ref`` (main's
``copes_lib/tools/sandbox.py`` and, from the split on, its worker's files, loaded from git), ``hook_only`` is this sandbox with
``layers='hook-only'`` (``allow_unconfined_files``), ``after`` is this sandbox with its default layers
(Landlock or the read-only view, seccomp, namespaces, private tmpfs, then the hook). The headline keys
(``sandbox_run_calls_per_s`` ...) are ``after``; ``after_vs_before_run`` and
``after_vs_before_run_many`` are the ratios a change's cost is judged by (the fail-closed sandbox with
its per-call "ready" report and iterative clean-up: within 10% of the sandbox before it, i.e. >= 0.9).

Also (issue 48) the seconds of one call that writes 2,000 small files where no private tmpfs bounds its
storage (``without='namespaces'``: the hook counts it), before and after.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_sandbox.py [--calls 300] [--workers 2]``
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from copes_lib import runs
from copes_lib.tools import CodeSandboxConfig, PythonSandbox


def agent_code(i: int) -> str:
    return f"price = {i} * 17 + 3\ntotal = price * 4 - {i % 7}\nprint(total // 3, total % 3)"


def expected_output(i: int) -> str:
    total = (i * 17 + 3) * 4 - i % 7
    return f"{total // 3} {total % 3}\n"


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its reaped children (utime + stime + cutime + cstime)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def bench_baseline(n: int) -> tuple[float, float]:
    """(calls/s, CPU ms per call) of a fresh interpreter per call."""
    cpu0, start = children_cpu_s(), time.perf_counter()
    for i in range(n):
        done = subprocess.run([sys.executable, "-c", agent_code(i)], capture_output=True, text=True, timeout=30)
        assert done.stdout == expected_output(i), done
    return n / (time.perf_counter() - start), 1000 * (children_cpu_s() - cpu0) / n


def load_before(ref: str):
    """The sandbox module of git ``ref`` (its worker's files live in a temp folder; PYTHONPATH finds copes_lib).
    From the split of issue 49 on, the host module imports its worker module, and the set-up script imports it
    and isolation.py as its siblings: the copies in the temp folder are imported by those sibling names."""
    def show(name: str) -> str | None:
        done = subprocess.run(["git", "show", f"{ref}:copes_lib/tools/{name}"], cwd=runs.REPO_ROOT,
                              capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else None

    folder = tempfile.mkdtemp(prefix="copes-bench-")
    source = show("sandbox.py")
    if source is None:
        raise SystemExit(f"--before-ref {ref}: it has no copes_lib/tools/sandbox.py")
    source = (source.replace("from copes_lib.tools import sandbox_worker as worker", "import sandbox_worker as worker")
              .replace("from copes_lib.tools.sandbox_worker import", "from sandbox_worker import"))
    path = os.path.join(folder, "sandbox_before.py")
    with open(path, "w") as handle:
        handle.write(source)
    # its zygote loads isolation.py from its own folder (refs before issue 24 have none); the worker's files
    for name in ("isolation.py", "sandbox_worker.py", "sandbox_setup.py"):
        text = show(name)
        if text is not None:
            with open(os.path.join(folder, name), "w") as handle:
                handle.write(text)
    sys.path.insert(0, folder)  # (the sibling imports of the split's host module)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(runs.REPO_ROOT), os.environ.get("PYTHONPATH")]))
    spec = importlib.util.spec_from_file_location("copes_sandbox_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module, folder


def bench_sandbox(make_box, calls: int, workers: int) -> dict:
    """Serial and pooled calls/s, latency and CPU per call of one sandbox implementation, memo off."""
    with make_box() as box:
        box.run_many([agent_code(i) for i in range(2 * workers)])  # warm up
        latencies = []
        cpu0 = sum(process_cpu_s(pid) for pid in box.worker_pids())
        start = time.perf_counter()
        for i in range(calls):
            t0 = time.perf_counter()
            result = box.run(agent_code(i))
            latencies.append(time.perf_counter() - t0)
            assert result.output == expected_output(i), result
        serial_cps = calls / (time.perf_counter() - start)
        cpu_ms = 1000 * (sum(process_cpu_s(pid) for pid in box.worker_pids()) - cpu0) / calls
        start = time.perf_counter()
        results = box.run_many([agent_code(i) for i in range(calls)])
        parallel_cps = calls / (time.perf_counter() - start)
        assert [r.output for r in results] == [expected_output(i) for i in range(calls)]
    latencies_ms = sorted(1000 * t for t in latencies)
    return {"run_calls_per_s": serial_cps, "run_many_calls_per_s": parallel_cps, "cpu_ms_per_call": cpu_ms,
            "latency_ms_p50": statistics.median(latencies_ms),
            "latency_ms_p95": latencies_ms[int(0.95 * (len(latencies_ms) - 1))]}


QUOTA_FILES = 2000
QUOTA_CODE = f"for i in range({QUOTA_FILES}):\n    open(f'f{{i}}', 'w').write('x')\nprint('made')"


def bench_quota(make_box) -> float:
    """Seconds of one call that writes QUOTA_FILES small files where no private tmpfs bounds the storage
    (the hook counts it): the cost of the hook's quota accounting (issue 48: 13.2 s at 0984fea)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the missing namespaces are warned about)
        with make_box() as box:
            result = box.run(QUOTA_CODE)
    assert result.ok and result.output == "made\n", result
    return result.elapsed_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="sandbox calls per measurement")
    parser.add_argument("--baseline-calls", type=int, default=40, help="subprocess calls for the baseline")
    parser.add_argument("--workers", type=int, default=2, help="sandbox workers (CodeSandboxConfig.workers)")
    parser.add_argument("--repeat", type=int, default=8, help="copies of each code in the ES-like batch")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of before / hook_only / after")
    parser.add_argument("--before-ref", default="main", help="git ref whose sandbox is 'before'")
    args = parser.parse_args()

    baseline_cps, baseline_cpu_ms = bench_baseline(args.baseline_calls)

    before, folder = load_before(args.before_ref)
    makers = {
        "before": lambda: before.PythonSandbox(before.CodeSandboxConfig(workers=args.workers, memo_size=0)),
        "hook_only": lambda: PythonSandbox(CodeSandboxConfig(workers=args.workers, memo_size=0, layers="hook-only",
                                                             allow_unconfined_files=True)),
        "after": lambda: PythonSandbox(CodeSandboxConfig(workers=args.workers, memo_size=0)),
    }
    rounds = {name: [] for name in makers}
    for _ in range(args.rounds):
        for name, make in makers.items():
            rounds[name].append(bench_sandbox(make, args.calls, args.workers))
    best = {name: {key: (min if key.startswith(("cpu", "latency")) else max)(r[key] for r in rs) for key in rs[0]}
            for name, rs in rounds.items()}
    quota_s = {
        "before": bench_quota(lambda: before.PythonSandbox(before.CodeSandboxConfig(
            workers=1, memo_size=0, timeout_s=60.0, without="namespaces"))),
        "after": bench_quota(lambda: PythonSandbox(CodeSandboxConfig(workers=1, memo_size=0, timeout_s=60.0,
                                                                     without="namespaces"))),
    }
    with PythonSandbox(CodeSandboxConfig(workers=1)) as box:
        layers = box.describe_layers()
    serial_cps, parallel_cps = best["after"]["run_calls_per_s"], best["after"]["run_many_calls_per_s"]
    sandbox_cpu_ms = best["after"]["cpu_ms_per_call"]

    distinct = max(1, args.calls // args.repeat)
    batch = [agent_code(i % distinct) for i in range(distinct * args.repeat)]
    with PythonSandbox(CodeSandboxConfig(workers=args.workers, memo_size=4096)) as box:
        box.run_many([agent_code(-1 - i) for i in range(2 * args.workers)])  # warm up, other codes
        start = time.perf_counter()
        results = box.run_many(batch)
        memo_cps = len(batch) / (time.perf_counter() - start)
        hit_rate = sum(r.cached for r in results) / len(results)
        assert [r.output for r in results] == [expected_output(i % distinct) for i in range(len(batch))]

    record = {
        "baseline_subprocess_calls_per_s": baseline_cps,
        "sandbox_run_calls_per_s": serial_cps,
        "sandbox_run_many_calls_per_s": parallel_cps,
        "sandbox_run_many_memo_calls_per_s": memo_cps,
        "memo_hit_rate": hit_rate,
        "speedup_run_vs_baseline": serial_cps / baseline_cps,
        "speedup_run_many_vs_baseline": parallel_cps / baseline_cps,
        "speedup_run_many_memo_vs_baseline": memo_cps / baseline_cps,
        "baseline_cpu_ms_per_call": baseline_cpu_ms,
        "sandbox_cpu_ms_per_call": sandbox_cpu_ms,
        "cpu_ratio_baseline_vs_sandbox": baseline_cpu_ms / sandbox_cpu_ms,
        "run_latency_ms_p50": best["after"]["latency_ms_p50"],
        "run_latency_ms_p95": best["after"]["latency_ms_p95"],
        "before": best["before"], "hook_only": best["hook_only"], "after": best["after"],
        "rounds": rounds, "before_ref": args.before_ref, "after_layers": layers,
        "after_vs_before_run": serial_cps / best["before"]["run_calls_per_s"],
        "after_vs_before_run_many": parallel_cps / best["before"]["run_many_calls_per_s"],
        "after_vs_before_cpu": sandbox_cpu_ms / best["before"]["cpu_ms_per_call"],
        "quota_files": QUOTA_FILES, "quota_files_s_before": quota_s["before"], "quota_files_s_after": quota_s["after"],
        "calls": args.calls,
        "baseline_calls": args.baseline_calls,
        "workers": args.workers,
        "repeat": args.repeat,
        "load_average_1min": os.getloadavg()[0],
        "device": runs.device_info(),
        **runs.git_state(),
    }
    shutil.rmtree(folder, ignore_errors=True)
    path = runs.RESULTS_ROOT / "bench" / "sandbox.json"
    runs.atomic_write_json(path, record)
    for key, value in record.items():
        if isinstance(value, float):
            print(f"{key:40s} {value:10.2f}")
    print(f"saved {path}")


if __name__ == "__main__":
    main()

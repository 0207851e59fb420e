"""Test-wide environment: nothing from a model hub, few threads (2 cores are shared), quiet kernels.

Set at import, before any test imports torch, so the papermill kernels that tests start inherit it.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugger warning
os.environ.setdefault("JUPYTER_PREFER_ENV_PATH", "1")  # the venv's python3 kernel, not a user one
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _slow_cost(item) -> float | None:
    """A slow test's cost from ``@pytest.mark.slow(cost=seconds)``: its rough wall seconds in `make test` on a
    2-core machine; 0 for a slow test without one, None for a test without the mark."""
    marker = item.get_closest_marker("slow")
    return None if marker is None else float(marker.kwargs.get("cost", 0))


def _first_split(n_items: int, workers: int) -> list[int]:
    """The sizes of the parts `--dist worksteal` first hands out: each idle worker in turn gets
    ``len(pending) // workers left`` of the items, in collection order (xdist/scheduler/worksteal.py)."""
    sizes, left = [], n_items
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


def pytest_collection_modifyitems(config, items):
    """The slow tests at the heads of the parts that `make test`'s `-n 2 --dist worksteal` first hands to its
    workers: those with a cost spread so that each worker's slow work is about the same (longest first, each
    to the part with the least so far); those without one after the costliest (the smoke run of every
    notebook), in its part, in collection order: they read the smoke base its notebook 01 builds (e.g.
    tests/test_preflight.py), which is cached by then instead of trained a second time at once.

    Worksteal gives each worker one contiguous part of the collection and steals only from the tail of a
    busy worker's queue, so a test at the head of a part starts at once and stays there. (With every slow
    test at the head of the first part, one worker ran the smoke run and the gpu profile back to back, ~12 of
    the run's ~13 min.) Without xdist: the slow tests first, costliest first."""
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    costed = sorted((item for item in items if _slow_cost(item)), key=_slow_cost, reverse=True)
    after = [item for item in items if _slow_cost(item) == 0]
    fast = [item for item in items if _slow_cost(item) is None]
    sizes = _first_split(len(items), workers)
    heads, loads = [[] for _ in sizes], [0.0] * len(sizes)
    for item in costed:  # longest processing time first, to the part with the least slow work so far
        part = min(range(len(sizes)), key=lambda i: (len(heads[i]) >= sizes[i], loads[i]))
        heads[part].append(item)
        loads[part] += _slow_cost(item)
    heads[0 if not costed else next(i for i, head in enumerate(heads) if costed[0] in head)][1:1] = after
    ordered, rest = [], iter(fast)
    for head, size in zip(heads, sizes):
        ordered += head + [next(rest) for _ in range(max(0, size - len(head)))]
    ordered += list(rest)
    assert len(ordered) == len(items) and {id(i) for i in ordered} == {id(i) for i in items}
    items[:] = ordered

"""Run folders, manifests, atomic writes, caching and checkpoints.

Layout (docs/suite_design.md#d4-results-contract)::

    results/<profile>/<NN_topic>/summary.json    flat JSON, numbers as numbers
                                 metrics.jsonl   one object per step, fixed namespaces
                                 config.json     the resolved parameters
                                 manifest.json   git sha + dirty flag, versions, device, threads, seeds, times
    figures/<profile>/<NN>_<what>.png (+ .svg)
    cache/<profile>/<name>-<key>/                reusable work (checkpoints, trained substrates)

A run writes into ``results/<profile>/<NN_topic>/.partial/`` and only :meth:`Run.finish` moves the
files into place (one process at a time: :class:`Run` holds a lock, so a notebook run from
JupyterLab and the same notebook in ``make reproduce`` cannot share the folder; the lock is
``results/<profile>/.<NN_topic>.lock``), each with an atomic rename, so a run that fails or is interrupted keeps the
previous good results. Figures are staged the same way (``figures/<profile>/.partial/<NN_topic>/``) and
land beside the results in :meth:`Run.finish`, so a failed rerun leaves the previous figures too.
Every file is written to a temporary name and renamed, so a crash never leaves a truncated file.

A cache entry that cannot be read (a truncated ``torch``/``safetensors``/JSON file, from a disk that
filled up or a copy that was cut short) is reported with its path and the command that rebuilds it,
deleted so that it is never reused, and rebuilt by the caller (:func:`load_cache_entry`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import math
import os
import pickle
import platform
import re
import shutil
import subprocess
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable, Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from copes_lib import __version__, threads
from copes_lib.config import REPO_ROOT, Config

#: Moves every tree a run writes (results/, figures/, reports/, cache/) under this folder when set: the test
#: suite points it at a per-session temporary folder (tests/conftest.py), so that tests, the notebook kernels and
#: the worker processes they start (all inherit it) never touch the checkout's outputs or race each other there.
OUTPUT_ROOT_VARIABLE = "COPES_OUTPUT_ROOT"
#: Moves cache/ alone (wins over COPES_OUTPUT_ROOT for the cache).
CACHE_ROOT_VARIABLE = "COPES_CACHE_ROOT"


def _root(name: str, variable: str | None = None) -> Path:
    """``REPO_ROOT/<name>``, or under the folder an environment variable names (read once, at import)."""
    for var in (variable, OUTPUT_ROOT_VARIABLE):
        if var and os.environ.get(var):
            base = Path(os.environ[var]).expanduser().resolve()
            return base if var == variable else base / name
    return REPO_ROOT / name


RESULTS_ROOT = _root("results")
FIGURES_ROOT = _root("figures")
REPORTS_ROOT = _root("reports")
CACHE_ROOT = _root("cache", CACHE_ROOT_VARIABLE)

TRACKED_PACKAGES = ("torch", "transformers", "tokenizers", "peft", "numpy", "scipy", "bm25s",
                    "math-verify", "ray", "papermill", "cma")


# --------------------------------------------------------------------------- atomic writes
_UMASK = os.umask(0o022)  # read the process umask (os.umask can only read it by setting it) ...
os.umask(_UMASK)  # ... and put it back at once
def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file 0600; give it the mode a plain open() would (reports are shared).
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # a full disk, a read-only folder: say which file could not be written
        Path(tmp).unlink(missing_ok=True)
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise OSError(exc.errno, f"could not write {path}: {reason} (the previous file, if any, is kept)",
                      str(path)) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Config):
        return obj.to_dict()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def atomic_write_json(path: str | Path, obj: Any, sort_keys: bool = True) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=sort_keys, default=_json_default) + "\n")


class UnreadableFileError(ValueError):
    """A stored file cannot be read (empty, truncated, not JSON); the message names the file."""

    def __init__(self, path: str | Path, message: str):
        super().__init__(message)
        self.path = Path(path)


def read_json(path: str | Path) -> Any:
    """The JSON in ``path``; an empty or garbled file raises :class:`UnreadableFileError` naming it (raised
    from the decoder's error, so :func:`is_corruption` still sees a damaged file)."""
    path = Path(path)
    text = path.read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        what = "is empty (0 bytes)" if not text else f"is not valid JSON ({len(text.encode())} bytes)"
        raise UnreadableFileError(path, f"{path} {what}: JSONDecodeError: {exc}") from exc


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """``torch.save`` through a temporary file and an atomic rename."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return atomic_write_bytes(path, buffer.getvalue())


# --------------------------------------------------------------------------- provenance
OUTPUT_PATHS = ("results", "figures", "reports", "README.md", "docs/results.md")


def git_state() -> dict[str, Any]:
    """The repository's HEAD sha and whether the work tree differs from it ("unknown" outside git).

    The suite's own outputs (results/, figures/, reports/ and the generated claims tables of the README and docs/results.md) do
    not count as dirty: a full `make reproduce` rewrites them while it runs, and the later notebooks of
    that run still come from the committed code."""
    def _git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    try:
        sha = _git("rev-parse", "HEAD") or "unknown"
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".",
                          *(f":(exclude){path}" for path in OUTPUT_PATHS)))
    except (OSError, subprocess.SubprocessError):
        sha, dirty = "unknown", False
    return {"git_sha": sha, "git_dirty": dirty}


def package_versions(names: Iterable[str] = TRACKED_PACKAGES) -> dict[str, str]:
    """Installed versions; torch's with its build tag (``2.13.0+cpu``, ``2.13.0+cu130``): the metadata of
    PyPI's CUDA build says plain ``2.13.0``, so the tag comes from ``torch.__version__``."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    if "torch" in versions and versions["torch"] != "not installed":
        try:
            import torch

            versions["torch"] = str(torch.__version__)
        except ImportError:
            pass
    return versions


def device_info() -> dict[str, Any]:
    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version(),
                            "cpu_count": os.cpu_count()}
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        info["torch_cuda_build"] = torch.version.cuda  # None: a CPU build
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    from copes_lib.tools import isolation  # the Python sandbox's isolation layers on this host

    info["sandbox_layers"] = isolation.describe(isolation.host_layers())
    return info


def check_device(device: Any, name: str = "device") -> str:
    """``device`` if this machine has it, else a ConfigError naming the parameter ``name`` and the valid
    values here (instead of torch's ``AttributeError ... _cuda_resetPeakMemoryStats`` on a CPU build)."""
    import torch

    from copes_lib.config import ConfigError

    valid = ["cpu"] + (["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
                       if torch.cuda.is_available() else [])
    kind = str(device).split(":")[0]
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"{name} = {device!r} is not valid; valid values: {valid}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{name} = {device!r} but this machine has no CUDA device (torch {torch.__version__}, "
                          f"torch.cuda.is_available() is False); valid values here: {valid}")
    if kind == "cuda" and str(device) not in valid:
        raise ConfigError(f"{name} = {device!r} is not a device of this machine; valid values: {valid}")
    return str(device)


def peak_memory_gib(device: Any = "cpu") -> float:
    """Peak accelerator memory allocated (CUDA) or peak resident set size of this process (CPU), GiB.

    On CPU the peak RSS only grows over a process's life: compare runs made in separate processes.
    """
    import resource
    import sys

    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2**30 if sys.platform == "darwin" else 2**20)


# --------------------------------------------------------------------------- cache keys
def cache_key(config: Any, data_ids: Iterable[Any] | None = None, version: str = __version__) -> str:
    """A short hash of (config, data ids, library version): equal keys mean reusable work."""
    payload = {
        "config": config.to_dict() if isinstance(config, Config) else config,
        "data_ids": list(data_ids) if data_ids is not None else None,
        "library_version": version,
    }
    blob = json.dumps(payload, sort_keys=True, default=_json_default).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cache_dir(profile: str, name: str, key: str) -> Path:
    """``cache/<profile>/<name>-<key>/`` (created). A JSON file at its top level that cannot be read (a
    truncated ``history.json``) is reported and deleted here (:func:`check_json_files`), so its rebuild is
    announced, never silent."""
    path = CACHE_ROOT / profile / f"{name}-{key}"
    if path.is_dir():
        check_json_files(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_json_files(folder: str | Path, *, rebuild: str | None = None) -> list[Path]:
    """Parse every ``*.json`` at the top of ``folder``; each that cannot be read is reported (a
    :class:`CorruptCacheWarning` naming it and the command that rebuilds it) and deleted, so that the
    caller rebuilds it. Returns the deleted files."""
    damaged = []
    for file in sorted(Path(folder).glob("*.json")):
        load_cache_entry(file, lambda file=file: read_json(file), rebuild=rebuild)
        if not file.exists():
            damaged.append(file)
    return damaged


class CorruptCacheWarning(UserWarning):
    """A cache entry could not be read; it was deleted and is being rebuilt."""


class CorruptCacheError(RuntimeError):
    """A stored file that cannot be rebuilt here could not be read (the message says what to run)."""


# What torch.load, safetensors, json and tokenizers say about a truncated or garbled file.
_CORRUPTION_TEXT = re.compile(
    r"zip archive|central directory|incomplete metadata|header too (?:large|small)|safetensor|"
    r"unexpected EOF|EOF while parsing|Expecting (?:value|property name|',' delimiter)|Unterminated string|"
    r"Extra data|invalid load key|truncated|corrupt|Error while deserializing|could not parse|failed reading",
    re.IGNORECASE)


def is_corruption(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) says a stored file is truncated or garbled."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (EOFError, json.JSONDecodeError, UnicodeDecodeError, pickle.UnpicklingError,
                            zipfile.BadZipFile)):
            return True
        if _CORRUPTION_TEXT.search(f"{type(exc).__name__}: {exc}"):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def rebuild_command(profile: str, notebook: str) -> str:
    """The command that recomputes what ``notebook`` caches under ``profile``.

    >>> rebuild_command("cpu", "01_substrate_and_agent")
    'make reproduce PROFILE=cpu ONLY=01 FORCE=1'
    """
    return f"make reproduce PROFILE={profile} ONLY={notebook.split('_', 1)[0]} FORCE=1"


def _default_rebuild(entry: Path) -> str:
    """A rebuild hint when the caller gives none: the profile comes from the cache path, the notebook
    from the run open in this process, if any."""
    try:
        profile = Path(entry).resolve().relative_to(Path(CACHE_ROOT).resolve()).parts[0]
    except (ValueError, IndexError):
        profile = "<profile>"
    notebook = next(reversed(_OPEN_RUNS), None)
    command = (rebuild_command(profile, notebook[1]) if notebook
               else f"make reproduce PROFILE={profile} ONLY=<the notebook that wrote it> FORCE=1")
    return f"{command} (or delete {entry})"


def _discard(entry: Path) -> None:
    if entry.is_dir():
        shutil.rmtree(entry)
        entry.mkdir(parents=True)  # the caller rebuilds into the same folder
    else:
        entry.unlink(missing_ok=True)


def load_cache_entry(entry: str | Path, load: Callable[[], Any], *, rebuild: str | None = None) -> Any | None:
    """``load()`` the cache entry ``entry`` (a file, or a folder of files), or None when it cannot be read.

    A truncated or corrupted entry is reported (a :class:`CorruptCacheWarning` naming the entry, the
    error and ``rebuild``, the command that rebuilds it), deleted so that it is never reused, and None
    tells the caller to rebuild it. Errors that do not look like a damaged file propagate unchanged.
    """
    entry = Path(entry)
    try:
        return load()
    except Exception as exc:  # noqa: BLE001 - re-raised below unless it is a damaged file
        if not is_corruption(exc):
            raise
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        warnings.warn(
            f"corrupted cache entry {entry} ({type(exc).__name__}: {first}); it was deleted and is rebuilt "
            f"now. To rebuild it yourself: {rebuild or _default_rebuild(entry)}",
            CorruptCacheWarning, stacklevel=2)
        _discard(entry)
        return None


def cached(
    path: str | Path,
    compute: Callable[[], Any],
    *,
    force: bool = False,
    save: Callable[[Any, Path], Any] | None = None,
    load: Callable[[Path], Any] | None = None,
    rebuild: str | None = None,
) -> Any:
    """Return the object stored at ``path``, or compute it, store it atomically and return it.

    ``save``/``load`` default to JSON; pass ``atomic_torch_save`` / ``torch.load`` for tensors. A stored
    file that cannot be read is reported (with ``rebuild``, the command that recomputes it) and
    recomputed (:func:`load_cache_entry`).
    """
    path = Path(path)
    save = save or (lambda obj, p: atomic_write_json(p, obj))
    load = load or read_json
    if path.exists() and not force:
        loaded = load_cache_entry(path, lambda: load(path), rebuild=rebuild)
        if loaded is not None:
            return loaded
    obj = compute()
    save(obj, path)
    return obj


# --------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Atomically save a training state (model/optimizer state dicts, step, RNG states, ...)."""
    return atomic_torch_save(state, path)


def load_checkpoint(path: str | Path, map_location: str = "cpu", *, required: bool = False,
                    rebuild: str | None = None, key: str | None = None, reset: Sequence[str | Path] = ()) -> Any:
    """The state saved at ``path``, or None if there is none (a fresh start).

    A damaged file is reported and deleted (:func:`load_cache_entry`): a resumed run then starts
    afresh. With ``required=True`` (the weights of a finished run) a missing, damaged or incomplete
    file (``key`` absent) is deleted together with the files ``reset`` (what marks its cache entry
    finished, so that the entry is rebuilt on its next use), and :class:`CorruptCacheError` names the
    file, what was reset and ``rebuild``. With ``key``, returns ``state[key]``.
    """
    import torch

    path = Path(path)
    if not required:
        state = None
        if path.exists():
            state = load_cache_entry(path, lambda: torch.load(path, map_location=map_location, weights_only=False),
                                     rebuild=rebuild)
        return state if key is None or state is None else state[key]
    problem = "is missing"
    if path.exists():
        try:
            state = torch.load(path, map_location=map_location, weights_only=False)
        except Exception as exc:  # noqa: BLE001 - re-raised below unless it is a damaged file
            if not is_corruption(exc):
                raise
            problem = f"is damaged ({type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]})"
        else:
            if key is None:
                return state
            if isinstance(state, dict) and key in state:
                return state[key]
            problem = f"holds no {key!r} (an incomplete or foreign file)"
    removed = [p for p in [path, *map(Path, reset)] if p.exists()]
    for p in removed:
        _discard(p)
    what = f"; deleted {', '.join(str(p) for p in removed)}" if removed else ""
    hint = f"so the entry is no longer finished: {rebuild}" if reset else f"rebuild it with {rebuild or _default_rebuild(path)}"
    raise CorruptCacheError(f"{path} {problem}{what}; {hint}")


# --------------------------------------------------------------------------- summaries
def _plain(value: Any) -> Any:
    """numpy / torch scalars as Python numbers (so a displayed summary reads ``0.5``, not ``np.float64(0.5)``)."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if type(value) not in (bool, int, float, str) and hasattr(value, "item"):  # np.float64 is a float
        return value.item()
    return value


def check_summary(summary: dict[str, Any]) -> None:
    """A summary is flat: str keys; values are finite numbers, bools, strings or None."""
    for key, value in summary.items():
        if not isinstance(key, str):
            raise ValueError(f"summary key {key!r} must be a string")
        if isinstance(value, bool) or value is None or isinstance(value, str):
            continue
        if isinstance(value, (int, float)):
            if not math.isfinite(value):
                raise ValueError(f"summary[{key!r}] = {value!r} is not finite")
            continue
        if isinstance(value, list) and all(isinstance(v, (int, float, str)) for v in value):
            continue  # e.g. "seeds": [0, 1, 2]
        raise ValueError(f"summary[{key!r}] has type {type(value).__name__}; summaries are flat")


# notebook -> (wall clock, perf_counter) of its first cell in this process (mark_notebook_start).
def run_commands(commands: Sequence[tuple[Any, Sequence[str], Path]], jobs: int, *,
                 cwd: str | Path = REPO_ROOT) -> list[tuple[Any, int, Path, float]]:
    """Run each ``(label, argv, log)`` as its own process, ``jobs`` at a time, each one's output (stdout and
    stderr) in its ``log``; returns ``(label, exit status, log, seconds)`` in the order given, after every
    command has ended (a failure does not stop the others: the caller decides what a failure means).
    The one place the suite runs worker processes side by side (the preflight's pairs, notebook 01's bases)."""
    from concurrent.futures import ThreadPoolExecutor

    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs = {jobs!r}: an integer >= 1 expected (processes at once)")

    def run(item: tuple[Any, Sequence[str], Path]) -> tuple[Any, int, Path, float]:
        label, argv, log = item
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with open(log, "w") as sink:
            status = subprocess.run(list(argv), cwd=cwd, stdout=sink, stderr=subprocess.STDOUT).returncode
        return label, status, Path(log), time.perf_counter() - started

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run, commands))


_NOTEBOOK_START: dict[str, tuple[_dt.datetime, float]] = {}


def mark_notebook_start(notebook: str) -> None:
    """Record that ``notebook`` starts now (its first cell after the parameters: ``load_params``); the
    :class:`Run` of that notebook in this process then reports ``started`` / ``wall_time_s`` from here to
    the end of :meth:`Run.finish`, i.e. the notebook's whole execution, not only its last cell. Calling
    it again (a notebook run again in the same kernel) restarts the clock."""
    _NOTEBOOK_START[notebook] = (_dt.datetime.now(_dt.UTC), time.perf_counter())


# (profile, notebook) of the runs open in this process, oldest first (names the notebook in cache messages).
_OPEN_RUNS: dict[tuple[str, str], None] = {}
# lock file -> its descriptor: the notebook folders this process holds (notebook_lock, Run.__init__).
_HELD: dict[Path, int] = {}


def write_lock_holder(fd: int) -> None:
    """Write who holds a lock (pid, host, start time, command) into its file ``fd``, for the one refused."""
    import shlex
    import socket
    import sys

    holder = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
              "command": shlex.join([os.path.basename(sys.executable), *sys.orig_argv[1:]])[:300]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)


def lock_holder(path: Path) -> str:
    """Who holds the lock at ``path``, from what :func:`write_lock_holder` wrote into it."""
    try:
        info = json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "a process that has not written its name yet"
    return (f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}, "
            f"command: {info.get('command')}")


def notebook_lock(folder: Path) -> Path:
    """The lock file of a notebook's results folder: ``results/<profile>/.<NN_topic>.lock``, beside the folder
    (never inside it: the folder holds exactly the results contract)."""
    return Path(folder).parent / f".{Path(folder).name}.lock"


class FolderBusyError(RuntimeError):
    """Another process is running the same notebook under the same profile (the message names it)."""


def hold_notebook_folder(folder: Path, what: str) -> None:
    """Hold :func:`notebook_lock` of ``folder`` (``fcntl.flock``, exclusive) until this process ends or :func:`release_notebook_folder`:
    one process writes a notebook's results at a time. Held already by this process (the notebook run again in the
    same Jupyter kernel): nothing to do. Held by another: :class:`FolderBusyError` naming it. The kernel drops the
    lock of a process that dies, so a killed kernel never blocks the next run."""
    path = notebook_lock(folder)
    if path in _HELD:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = lock_holder(path)
        os.close(fd)
        raise FolderBusyError(f"{what} is being run by another process ({holder}) into {path.parent}/: two runs "
                              "would write the same .partial/ folder. Let it finish, or stop it (a Jupyter kernel: "
                              "shut it down or restart it), then run again") from None
    write_lock_holder(fd)
    _HELD[path] = fd


def release_notebook_folder(folder: Path) -> None:
    """Release what :func:`hold_notebook_folder` holds for ``folder`` (nothing when it holds nothing)."""
    fd = _HELD.pop(notebook_lock(folder), None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)


def notebook_folder_in_use(folder: Path) -> bool:
    """Whether another process holds ``folder``'s lock now (a run of that notebook is in progress)."""
    path = notebook_lock(folder)
    if path in _HELD or not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the lock taken to ask


# (profile, notebook) -> {final figure path: staged file}: figures saved in this process, awaiting finish.
_STAGED_FIGURES: dict[tuple[str, str], dict[Path, Path]] = {}


class Run:
    """One execution of one notebook under one profile.

    Its files (and the figures :func:`save_figure` stages for the same notebook) become visible only
    when :meth:`finish` succeeds.

    >>> run = Run("smoke", "00_suite_overview", config={"SEED": 0}, seeds=[0])  # doctest: +SKIP
    >>> run.log(0, {"reward/mean": 0.1})                                           # doctest: +SKIP
    >>> run.finish({"val_accuracy": 0.5})                                          # doctest: +SKIP
    """

    def __init__(self, profile: str, notebook: str, config: Any, seeds: Iterable[int] = (),
                 root: str | Path | None = None):
        self.profile, self.notebook = profile, notebook
        self.config = config.to_dict() if isinstance(config, Config) else dict(config)
        self.seeds = list(seeds)
        threads.fix_threads()  # the same arithmetic on any core count (copes_lib/threads.py)
        if problems := threads.kernel_pin_problems():  # recorded in the manifest by thread_info()
            threads.warn_kernel_pin(problems)  # on the terminal too, not only in the notebook
        self.dir = Path(root or RESULTS_ROOT) / profile / notebook
        self.partial = self.dir / ".partial"
        hold_notebook_folder(self.dir, f"{notebook} under profile {profile}")  # before touching .partial/
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir(parents=True)
        # from the notebook's first cell when load_params marked it, else from here (a Run made by a script)
        self.started, self._t0 = _NOTEBOOK_START.get(notebook, (_dt.datetime.now(_dt.UTC), time.perf_counter()))
        self.wall_time_from = "notebook start (load_params)" if notebook in _NOTEBOOK_START else "Run created"
        self._metrics = open(self.partial / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        _OPEN_RUNS[(profile, notebook)] = None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one step's metrics (namespaced keys such as ``reward/mean``) to metrics.jsonl."""
        row = {"step": step, **metrics}
        self._metrics.write(json.dumps(row, default=_json_default) + "\n")
        self._metrics.flush()

    def log_rows(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self._metrics.write(json.dumps(row, default=_json_default) + "\n")
        self._metrics.flush()

    def finish(self, summary: dict[str, Any], extra_manifest: dict[str, Any] | None = None) -> dict[str, Any]:
        """Check and write summary/config/manifest, then move every file into place atomically."""
        self._metrics.close()
        full = {
            "profile": self.profile,
            "notebook": self.notebook,
            "seeds": self.seeds,
            "library_version": __version__,
            **git_state(),
            **{key: _plain(value) for key, value in summary.items()},
        }
        check_summary(full)
        ended = _dt.datetime.now(_dt.UTC)
        manifest = {
            "profile": self.profile,
            "notebook": self.notebook,
            "config": self.config,
            "seeds": self.seeds,
            "library_version": __version__,
            **git_state(),
            "packages": package_versions(),
            "device": device_info(),
            "threads": threads.thread_info(),
            "started": self.started.isoformat(),
            "ended": ended.isoformat(),
            "wall_time_s": time.perf_counter() - self._t0,
            "wall_time_from": self.wall_time_from,
            **(extra_manifest or {}),
        }
        atomic_write_json(self.partial / "config.json", self.config)
        atomic_write_json(self.partial / "manifest.json", manifest)
        # In the notebook's own key order: the first keys are the headline numbers of reports/index.html.
        atomic_write_json(self.partial / "summary.json", full, sort_keys=False)
        publish_figures(self.profile, self.notebook)
        # summary.json last: its presence marks a complete run.
        for name in ("metrics.jsonl", "config.json", "manifest.json", "summary.json"):
            os.replace(self.partial / name, self.dir / name)
        for extra in sorted(self.partial.iterdir()):
            os.replace(extra, self.dir / extra.name)
        self.partial.rmdir()
        _OPEN_RUNS.pop((self.profile, self.notebook), None)
        release_notebook_folder(self.dir)
        return full

    def write_table(self, name: str, frame: Any) -> Path:
        """Stage a table (a pandas DataFrame) as CSV; it lands beside summary.json on finish."""
        return atomic_write_text(self.partial / name, frame.to_csv(index=False))


def load_summary(profile: str, notebook: str, root: str | Path | None = None) -> dict[str, Any] | None:
    """A notebook's summary, or None if it has none; an unreadable one raises :class:`UnreadableFileError`
    naming it and what to do (rerun that notebook, or delete the file to drop its results)."""
    path = Path(root or RESULTS_ROOT) / profile / notebook / "summary.json"
    if not path.exists():
        return None
    try:
        return read_json(path)
    except UnreadableFileError as exc:
        raise UnreadableFileError(path, f"{exc}; rerun that notebook (make reproduce PROFILE={profile} "
                                        f"ONLY={notebook.split('_', 1)[0]}) or delete {path}") from exc


def figure_path(profile: str, notebook: str, what: str, suffix: str = "png") -> Path:
    """``figures/<profile>/<NN>_<what>.<suffix>`` (folder created)."""
    number = notebook.split("_", 1)[0]
    path = FIGURES_ROOT / profile / f"{number}_{what}.{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _figure_staging(profile: str, notebook: str) -> Path:
    return FIGURES_ROOT / profile / ".partial" / notebook


def save_figure(fig: Any, profile: str, notebook: str, what: str) -> list[Path]:
    """Stage a matplotlib figure as PNG and SVG; they land in ``figures/<profile>/`` when the notebook's
    :meth:`Run.finish` succeeds, with its results (a failed rerun leaves the previous figures).

    Returns the final paths (which exist once the run has finished). Saving the same ``what`` again
    before finish replaces the staged file.
    """
    import io

    staged = _STAGED_FIGURES.setdefault((profile, notebook), {})
    paths = []
    for suffix in ("png", "svg"):
        buffer = io.BytesIO()
        fig.savefig(buffer, format=suffix, dpi=120, bbox_inches="tight")
        final = figure_path(profile, notebook, what, suffix)
        staged[final] = atomic_write_bytes(_figure_staging(profile, notebook) / final.name, buffer.getvalue())
        paths.append(final)
    return paths


def publish_figures(profile: str, notebook: str) -> list[Path]:
    """Move the figures staged in this process for ``notebook`` into ``figures/<profile>/`` (each an
    atomic rename) and clear its staging folder, including leftovers of runs that failed."""
    moved = []
    for final, staged in sorted(_STAGED_FIGURES.pop((profile, notebook), {}).items()):
        if staged.exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, final)
            moved.append(final)
    shutil.rmtree(_figure_staging(profile, notebook), ignore_errors=True)
    with contextlib.suppress(OSError):  # the shared .partial folder goes once no notebook uses it
        _figure_staging(profile, notebook).parent.rmdir()
    return moved


# --------------------------------------------------------------------------- progress
def progress(iterable: Iterable[Any] | None = None, desc: str = "", total: int | None = None, **kw: Any):
    """tqdm.auto with a minimum refresh interval, so papermill's ``--log-output`` stays readable."""
    with warnings.catch_warnings():
        # Without ipywidgets tqdm.auto falls back to the text bar, after a TqdmWarning ("IProgress not
        # found") in every notebook: the text bar is what papermill's log shows anyway.
        warnings.filterwarnings("ignore", message="IProgress not found")
        from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, mininterval=kw.pop("mininterval", 10.0),
                miniters=kw.pop("miniters", 1), **kw)


def summary_line(prefix: str, step: int, metrics: dict[str, Any]) -> str:
    """One readable line (``[es] step 8 reward/mean=0.412 eval/val_accuracy=0.455``), printed and returned."""
    parts = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()]
    line = f"[{prefix}] step {step} " + " ".join(parts)
    print(line, flush=True)
    return line

"""The sandbox's attack catalogue (tests/sandbox_attacks.py) run again as a throwaway non-root user,
which is what most researchers' hosts are: children then run as the host's own user, and only the
sandbox's layers -- not file permissions or the uid drop -- keep them off the host's files.

As root, the test creates the user with ``useradd`` and removes it afterwards; it skips with the reason
where it cannot (no useradd, or the user cannot read the venv or the repo). Run as non-root, it skips:
tests/test_sandbox.py then already runs every attack unprivileged."""

import fcntl
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from copes_lib.tools import isolation
from tests import sandbox_attacks as attacks

REPO = Path(__file__).resolve().parent.parent
# (layers, CodeSandboxConfig.without): the last three simulate hosts without Landlock / user namespaces /
# both (that one with the opt-in allow_unconfined_files, as it refuses otherwise)
LAYERS = ("auto", "hook-only", "kernel-only", "auto:landlock", "auto:namespaces", "auto:landlock,namespaces")
NAMES = list(attacks.catalogue("SITE"))
# issue 48: the hook switched off (layers='kernel-only') on this host and on simulated hosts without
# Landlock (the read-only view) or without namespaces: one call against the others and the host's settings
CROSS = ("", "landlock", "namespaces")


def _run_as(user: pwd.struct_passwd, argv: list[str], timeout_s: float = 300) -> subprocess.CompletedProcess:
    env = {"PATH": os.defpath, "PYTHONPATH": str(REPO), "HOME": "/nonexistent", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "LC_ALL": "C.UTF-8"}
    return subprocess.run(argv, user=user.pw_uid, group=user.pw_gid, extra_groups=[], env=env, cwd="/",
                          capture_output=True, text=True, timeout=timeout_s)


def _processes_of(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            line = next((x for x in status.splitlines() if x.startswith("Uid:")), "")
            if line and int(line.split()[1]) == uid:
                found.append(int(entry.name))
    return found


def _owned_leftovers(uid: int) -> list[str]:
    left = []
    for folder, prefixes in (("/dev/shm", ("copes-sandbox-",)), ("/tmp", ("copes-site-", "copes-probe-"))):
        for entry in Path(folder).iterdir():
            if entry.name.startswith(prefixes) and entry.lstat().st_uid == uid:
                left.append(str(entry))
    return left


def _grant_traverse(paths, listable=()) -> list[tuple[str, int]]:
    """Add o+x to the folders above ``paths`` that lack it (e.g. /root, when the venv's interpreter lives
    in /root/.pyenv), so that the throwaway user can reach the interpreter, the venv and the repo, and
    o+rx to the ``listable`` folders (the repo's root, which is on the user's PYTHONPATH: a clone made
    in a `mktemp -d` folder is 0700). Returns (folder, old mode) pairs for :func:`_restore`; no folder
    gets write rights."""
    grants = [(folder, 0o001) for path in [*paths, *listable] for folder in reversed(Path(path).resolve().parents)]
    grants += [(Path(path).resolve(), 0o005) for path in listable]
    changed: dict[str, int] = {}  # folder -> its mode before this function
    for folder, grant in grants:
        mode = folder.stat().st_mode & 0o7777
        if mode & grant != grant:
            changed.setdefault(str(folder), mode)
            os.chmod(folder, mode | grant)
    return list(changed.items())


def _restore(changed: list[tuple[str, int]]) -> None:
    for folder, mode in reversed(changed):
        os.chmod(folder, mode)


@pytest.fixture(scope="module")
def nonroot_runs(tmp_path_factory, worker_id):
    """{layers: results or a skip reason} of the attack runs as a throwaway user (:func:`_nonroot_runs`),
    once per session: pytest-xdist may split this module's ~450 tests between its workers, and the second
    reads the first's results (a JSON file in the session's temp folder, under a lock) instead of running
    the ~35 s of attacks again."""
    if worker_id == "master":  # no xdist: nothing to share
        return _nonroot_runs()
    shared = tmp_path_factory.getbasetemp().parent / "sandbox_nonroot_runs.json"
    with open(shared.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not shared.exists():
            try:
                runs = {"runs": _nonroot_runs()}
            except pytest.skip.Exception as skipped:
                runs = {"skip": skipped.msg}
            shared.write_text(json.dumps(runs))
        runs = json.loads(shared.read_text())
    if "skip" in runs:
        pytest.skip(runs["skip"])
    return runs["runs"]


def _nonroot_runs() -> dict:
    """{layers: results or a skip reason} of the attack runs as a throwaway user, made and removed here.

    The o+x grants of :func:`_grant_traverse` last only while the runs do, under a lock (pytest-xdist
    workers or other checkouts on this machine would otherwise restore the modes under each other)."""
    if os.geteuid() != 0:
        pytest.skip("already running as a non-root user: tests/test_sandbox.py runs every attack unprivileged")
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    if not (useradd and userdel):
        pytest.skip("useradd/userdel are not installed: cannot create a throwaway non-root user")
    name = f"copes-sbx-{os.getpid()}"
    made = subprocess.run([useradd, "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin",
                           name], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"useradd {name} failed: {made.stderr.strip()}")
    entry = pwd.getpwnam(name)
    runs, changed = {}, []
    try:
        # the lock: the interpreter itself, shared by every checkout using it (no lock file is left)
        with open(os.path.realpath(sys.executable), "rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                changed = _grant_traverse([os.path.realpath(sys.executable), sys.prefix], listable=[REPO])
                check = _run_as(entry, [sys.executable, "-c", "import copes_lib.tools.sandbox, tests.sandbox_attacks"],
                                timeout_s=60)
                if check.returncode:
                    pytest.skip(f"user {name} cannot read the venv ({sys.executable}) or the repo ({REPO}): "
                                f"{check.stderr.strip()[-300:]}")
                for layers in LAYERS:
                    mode, _, without = layers.partition(":")
                    done = _run_as(entry, [sys.executable, "-m", "tests.sandbox_attacks", "--layers", mode,
                                           "--without", without])
                    if done.returncode and "lacks" in done.stderr:
                        runs[layers] = done.stderr.strip().splitlines()[-1]
                        continue
                    assert done.returncode == 0, done.stderr[-2000:]
                    report = json.loads(done.stdout)
                    assert report["uid"] == entry.pw_uid != 0
                    runs[layers] = report["results"]
                    runs["refusal"] = report["refusal"]
                for without in CROSS:
                    done = _run_as(entry, [sys.executable, "-m", "tests.sandbox_attacks", "--cross-call",
                                           "--layers", "kernel-only", "--without", without])
                    if done.returncode and "lacks" in done.stderr:
                        runs[f"cross:{without}"] = done.stderr.strip().splitlines()[-1]
                        continue
                    assert done.returncode == 0, done.stderr[-2000:]
                    report = json.loads(done.stdout)
                    assert report["uid"] == entry.pw_uid != 0
                    runs[f"cross:{without}"] = report["record"]
            finally:
                _restore(changed)
        assert _processes_of(entry.pw_uid) == [], "processes of the throwaway user survived"
        assert _owned_leftovers(entry.pw_uid) == [], "the throwaway user's runs left files behind"
    finally:
        subprocess.run([userdel, name], capture_output=True)
    return runs


@pytest.fixture(params=LAYERS)
def nonroot_run(request, nonroot_runs):
    results = nonroot_runs[request.param]
    if isinstance(results, str):
        pytest.skip(f"layers={request.param!r} as a non-root user: {results}")
    return request.param, results


def test_the_non_root_run_has_the_kernel_layers_of_this_host(nonroot_run):
    layers, results = nonroot_run
    active = next(iter(results.values()))["layers"]
    if layers == "hook-only":
        assert active == {}
    elif ":" in layers:  # a simulated host: the left-out layers are missing, the rest as on this host
        missing = {name for group in layers.partition(":")[2].split(",") for name in isolation.SIMULATED_MISSING[group]}
        expected = set(isolation.host_layers()) - missing
        if "landlock" in missing and {"private_tmpfs", "pid_namespace"} <= expected:
            expected.add(isolation.READ_ONLY_VIEW)  # the mount namespace's view stands in for Landlock
        assert set(active) == expected, active
    else:  # what a probe as root finds, a non-root worker gets too (user namespaces are unprivileged)
        assert set(active) == set(isolation.host_layers()), active


@pytest.mark.parametrize("name", NAMES)
def test_each_attack_is_contained_as_a_non_root_user(nonroot_run, name):
    layers, results = nonroot_run
    result = results[name]
    failure = attacks.expectation_failure(name, layers.partition(":")[0], result, attacks.catalogue("SITE")[name][1])
    assert failure is None, failure
    assert result["same_workers"], f"{name}: a worker died"
    assert result["harm"] == [], result["harm"]
    assert result["serves"], f"{name}: the pool stopped serving"
    assert not (result["memoised"] and not result["ok"])


def test_memory_corruption_is_stopped_by_the_kernel_as_a_non_root_user(nonroot_run):
    """The pure-Python use-after-free switches the hook off; the kernel layers of each mode stop the rest
    (not run with layers='hook-only', where nothing would: docs/sandbox.md)."""
    layers, results = nonroot_run
    mode, _, without = layers.partition(":")
    if attacks.memory_attack_skip_reason():
        pytest.skip(attacks.memory_attack_skip_reason())
    if attacks.unconfined(mode, without):
        pytest.skip("no kernel file confinement (the opt-in): the attack escapes (docs/sandbox.md); not run here")
    result = results[attacks.MEMORY_NAME]
    failure = attacks.memory_failure(result)
    assert failure is None, failure
    assert result["harm"] == [], result["harm"]
    assert result["serves"] and result["same_workers"]


def test_a_non_root_host_without_file_confinement_refuses(nonroot_runs):
    message = nonroot_runs["refusal"]
    assert message.startswith("the Python sandbox refuses to start"), message
    assert "allow_unconfined_files=True" in message and "Landlock" in message


@pytest.mark.parametrize("without", CROSS)
def test_a_call_with_the_hook_off_cannot_touch_another_call_or_the_host_as_a_non_root_user(nonroot_runs, without):
    """Issue 48 as a non-root user, whose calls run as the worker's own uid: the worker stays out of
    reach (socket channels, a masked /proc/1), so no later call's result or memo entry changes, and no
    host setting can be written (a UTS namespace, a read-only, masked /proc)."""
    record = nonroot_runs[f"cross:{without}"]
    if isinstance(record, str):
        pytest.skip(f"kernel-only, without={without!r}, as a non-root user: {record}")
    assert attacks.cross_call_failure(record) is None, attacks.cross_call_failure(record)
    assert attacks.kernel_settings_failure(record) is None, attacks.kernel_settings_failure(record)
    if attacks.ipc_not_tried(record) is None:
        assert attacks.ipc_failure(record) is None, attacks.ipc_failure(record)

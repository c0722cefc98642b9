"""A World (fastpath_hooks/engine/world.py) whose outside is a table: the engine's transitions in milliseconds.

`TableWorld` keeps the real parts that cost nothing - the settings, the shipped pins, the real
policy deciding on an Environment value, the real fingerprint, the real verdict cache in a
temporary directory - and replaces what a CPU test machine cannot do quickly or at all: the probe
(the Environment is a value the test holds, changed by installs), the environment lock (free,
contended - with what another process does meanwhile - or unavailable), the verification child
(scripted answers) and the installer (it adds the decision's target to the Environment, or fails).
Every call is counted (`calls`), so a row can say how often the world was read.
"""

from __future__ import annotations

import collections
import dataclasses

from fastpath_hooks.act.store import VerdictCache
from fastpath_hooks.engine import machine
from fastpath_hooks.engine.context import fingerprint
from fastpath_hooks.engine.world import LockUnavailable
from fastpath_hooks.engine.world import InstallFailed, NumericFailed, Stamp, World
from fastpath_hooks.act.installer import InstallResult
from fastpath_hooks.act.store import signature_environ
from fastpath_hooks.facts import pins as pins_mod
from fastpath_hooks.facts.settings import Settings

PINS = pins_mod.load()

# A machine posed the way FASTPATH_HOOKS_TARGET poses one (tests/test_policy.py's BASE): A100 by default.
FACTS = dict(
    python="3.12.3", implementation="cpython", os="linux", arch="x86_64", glibc="2.36",
    torch="2.10.0", torch_cuda="12.8", torch_hip=None, torch_xpu=False, cxx11_abi=True,
    gpus=("sm_80",), gpu_source="target", triton="3.6.0", triton_dist="triton",
    nvcc="/usr/local/cuda/bin/nvcc", uv="/usr/bin/uv", wheelhouse=(), half_installed=(),
    nvcc_version="12.8", cpus=16, wheel_cache="/cache/wheels", prefix="/venv",
)
DISTS = {"transformers": "5.24.0", "numpy": "2.2.6", "einops": "0.8.1", "packaging": "25.0", "torch": "2.10.0",
         "triton": "3.6.0", "pip": "25.0"}
TILELANG_PAIR = {"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12", "z3-solver": "4.15.4.0",
                 "torch-c-dlpack-ext": "0.1.3", "cloudpickle": "3.1.1", "ml-dtypes": "0.5.3", "psutil": "7.1.0",
                 "tqdm": "4.67.1", "typing-extensions": "4.15.0"}


def environment(dists: dict | None = None, **facts):
    """An Environment value: FACTS with `facts` replaced, DISTS with `dists` added (None: removed)."""
    from fastpath_hooks.facts.environment import Environment

    installed = dict(DISTS)
    for name, version in (dists or {}).items():
        if version is None:
            installed.pop(name, None)
        else:
            installed[name] = version
    return Environment(distributions=installed, **{**FACTS, **facts})


class Verification:
    def __init__(self, ok: bool, detail: str, numeric: bool = False):
        self.ok, self.detail, self.numeric = ok, detail, numeric


class TableLock:
    def __init__(self, world):
        self.world, self.waited, self.first = world, False, False

    def acquire(self):
        world = self.world
        world.calls["lock"] += 1
        if world.lock_unavailable:
            raise LockUnavailable("another process held the install lock for 1 s (FASTPATH_HOOKS_LOCK_TIMEOUT)")
        if world.first_lock:   # the first lock of an environment makes its state directory in site-packages,
            world.first_lock = False   # which moves site-packages' mtime: the stamp changes
            self.first = True
            world.generation += 1
        if world.meanwhile:   # contended: another process held it, and did this before letting go
            self.waited = True
            action, world.meanwhile = world.meanwhile, None
            action(world)
        world.held += 1
        return self

    def release(self):
        self.world.held -= 1


class TableWorld(World):
    def __init__(self, env, tmp_path, *, settings=None, pins=PINS, invalid=None):
        super().__init__()
        self.env, self.settings, self.pins, self.invalid = env, settings or Settings(), pins, invalid
        self.root = str(tmp_path / "cache")
        self.calls = collections.Counter()
        self.checks = []            # the `check` each verification was handed
        self.generation = 0                  # bumped by every change of what is installed (the stamp follows it)
        self.journal = False                 # an install's journal is pending
        self.meanwhile = None                # what another process does while this one waits for the lock
        self.lock_unavailable = False
        self.first_lock = False
        self.held = 0
        self.verifications = []              # (ok, detail[, numeric]) answers, in order; then ok
        self.numeric_plans = []              # the numeric plan each verification was handed
        self.first_checks = []               # (ok, detail[, ...]) answers of checks at a first call, in order
        self.first_checked = []              # the check each first call ran (the call's shapes, dtype, variant)
        self.installer_answer = ("uv", "auto: uv found")
        self.install_error = None
        self.install_numeric = None          # an install rolled back on its numbers, with this measured error
        self.installed_decisions = []
        self.built_decisions = []
        self.downloaded = []

    # what a decision is made from
    def context(self, target=None):
        settings = self.settings if target is None else self.settings.with_target(target)
        return settings, self.pins, self.invalid

    def stamp(self, captured, signature=None):
        self.calls["stamp"] += 1
        return None if self.journal else Stamp(f"signature{self.generation}", None)

    def read(self, settings, pins, kernel=None):
        self.calls["read"] += 1
        return super().read(settings, pins, kernel)

    def probe(self, settings, pins, *, nvcc=False):
        self.calls["probe"] += 1
        return self.env

    def decide(self, env, settings, pins, *, fresh=False):
        self.calls["decide"] += 1
        return super().decide(env, settings, pins, fresh=fresh)

    def settle(self, env, settings, pins, result):
        self.calls["settle"] += 1
        return self.env

    def fingerprint(self, env, settings, pins, kernel):
        return fingerprint(env, settings, pins, kernel)

    # the lock and the journal
    def pending(self, settings):
        return self.journal

    def state_dir(self, settings):
        return self.root + "/state"

    def lock(self, settings, kernel):
        return TableLock(self)

    def recover(self, settings):
        self.calls["recover"] += 1
        self.journal = False

    # verdicts, verification, installs
    def cache(self, settings):
        return VerdictCache(root=self.root, retry_after=settings.retry_after)

    def verify(self, spec, *, timeout, env_extra=(), numeric=None, check=None, root=None, gpus=(), keyed=()):
        self.calls["verify"] += 1
        self.numeric_plans.append(numeric)
        self.checks.append(check)
        answer = self.verifications.pop(0) if self.verifications else (True, f"{spec.name} imports")
        return Verification(*answer)

    def first_check(self, payload, check, *, started=None):
        """A check at a kernel's first call: the next of `first_checks` ((ok, detail) or a Verification's fields)."""
        self.calls["first_check"] += 1
        self.first_checked.append(check)
        answer = self.first_checks.pop(0) if self.first_checks else (True, f"{payload['kernel']} checked")
        return Verification(*answer)

    def installer(self, settings, env):
        return self.installer_answer

    def install(self, decision, *, settings, env, pins):
        assert self.held, "installs happen under the environment lock"
        self.calls["install"] += 1
        self.installed_decisions.append(decision)
        if self.install_numeric:
            raise NumericFailed(self.install_numeric)
        if self.install_error:
            raise InstallFailed(self.install_error)
        self.add(dict(decision.target))
        return InstallResult(decision.kernel, dict(decision.target), 0.5, "uv", ())

    def build(self, decision, *, settings, env, pins):
        """A build into the wheel cache: an (empty) wheel file named as a build of ours is."""
        import os

        assert self.held, "builds happen under the environment lock"
        self.calls["build"] += 1
        self.built_decisions.append(decision)
        if self.install_error:
            raise InstallFailed(self.install_error)
        (step,) = [s for s in decision.steps if s.kind == "build"]
        name, version = next(iter(step.exact.items()))
        path = os.path.join(self.root, "wheels", f"{name.replace('-', '_')}-{version}+fph.test-cp312-cp312-linux_x86_64.whl")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "wb").close()
        return [path]

    def download(self, dest, *, env, settings, binary, wheels):
        import os

        self.calls["download"] += 1
        self.downloaded.append((tuple(binary), tuple(w.requirements[0] for w in wheels)))
        os.makedirs(dest, exist_ok=True)
        out = []
        for name in [f"{r.replace('==', '-')}-py3-none-any.whl" for r in binary] + [w.requirements[0] for w in wheels]:
            open(os.path.join(dest, name), "wb").close()
            out.append(os.path.join(dest, name))
        return out

    # what tests (and other processes) change
    def add(self, dists: dict) -> None:
        """Distributions installed (a version) or removed (None): what an installer does to the environment."""
        now = dict(self.env.distributions)
        for name, version in dists.items():
            if version is None:
                now.pop(name, None)
            else:
                now[name] = version
        self.env = dataclasses.replace(self.env, distributions=now)
        self.generation += 1

    def verdict(self, kernel, state, reason="by another process", env=None):
        """Another process recorded a verdict for `kernel` under the facts as they are (or `env`'s)."""
        print_ = fingerprint(env or self.env, self.settings, self.pins, kernel)
        self.cache(self.settings).record(kernel, verdict=(print_, state, reason))

    def run(self, kernel, needs=None, target=None):
        """machine.run for `kernel`; kernels it needs are decided by `needs` (default: the same world)."""
        needs = needs or (lambda other: self.run(other).outcome)
        return machine.run(kernel, needs=needs, world=self, captured=signature_environ({}, target=target),
                           target=target)


# -- the real World, its installer a stand-in ------------------------------------------------------

def write_dist_info(site: str, name: str, version: str, files: dict | None = None) -> str:
    """What an installer leaves in `site` for `name` `version`: its files, and a dist-info directory
    (METADATA, RECORD) naming them. Returns the dist-info path."""
    import os

    stem = name.replace("-", "_")
    info = os.path.join(site, f"{stem}-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    record = []
    for rel, text in (files or {}).items():
        path = os.path.join(site, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        record.append(f"{rel},,")
    with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as fh:
        fh.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    record += [f"{os.path.basename(info)}/METADATA,,", f"{os.path.basename(info)}/RECORD,,"]
    with open(os.path.join(info, "RECORD"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(record) + "\n")
    return info


class CountingWorld(World):
    """The real World - real settings from the variables, real probe and policy, real stamp, lock,
    recovery and verdict cache - whose state directory is a temporary one and whose installer
    writes the decision's distributions into `site` (a directory on sys.path) instead of running
    pip. Counts its probes, decisions and installs."""

    def __init__(self, tmp_path, site: str):
        super().__init__()
        self.tmp, self.site = str(tmp_path), site
        self.calls = collections.Counter()

    def probe(self, settings, pins, *, nvcc=False):
        self.calls["probe"] += 1
        return super().probe(settings, pins, nvcc=nvcc)

    def decide(self, env, settings, pins, *, fresh=False):
        self.calls["decide"] += 1
        return super().decide(env, settings, pins, fresh=fresh)

    def state_dir(self, settings):
        return self.tmp + "/state"

    def install(self, decision, *, settings, env, pins):
        from fastpath_hooks.facts.distributions import scan

        self.calls["install"] += 1
        for step in decision.steps:
            for name, version in step.exact.items():
                write_dist_info(self.site, name, version)
        return InstallResult(decision.kernel, dict(decision.target), 0.1, "stand-in", (), scan=scan())

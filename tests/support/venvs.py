"""Real temporary virtual environments for the tests, made with uv (hard links from its cache: ~2 s each).

Every environment gets CPU torch 2.13.0 from the wheel on disk (never the
index's CUDA build), a chosen transformers, and fastpath-hooks installed as a
wheel (not editable: the start-up path must be the one users get). Installs the
tests make go through explicit flags; pip's machine configuration is switched
off for them (PIP_CONFIG_FILE=/dev/null), so nothing depends on it.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTECTED = ("torch", "numpy", "transformers", "triton", "kernels", "huggingface-hub")
# "latest" in the tests means the newest transformers these tests were run against, so results do not
# change by the day; FASTPATH_HOOKS_TEST_TRANSFORMERS=newest runs them against the real newest release
# (the separate job in docs/development.md), or =X.Y.Z against any other.
NEWEST_TESTED_TRANSFORMERS = "5.25.0"


def latest_transformers() -> str | None:
    """The version "latest" stands for; None = unpinned (the index's newest)."""
    chosen = os.environ.get("FASTPATH_HOOKS_TEST_TRANSFORMERS", "").strip() or NEWEST_TESTED_TRANSFORMERS
    return None if chosen == "newest" else chosen


def uv() -> str:
    exe = shutil.which("uv") or os.path.join(os.path.dirname(sys.executable), "uv")
    if not os.path.exists(exe):
        raise RuntimeError("uv is needed by the tests and benchmarks: pip install uv (the test extra has it)")
    return exe


def base_python() -> str:
    """The interpreter the test venvs are made from (the one running the tests, resolved to its base)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def clean_env(**extra) -> dict:
    """os.environ without FASTPATH_HOOKS_* and torch-distributed rank variables, pip config off. The children
    may write bytecode (as on most machines; PYTHONDONTWRITEBYTECODE=1 is set here and on CI): the venvs are
    made with uv, which compiles none, so without it every child compiles torch and transformers from source
    again (4 s more CPU per child here) - with it, the first child in a venv does, once."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FASTPATH_HOOKS_", "_FASTPATH_HOOKS_", "PIP_"))
           and k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def find_torch_wheel(cache_dir: str) -> str:
    """The CPU torch 2.13.0 wheel: FASTPATH_TEST_TORCH_WHEEL, the machine's wheel folder, or pip's (configured) download."""
    explicit = os.environ.get("FASTPATH_TEST_TORCH_WHEEL")
    if explicit:
        return explicit
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    for pattern in (f"/opt/wheels/torch-2.13.0+cpu-{tag}-*.whl", os.path.join(cache_dir, f"torch-2.13.0+cpu-{tag}-*.whl")):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    os.makedirs(cache_dir, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", cache_dir,
                    "--index-url", "https://download.pytorch.org/whl/cpu", "torch==2.13.0+cpu"], check=True)
    return sorted(glob.glob(os.path.join(cache_dir, f"torch-2.13.0+cpu-{tag}-*.whl")))[0]


def build_fastpath_wheel(dest: str) -> str:
    """This checkout as a wheel in `dest`: with the running interpreter's own build backend where it has one that
    builds it (offline, as the tests run), else in pip's isolated build environment (the backend pyproject.toml
    names, from the index): a newcomer's python3 may have an old setuptools, or none (issue 40)."""
    os.makedirs(dest, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dest, ROOT]
    here = subprocess.run(argv[:5] + ["--no-build-isolation"] + argv[5:], env=clean_env(), capture_output=True,
                          text=True)
    if here.returncode != 0:
        subprocess.run(argv, check=True, env=clean_env())
    return newest_fastpath_wheel(dest)


def newest_fastpath_wheel(dest: str) -> str:
    return sorted(glob.glob(os.path.join(dest, "fastpath_hooks-*.whl")))[-1]


@dataclass
class Venv:
    path: str

    @property
    def python(self) -> str:
        return os.path.join(self.path, "bin", "python")

    @property
    def bin(self) -> str:
        return os.path.join(self.path, "bin")

    @property
    def site(self) -> str:
        return glob.glob(os.path.join(self.path, "lib", "python3*", "site-packages"))[0]

    def run(self, code: str, *, env: dict | None = None, timeout: float = 600, check: bool = False,
            args=(), cwd: str | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([self.python, "-c", code, *args], env=env if env is not None else clean_env(),
                              capture_output=True, text=True, timeout=timeout, cwd=cwd or self.path)
        if check and proc.returncode != 0:
            raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc

    def cli(self, *args, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([os.path.join(self.bin, "fastpath-hooks"), *args],
                              env=env if env is not None else clean_env(),
                              capture_output=True, text=True, timeout=timeout, cwd=self.path)

    def uv_install(self, *requirements, no_deps: bool = False, extra=()) -> None:
        argv = [uv(), "pip", "install", "-q", "--python", self.python, *extra]
        if no_deps:
            argv.append("--no-deps")
        subprocess.run(argv + list(requirements), check=True, env=clean_env(), capture_output=True, text=True)

    def versions(self) -> dict:
        """name -> version of everything installed (via importlib.metadata in the venv)."""
        out = self.run("import json, importlib.metadata as m; print(json.dumps({d.metadata['Name'].lower().replace('_','-'): "
                       "d.version for d in m.distributions()}))", check=True)
        return json.loads(out.stdout)

    def file_hashes(self, names=PROTECTED) -> dict:
        """sha256 of every file the named distributions own (RECORD), for 'unchanged' checks."""
        code = (
            "import hashlib, json, sys, importlib.metadata as m\n"
            "out = {}\n"
            "for name in sys.argv[1:]:\n"
            "    try: d = m.distribution(name)\n"
            "    except m.PackageNotFoundError: continue\n"
            "    h = hashlib.sha256()\n"
            "    for f in sorted(d.files or [], key=str):\n"
            "        p = f.locate()\n"
            "        try: h.update(str(f).encode() + open(p, 'rb').read())\n"
            "        except OSError: h.update(str(f).encode() + b'<missing>')\n"
            "    out[name] = [d.version, h.hexdigest()]\n"
            "print(json.dumps(out))\n"
        )
        return json.loads(self.run(code, args=list(names), check=True).stdout)

    def pip_check(self) -> str:
        proc = subprocess.run([self.python, "-m", "pip", "check"], capture_output=True, text=True, env=clean_env())
        return (proc.stdout + proc.stderr).strip()


def make_venv(path: str, *, torch_wheel: str | None, fastpath_wheel: str | None, transformers: str | None = "latest",
              extra=(), seed: bool = True) -> Venv:
    argv = [uv(), "venv", "-q", "-p", base_python()]
    if seed:
        argv.append("--seed")
    subprocess.run(argv + [path], check=True, env=clean_env(), capture_output=True, text=True)
    venv = Venv(path)
    reqs = []
    if torch_wheel:
        reqs.append(torch_wheel)
    if transformers == "latest":
        transformers = latest_transformers()
        reqs.append("transformers" if transformers is None else f"transformers=={transformers}")
    elif transformers:
        reqs.append(f"transformers=={transformers}")
    if fastpath_wheel:
        reqs.append(fastpath_wheel)
    reqs += list(extra)
    if reqs:
        venv.uv_install(*reqs)
    # A fresh venv seeds an old setuptools that CPU torch 2.13 says it needs >= 77 of (practical.md);
    # start from a clean `pip check`.
    if seed:
        venv.uv_install("setuptools>=77")
    return venv


def fingerprint_tree(path: str) -> str:
    h = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(root, f)
            h.update(p.encode())
            with open(p, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()

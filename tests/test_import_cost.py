"""Importing fastpath_hooks (and install()) stays nearly free: it runs at every interpreter
start when enabled, so it must not import torch, transformers, packaging,
importlib.metadata or subprocess. Checked on `python -X importtime` output of a fresh
interpreter; the cost itself is printed by benchmarks/import_cost.py. The warm decision (a
kernel import answered by the verdict remembered for this environment) loads none of the cold
path either: benchmarks/warm_decision.py prints its cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from support.processes import AUDIT_PRELUDE  # noqa: E402
from support.venvs import ROOT, clean_env  # noqa: E402

FORBIDDEN = ("torch", "transformers", "packaging", "importlib.metadata", "subprocess")
# Not forbidden by the issue, but each costs milliseconds at every start (practical.md).
STARTUP_EXPENSIVE = ("re", "json", "logging", "threading", "pathlib", "email", "inspect", "dataclasses")
CODES = {
    "import": "import fastpath_hooks",
    "install": "import fastpath_hooks; assert fastpath_hooks.install() is True",
}


def parse_importtime(stderr: str) -> list[tuple[int, str]]:
    """(depth, module) per `import time:` line, in the order the imports finished."""
    out = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "| imported package" in line:
            continue
        parts = line.split("|")
        if len(parts) != 3 or not parts[0].split(":")[1].strip().isdigit():
            continue
        field = parts[2].rstrip()
        depth = (len(field) - len(field.lstrip()) - 1) // 2
        out.append((depth, field.strip()))
    return out


def imported_by(code: str, *, isolated: bool, **variables) -> list[str]:
    """Modules imported by `code` in a fresh interpreter (with these environment variables).

    isolated=False: the interpreter as users run it (site on); only imports after the
    `site` module finished count. isolated=True: `-S` with the source tree on PYTHONPATH, so
    nothing is hidden by a module that site (or an editable-install finder) imported first.
    """
    argv = [sys.executable, "-X", "importtime"] + (["-S"] if isolated else []) + ["-c", code]
    env = clean_env(PYTHONPATH=ROOT, **variables) if isolated else clean_env(**variables)
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = parse_importtime(result.stderr)
    if not isolated:
        site_done = [i for i, (depth, name) in enumerate(lines) if depth == 0 and name == "site"]
        assert site_done, "importtime output has a top-level site entry"
        lines = lines[site_done[-1] + 1:]
    return [name for _, name in lines]


def _hits(modules, names):
    return sorted({m for m in modules for n in names if m == n or m.startswith(n + ".")})


@pytest.mark.parametrize("isolated", [False, True], ids=["site", "isolated"])
@pytest.mark.parametrize("what", sorted(CODES))
def test_import_and_install_import_nothing_heavy(what, isolated):
    modules = imported_by(CODES[what], isolated=isolated)
    assert "fastpath_hooks" in modules, modules  # the measurement saw our import
    if what == "install":
        assert "fastpath_hooks.hooks" in modules
    assert _hits(modules, FORBIDDEN) == []


def test_nothing_expensive_at_start_up():
    modules = imported_by(CODES["install"], isolated=True)
    assert _hits(modules, STARTUP_EXPENSIVE) == []
    ours = [m for m in modules if m.startswith("fastpath_hooks")]
    assert sorted(ours) == ["fastpath_hooks", "fastpath_hooks._names", "fastpath_hooks.hooks"], ours


@pytest.mark.parametrize("variable", ["FASTPATH_HOOKS_LOG=info", "FASTPATH_HOOKS_TARGET=gpu=sm_80,cuda=12.8",
                                      "FASTPATH_HOOKS_DISABLE=1"])
def test_a_later_start_with_a_variable_set_loads_nothing_expensive(tmp_path, variable):
    """Variables an earlier start found valid leave a marker (and a posed target's line was said there): a later
    install() loads neither the settings nor events, logging or hashlib's OpenSSL - it cost 11.9 ms (issue 40)."""
    name, _, value = variable.partition("=")
    variables = {name: value, "FASTPATH_HOOKS_CACHE_DIR": str(tmp_path / "cache"), "LOCAL_RANK": "0"}
    code = "import fastpath_hooks; assert fastpath_hooks.install() is (" + str(name != "FASTPATH_HOOKS_DISABLE") + ")"
    imported_by(code, isolated=False, **variables)   # the earlier start: checks them, says the posed target
    later = imported_by(code, isolated=False, **variables)
    assert _hits(later, STARTUP_EXPENSIVE + ("hashlib", "_hashlib")) == [], later
    ours = sorted(m for m in later if m.startswith("fastpath_hooks"))
    assert ours == ["fastpath_hooks", "fastpath_hooks._names", "fastpath_hooks.hooks"], ours


def test_the_digest_without_hashlib_is_hashlibs_sha256():
    """The cache's keys (environment, settings marker, warm signature) stay what hashlib made them."""
    code = ("import sys; from fastpath_hooks._names import sha256_hex; data = bytes(range(256)) * 9; "
            "ours = sha256_hex(data); assert 'hashlib' not in sys.modules; import hashlib; "
            "assert ours == hashlib.sha256(data).hexdigest() == sha256_hex(data), ours")
    result = subprocess.run([sys.executable, "-S", "-c", code], env=clean_env(PYTHONPATH=ROOT), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_sys_modules_agrees_with_importtime():
    code = ("import sys; before = set(sys.modules); import fastpath_hooks; fastpath_hooks.install(); "
            "print(' '.join(sorted(set(sys.modules) - before)))")
    result = subprocess.run([sys.executable, "-S", "-c", code], env=clean_env(PYTHONPATH=ROOT), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    new = result.stdout.split()
    assert "fastpath_hooks.hooks" in new
    assert _hits(new, FORBIDDEN) == [] and _hits(new, STARTUP_EXPENSIVE) == []


# What a warm decision may load: the engine's entry, the Outcome, the store's warm lookup, events, and the gates
# module (the finder hands the engine its modeling-import hint). The pins loader (33 dataclasses), packaging,
# the plan and the policy load only when a kernel is decided cold: 3 ms became 44 ms when they did (issue 40).
WARM_MODULES = ["fastpath_hooks", "fastpath_hooks._names", "fastpath_hooks.act", "fastpath_hooks.act.store",
                "fastpath_hooks.engine", "fastpath_hooks.engine.outcome", "fastpath_hooks.events", "fastpath_hooks.hooks",
                "fastpath_hooks.hooks.gates"]
# An earlier process: install() (its settings found valid) and the warm verdict, written as the engine's RECORD
# step writes it, under the signature a process started the same way (interpreter, variables, directory) computes.
RECORD_WARM = """
import fastpath_hooks
fastpath_hooks.install()
from fastpath_hooks._names import cache_root_from_environ
from fastpath_hooks.act import store
captured = store.signature_environ()
cache = store.VerdictCache(root=cache_root_from_environ(dict(captured)), retry_after=0)
cache.record("fla", warm=(store.environment_signature(captured), {"reason": "fla 0.6.0 installed", "env": []}))
"""
WARM_DECISION = AUDIT_PRELUDE + """
import importlib.util, json, sys
before = set(sys.modules)
import fastpath_hooks
fastpath_hooks.install()
importlib.util.find_spec("fla")   # through the import hook, as `import fla` asks
from fastpath_hooks import engine
outcome = engine.outcomes()["fla"]
print(json.dumps({"outcome": [outcome.state.value, outcome.reason], "spawns": len(SPAWNS),
                  "new": sorted(set(sys.modules) - before)}))
"""


def test_a_warm_decision_loads_none_of_the_cold_path(tmp_path):
    env = clean_env(FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"), FASTPATH_HOOKS_FIND_LINKS=str(tmp_path))

    def child(code):
        proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path), capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        return proc.stdout

    child(RECORD_WARM)
    warm = json.loads(child(WARM_DECISION).strip().splitlines()[-1])
    assert warm["outcome"] == ["ok", "fla 0.6.0 installed"] and warm["spawns"] == 0, warm   # the warm verdict
    assert [m for m in warm["new"] if m.startswith("fastpath_hooks")] == WARM_MODULES, warm["new"]
    assert _hits(warm["new"], FORBIDDEN + ("dataclasses", "typing")) == [], warm["new"]


def test_parser_reads_nesting():
    sample = ("import time: self [us] | cumulative | imported package\n"
              "import time:       100 |        100 |     _stat\n"
              "import time:       300 |        400 |   stat\n"
              "import time:       500 |        900 | site\n")
    assert parse_importtime(sample) == [(2, "_stat"), (1, "stat"), (0, "site")]

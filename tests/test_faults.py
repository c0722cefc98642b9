"""Fault injection: every fault ends in a clear message on stderr and transformers' torch path.

The user's script - `fastpath_hooks.install()`, then build a tiny Qwen3.5 and run a forward
and backward pass - runs once per fault in one shared venv, posing as an A100 machine.
Never a traceback, always exit 0, the model always built (on the torch path, since every
fault stops the install), and the environment unchanged. One last row without a fault
shows the same venv would otherwise take the fast path.

A fork server keeps this affordable: one process of the venv imports torch and
transformers once (what every row's script would import anyway, ~8 s of CPU), then
forks a fresh child per row that gets the row's environment variables (and, for the
read-only row, the unprivileged user `nobody`) before it runs the script.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile

import pytest

from conftest import A100, offline_env
from fastpath_hooks.facts.settings import VARIABLES
from support import venvs, wheels
from support.processes import TINY_MODEL, TORCH_IMPLEMENTATION, closed_port, link_uv, silent_server

NOBODY = 65534

USER_SCRIPT = r'''
import sys
import fastpath_hooks
kernels = sys.argv[sys.argv.index("--kernels") + 1:] if "--kernels" in sys.argv else None
fastpath_hooks.install(kernels=kernels)
import json
''' + TINY_MODEL + r'''
print(json.dumps(build_tiny_model()))
'''

DRIVER = r'''
import json, os, sys, time, traceback, runpy, signal
import importlib
import torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: F401 - the auto classes, not qwen3_5 itself
AutoConfig.for_model("qwen3_5_text")
# what modeling_qwen3_5 imports, short of itself (importing it chooses the kernels)
for name in ("initialization", "activations", "cache_utils", "generation", "integrations", "integrations.hub_kernels",
             "integrations.accelerate", "masking_utils", "modeling_flash_attention_utils", "modeling_layers",
             "modeling_outputs", "modeling_rope_utils", "modeling_utils", "processing_utils", "utils.output_capturing",
             "vision_utils", "models.auto.modeling_auto"):
    importlib.import_module("transformers." + name)
assert not {"fla", "causal_conv1d", "transformers.models.qwen3_5.modeling_qwen3_5"} & set(sys.modules)
rows = json.load(open(sys.argv[1]))
site = sys.argv[2]
results = {}
for row in rows:
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.environ.clear()
            os.environ.update(row["env"])
            out = os.open(row["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            err = os.open(row["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, 1); os.dup2(err, 2)
            if row.get("uid") is not None:
                os.setgroups([]); os.setgid(row["uid"]); os.setuid(row["uid"])
            sys.argv = [row["script"]] + row["args"]
            runpy.run_path(row["script"], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()   # what the interpreter would print for the user's script
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    start = time.monotonic()
    deadline = start + 240
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0); code = "hung"
            break
        time.sleep(0.01)
    results[row["id"]] = {"code": code, "seconds": round(time.monotonic() - start, 2), "fla_installed": any(n.startswith("fla_core-") for n in os.listdir(site))}
print(json.dumps(results))
'''

# A value each variable cannot take; a variable added to settings.VARIABLES without a row here fails the test.
GARBAGE = {
    "FASTPATH_HOOKS_DISABLE": "maybe",
    "FASTPATH_HOOKS_SKIP": "fla;;rm -rf /",
    "FASTPATH_HOOKS_MODE": "yolo",
    "FASTPATH_HOOKS_FIND_LINKS": "/nonexistent/wheelhouse",
    "FASTPATH_HOOKS_OFFLINE": "perhaps",
    "FASTPATH_HOOKS_INDEX_URL": "not a url",
    "FASTPATH_HOOKS_INSTALLER": "conda",
    "FASTPATH_HOOKS_TIMEOUT": "-5",
    "FASTPATH_HOOKS_ALLOW_BUILD": "2",
    "FASTPATH_HOOKS_SPLIT_COMPILE": "lots",
    "FASTPATH_HOOKS_CACHE_DIR": "<a file>",
    "FASTPATH_HOOKS_PINS": "/nonexistent/pins.json",
    "FASTPATH_HOOKS_TARGET": "gpu=sm_XX,torch=banana",
    "FASTPATH_HOOKS_LOG": "loud",
    "FASTPATH_HOOKS_CAUSAL_CONV1D_WHEEL_URL": "ftp://mirror.example/wheels",
    "FASTPATH_HOOKS_MAMBA_SSM_WHEEL_URL": "not a url",
    "FASTPATH_HOOKS_FLASH_ATTN_WHEEL_URL": "not a url",
    "FASTPATH_HOOKS_RETRY_AFTER": "soon",
    "FASTPATH_HOOKS_LOCK_TIMEOUT": "nan",
    "FASTPATH_HOOKS_BOGUS": "1",   # an unknown variable (a typo) is reported too
}


def _rows(base: str, good: str, broken: str) -> list[tuple]:
    """(id, env changes, expected stderr phrases, extra options) per fault."""
    cache = lambda name: os.path.join(base, "caches", name)  # noqa: E731 - a fresh verdict cache per row
    offline = lambda name, wheelhouse=good, **kw: {  # noqa: E731
        **offline_env(wheelhouse, A100, cache_dir=cache(name)), "FASTPATH_HOOKS_INSTALLER": "uv", **kw}
    # pip, told not to retry (its default retries take ~8 s); causal-conv1d skipped to halve the waiting
    online = lambda name, **kw: venvs.clean_env(  # noqa: E731
        FASTPATH_HOOKS_TARGET=A100, FASTPATH_HOOKS_CACHE_DIR=cache(name), FASTPATH_HOOKS_INSTALLER="pip",
        FASTPATH_HOOKS_SKIP="causal-conv1d", PIP_RETRIES="0", **kw)
    empty = os.path.join(base, "empty-wheelhouse")
    os.makedirs(empty, exist_ok=True)
    rows = [
        ("index-unreachable", online("unreachable", FASTPATH_HOOKS_INDEX_URL=f"http://127.0.0.1:{closed_port()}/simple"),
         ["fla: could not install"], {}),
        ("wheelhouse-missing", offline("missing", FASTPATH_HOOKS_FIND_LINKS=os.path.join(base, "no-such-dir")),
         ["FASTPATH_HOOKS_FIND_LINKS is not valid", "is not a directory", "so nothing is installed"], {}),
        ("wheelhouse-empty", offline("empty", wheelhouse=empty),
         ["fla: not installed", "FASTPATH_HOOKS_FIND_LINKS lacks", "fla-core", "fastpath-hooks download"], {}),
        ("timeout", online("timeout", FASTPATH_HOOKS_INDEX_URL="http://127.0.0.1:{silent}/simple",
                           FASTPATH_HOOKS_TIMEOUT="3"),
         ["fla: could not install", "did not finish within 3 s (FASTPATH_HOOKS_TIMEOUT)"], {}),
        ("read-only-site-packages", offline("readonly", HOME="/nonexistent"),
         ["fla: not installed - site-packages is not writable; install as the environment's owner"], {"uid": NOBODY}),
        ("corrupt-cache-json", offline("corrupt", wheelhouse=broken),
         ["fla: could not install", "verification failed", "broken on purpose"], {"cache": b"{\"schema\": 2, \"kern\xff"}),
        ("cache-unreadable", offline("unreadable", wheelhouse=broken),
         ["fla: could not install", "broken on purpose"], {"cache": "directory"}),
        ("unknown-kernel-in-skip", offline("skip-bogus", FASTPATH_HOOKS_SKIP="bogus"),
         ["FASTPATH_HOOKS_SKIP='bogus' is not valid, so nothing is installed: unknown kernel (`fastpath-hooks doctor` lists them)"], {}),
        ("unknown-kernel-in-install", offline("install-bogus"),
         ["install(kernels=...): unknown kernel 'bogus'"], {"args": ["--kernels", "bogus"]}),
    ]
    a_file = os.path.join(base, "user_script.py")
    for name, value in GARBAGE.items():
        value = a_file if value == "<a file>" else value
        # the value too where the line has room for it beside the reason and its fix (#17: never cut)
        expected = [f"{name}={value!r} is not valid" if len(repr(value)) <= 24 else f"{name}",
                    "is not valid, so nothing is installed"]
        if name == "FASTPATH_HOOKS_BOGUS":
            expected.append("unknown variable")
        # one line and nothing else from fastpath-hooks: the decisions still follow the valid variables
        # (tests/test_first_contact.py), quietly - no "would install" for an install that will not happen
        rows.append((f"garbage-{name}", offline(f"garbage-{name}", **{name: value}), expected, {"lines": 1}))
    return rows


@pytest.fixture(scope="module")
def faults(torch_wheel, fastpath_wheel, dep_wheels):
    # A world-readable place (pytest's tmp is private to root): one row runs as `nobody`.
    base = tempfile.mkdtemp(prefix="fastpath-faults-")
    os.chmod(base, 0o755)
    try:
        venv = venvs.make_venv(os.path.join(base, "venv"), torch_wheel=torch_wheel, fastpath_wheel=fastpath_wheel)
        link_uv(venv)
        good, broken = os.path.join(base, "wheels-good"), os.path.join(base, "wheels-broken")
        for dest in (good, broken):
            os.makedirs(dest)
            for name in os.listdir(dep_wheels):
                shutil.copy(os.path.join(dep_wheels, name), dest)
        wheels.fake_fla(good, "0.6.0")
        wheels.fake_fla(broken, "0.6.0", broken="raise")
        script = os.path.join(base, "user_script.py")
        with open(script, "w") as fh:
            fh.write(USER_SCRIPT)
        server = silent_server()
        rows, specs = [], {}
        for row_id, env, expected, extra in _rows(base, good, broken) + [
                ("no-fault", dict(offline_env(good, A100, cache_dir=os.path.join(base, "caches", "control")),
                                  FASTPATH_HOOKS_INSTALLER="uv"),
                 ["fla: installed"], {})]:
            env = {k: v.replace("{silent}", str(server.getsockname()[1])) for k, v in env.items()}
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            cache_dir = env.get("FASTPATH_HOOKS_CACHE_DIR", "")
            if cache_dir.startswith(os.path.join(base, "caches")):
                os.makedirs(cache_dir)
                os.chmod(cache_dir, 0o777)  # writable by `nobody` too
            verdicts = os.path.join(cache_dir, "verdicts",
                                    hashlib.sha256(os.path.realpath(venv.path).encode()).hexdigest()[:16] + ".json")
            if extra.get("cache") == "directory":
                os.makedirs(verdicts)
            elif extra.get("cache") is not None:
                os.makedirs(os.path.dirname(verdicts))
                with open(verdicts, "wb") as fh:
                    fh.write(extra["cache"])
            rows.append({"id": row_id, "env": env, "script": script, "args": extra.get("args", []),
                         "uid": extra.get("uid"), "stdout": os.path.join(base, f"{row_id}.out"),
                         "stderr": os.path.join(base, f"{row_id}.err")})
            specs[row_id] = {"expected": expected, "verdicts": verdicts, "lines": extra.get("lines")}
        assert [row["id"] for row in rows] == FAULTS + ["no-fault"]
        with open(os.path.join(base, "rows.json"), "w") as fh:
            json.dump(rows, fh)
        pip_check_before = venv.pip_check()
        driver = subprocess.run([venv.python, "-c", DRIVER, os.path.join(base, "rows.json"), venv.site],
                                capture_output=True, text=True, timeout=1200, env=venvs.clean_env(), cwd=base)
        server.close()
        assert driver.returncode == 0, driver.stderr[-3000:]
        results = json.loads(driver.stdout.strip().splitlines()[-1])
        for row in rows:
            with open(row["stdout"]) as out, open(row["stderr"]) as err:
                results[row["id"]].update(stdout=out.read(), stderr=err.read(), **specs[row["id"]])
        results["pip check"] = (pip_check_before, venv.pip_check())
        yield results
    finally:
        shutil.rmtree(base, ignore_errors=True)


FAULTS = ["index-unreachable", "wheelhouse-missing", "wheelhouse-empty", "timeout", "read-only-site-packages",
          "corrupt-cache-json", "cache-unreadable", "unknown-kernel-in-skip", "unknown-kernel-in-install"] + \
         [f"garbage-{name}" for name in GARBAGE]


def test_every_variable_has_a_garbage_row():
    assert set(GARBAGE) - {"FASTPATH_HOOKS_BOGUS"} == set(VARIABLES)


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
def test_fault_ends_on_the_torch_path_with_a_clear_message(faults, fault):
    row = faults[fault]
    stderr = row["stderr"]
    assert row["code"] == 0, stderr
    assert "Traceback" not in stderr, stderr
    for phrase in row["expected"]:
        assert phrase in stderr, (phrase, stderr)
    if row["lines"] is not None:
        assert len([line for line in stderr.splitlines() if line.startswith("fastpath-hooks: ")]) == row["lines"], stderr
    assert "FASTPATH_HOOKS_MODE=report" not in stderr  # the user did not choose report mode
    # nothing but our messages and transformers' own notes about its torch path
    assert all(line.startswith(("fastpath-hooks: ", "[transformers] ")) for line in stderr.splitlines()), stderr
    result = json.loads(row["stdout"].strip().splitlines()[-1])
    assert result["kernels"] == {"causal_conv1d_fn": TORCH_IMPLEMENTATION,
                                 "torch_chunk_gated_delta_rule": TORCH_IMPLEMENTATION}, result
    assert result["loss"] > 0
    assert not row["fla_installed"], "a fault must not leave anything installed"


@pytest.mark.slow
def test_a_corrupt_cache_file_is_rewritten(faults):
    with open(faults["corrupt-cache-json"]["verdicts"]) as fh:
        data = json.load(fh)
    (verdict,) = data["kernels"]["fla"].values()  # one fingerprint: this environment's
    assert verdict["state"] == "failed" and "broken on purpose" in verdict["reason"]
    assert os.path.isdir(faults["cache-unreadable"]["verdicts"])  # could not be written: ignored, never fatal


@pytest.mark.slow
def test_without_a_fault_the_same_venv_takes_the_fast_path(faults):
    row = faults["no-fault"]
    assert row["code"] == 0 and "Traceback" not in row["stderr"], row["stderr"]
    assert "fla: installed" in row["stderr"]
    result = json.loads(row["stdout"].strip().splitlines()[-1])
    assert result["kernels"]["torch_chunk_gated_delta_rule"] == "fla.ops.gated_delta_rule"
    assert row["fla_installed"]
    before, after = faults["pip check"]
    assert before == after

"""The real `fastpath-hooks` command in subprocesses: doctor on this CPU machine, the
documented JSON schemas (docs/json-schema.md is parsed and checked against real output),
the issue's five acceptance targets, and bad input -> exit 2 with a clear message."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fastpath_hooks._names import KERNELS  # noqa: E402
from support.venvs import ROOT, clean_env  # noqa: E402

SCHEMA_DOC = os.path.join(ROOT, "docs", "json-schema.md")
CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "fastpath-hooks")
HOPPER = "gpu=sm_90,torch=2.11.0,cuda=13.0,triton=3.6.0,python=3.12"

# slow: about forty real `fastpath-hooks` processes (tests/test_events.py and the policy tables are the fast part)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cli-cache"))


# Every subprocess the tests below look at, started together (they are independent), so the
# file costs about one CLI start per core instead of one per case. key -> (argv, extra env, console).
BATCH: dict = {}


def batched(key, *args, console=False, **env):
    BATCH[key] = (args, env, console)
    return key


@pytest.fixture(scope="module")
def runs(cache_dir, tmp_path_factory):
    from concurrent.futures import ThreadPoolExecutor

    # a remembered verdict, so the verdict table of the schema is checked against real output too
    code = ("from fastpath_hooks.facts.settings import Settings; from fastpath_hooks.act.store import VerdictCache\n"
            "assert VerdictCache(Settings.from_env()).record('fla', verdict=('f' * 32, 'failed', 'test verdict'))")
    subprocess.run([sys.executable, "-c", code], env=clean_env(FASTPATH_HOOKS_CACHE_DIR=cache_dir), check=True)
    a_file = str(tmp_path_factory.mktemp("cli-files") / "a-file")
    with open(a_file, "w") as fh:
        fh.write("not a directory")

    def run(item):
        args, env, console = item
        env = {k: (a_file if v == "{a-file}" else v) for k, v in env.items()}
        env.setdefault("FASTPATH_HOOKS_CACHE_DIR", cache_dir)
        argv = [CONSOLE_SCRIPT] if console else [sys.executable, "-m", "fastpath_hooks"]
        return subprocess.run(argv + list(args), env=clean_env(**env), capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(max_workers=max(2, 2 * (os.cpu_count() or 1))) as pool:
        futures = {key: pool.submit(run, item) for key, item in BATCH.items()}
        return {key: future.result() for key, future in futures.items()}


def loaded(result) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


DOCTOR = batched("doctor", "doctor", console=True)
DOCTOR_JSON = batched("doctor-json", "doctor", "--json")
PLAN_JSON = batched("plan-json", "plan", "--json", FASTPATH_HOOKS_TARGET=HOPPER)
PLAN_TEXT = batched("plan-text", "plan", "--target", HOPPER)
PLAN_FLA = batched("plan-fla", "plan", "fla", "flash-linear-attention", "--json", FASTPATH_HOOKS_TARGET=HOPPER)
NO_COMMAND = batched("no-command")
INTERNAL_INDEX = "https://pypi.internal.example/simple"
PLAN_PIP_CONFIG = batched("plan-pip-config", "plan", "--json", FASTPATH_HOOKS_TARGET=HOPPER, PIP_INDEX_URL=INTERNAL_INDEX)
DOCTOR_PIP_CONFIG = batched("doctor-pip-config", "doctor", PIP_INDEX_URL=INTERNAL_INDEX)
INSTALL_DRY_FLA = batched("install-dry-fla", "install", "fla", "--dry-run", FASTPATH_HOOKS_TARGET=HOPPER)
INSTALL_DRY_CAUSAL = batched("install-dry-causal", "install", "causal-conv1d", "--dry-run",
                             FASTPATH_HOOKS_TARGET=HOPPER)


# -- doctor on this CPU machine ------------------------------------------------------------------

def test_doctor_on_a_cpu_machine_says_nothing_will_be_installed_and_why(runs):
    assert os.path.exists(CONSOLE_SCRIPT), "the console script is installed with the package"
    result = runs[DOCTOR]
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Traceback" not in result.stderr
    summary = [line for line in out.splitlines() if line.startswith("Summary: ")]
    assert len(summary) == 1
    assert "nothing will be installed" in summary[0]
    assert "no CUDA/XPU accelerator" in summary[0] or "torch is not installed" in summary[0]
    assert re.search(r"^  accelerator +none - ", out, re.M)
    for kernel in ("fla", "causal-conv1d", "mamba-ssm", "tilelang"):
        assert re.search(rf"^  {kernel}\n    installed .*\n    transformers .*\n    install\(\) +leave it alone - ", out, re.M)
    # the fix is one for every kernel here: said once, after the summary
    assert out.count("run on a machine with a CUDA (or XPU) GPU") == 1
    assert "\nTo change it: run on a machine with a CUDA (or XPU) GPU" in out


# -- the documented JSON schemas -----------------------------------------------------------------

def read_schema_doc() -> dict:
    """{table name: {field: type}} from docs/json-schema.md; `doctor`/`plan` for the top levels."""
    tables: dict = {}
    current = None
    with open(SCHEMA_DOC) as fh:
        for line in fh:
            heading = re.match(r"^## (?:fastpath-hooks\.)?([a-z_]+)(?:/\d+)?\s*$", line)
            if heading:
                current = tables.setdefault(heading.group(1), {})
                continue
            row = re.match(r"^\| `([a-z_0-9]+)` \| ([^|]+) \| (.*) \|$", line)
            if row and current is not None:
                current[row.group(1)] = (row.group(2).strip(), row.group(3).startswith("only "))
    return tables


SCHEMA = read_schema_doc()


def check(value, type_text: str, path: str):
    errors = []
    for alternative in type_text.split(" or "):
        try:
            _check_one(value, alternative.strip(), path)
            return
        except AssertionError as exc:
            errors.append(str(exc))
    raise AssertionError(f"{path}: {value!r} is not {type_text} ({'; '.join(errors)})")


def _check_one(value, type_text: str, path: str):
    simple = {"string": str, "boolean": bool, "object": dict}
    if type_text in simple:
        assert isinstance(value, simple[type_text]), f"{path} is not a {type_text}"
    elif type_text == "number":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{path} is not a number"
    elif type_text == "null":
        assert value is None, f"{path} is not null"
    elif type_text.startswith("list of "):
        assert isinstance(value, list), f"{path} is not a list"
        for i, item in enumerate(value):
            check(item, type_text[len("list of "):], f"{path}[{i}]")
    else:
        check_table(value, type_text, path)


def check_table(value, table: str, path: str):
    fields = SCHEMA[table]
    assert isinstance(value, dict), f"{path} is not an object ({table})"
    undocumented = set(value) - set(fields)
    assert not undocumented, f"{path}: fields missing from docs/json-schema.md ({table}): {sorted(undocumented)}"
    for name, (type_text, optional) in fields.items():
        if name not in value:
            assert optional, f"{path}.{name} is documented as required but missing"
            continue
        check(value[name], type_text, f"{path}.{name}")


def check_document(data: dict, table: str):
    check_table(data, table, table)
    assert data["schema"] == f"fastpath-hooks.{table}/2"
    for kernel, commands in data["commands"].items():
        assert kernel in KERNELS
        check(commands, "list of command", f"{table}.commands.{kernel}")
    for kernel, verdict in data.get("verdicts", {}).items():
        check(verdict, "verdict", f"{table}.verdicts.{kernel}")


def test_schema_doc_has_every_table():
    assert {"plan", "doctor", "environment", "settings", "decision", "step", "command", "activation", "verdict",
            "wheel_cache", "cached_wheel", "packed_sequences", "packed_failure"} <= \
        set(SCHEMA)
    assert all(SCHEMA[name] for name in SCHEMA)


def test_doctor_json_follows_the_documented_schema(runs):
    data = loaded(runs[DOCTOR_JSON])
    check_document(data, "doctor")
    assert data["verdicts"]["fla"]["reason"] == "test verdict"
    assert data["environment"]["accelerator"] is None
    assert "nothing will be installed" in data["summary"]
    assert all(d["action"] == "skip" for d in data["decisions"])


def test_plan_json_follows_the_documented_schema(runs):
    data = loaded(runs[PLAN_JSON])
    check_document(data, "plan")
    assert all(data["commands"][d["kernel"]] for d in data["decisions"] if d["action"] == "install")
    steps = [s for d in data["decisions"] for s in d["steps"]]
    assert {"deps", "kernel", "wheel"} <= {s["kind"] for s in steps}


# -- the acceptance targets, through the environment variable and through --target ---------------

def _by_kernel(data):
    return {d["kernel"]: d for d in data["decisions"]}


def _requirements(data):
    return {r.split("==")[0]: r.split("==")[1] for d in data["decisions"] if d["action"] in ("install", "repair")
            for s in d["steps"] if s["kind"] in ("kernel", "replace") for r in s["requirements"]}


def accept_hopper(data):
    reqs = _requirements(data)
    assert {"fla-core", "flash-linear-attention", "tilelang", "apache-tvm-ffi"} <= set(reqs)
    from fastpath_hooks.facts.pins import load

    pins = load()
    assert reqs["apache-tvm-ffi"] in pins.good_companions("tilelang", reqs["tilelang"])
    assert pins.broken_for("tilelang", reqs["tilelang"], reqs["apache-tvm-ffi"], ("sm_90",)) is None
    assert _by_kernel(data)["fla"]["needs"] == ["tilelang"]
    argv = [" ".join(c["argv"]) for c in data["commands"]["tilelang"]]
    assert any(f"tilelang=={reqs['tilelang']}" in a and f"apache-tvm-ffi=={reqs['apache-tvm-ffi']}" in a
               and "--no-deps" in a for a in argv)


def accept_no_tilelang(data):
    reqs = _requirements(data)
    assert {"fla-core", "flash-linear-attention"} <= set(reqs)
    assert "tilelang" not in reqs and "apache-tvm-ffi" not in reqs
    decisions = _by_kernel(data)
    assert decisions["tilelang"]["action"] == "skip" and decisions["fla"]["needs"] == []


def accept_rocm(data):
    decisions = _by_kernel(data)
    assert decisions["tilelang"]["action"] == "skip" and "ROCm" in decisions["tilelang"]["reason"]
    assert decisions["fla"]["env"] == {"FLA_TILELANG": "0"}
    assert "tilelang" not in _requirements(data)


def accept_nothing(data):
    assert all(d["action"] == "skip" for d in data["decisions"])
    assert all(not c for c in data["commands"].values())
    assert "nothing will be installed" in data["summary"]


ACCEPTANCE = [
    (HOPPER, accept_hopper),
    ("gpu=sm_80,torch=2.11.0,cuda=13.0,triton=3.6.0,python=3.12", accept_no_tilelang),
    ("gpu=sm_90,torch=2.11.0,cuda=13.0,triton=3.7.1,python=3.12", accept_no_tilelang),
    ("hip=6.4,gpu=gfx942,torch=2.9.1,triton=3.5.0,python=3.12", accept_rocm),
    ("hip=6.4,gpu=gfx942", accept_rocm),
    ("gpu=none", accept_nothing),
    ("gpu=none,torch=2.11.0,cuda=13.0,triton=3.6.0,python=3.12", accept_nothing),
]


for _spec, _ in ACCEPTANCE:
    batched(f"env:{_spec}", "plan", "--json", FASTPATH_HOOKS_TARGET=_spec)
    batched(f"flag:{_spec}", "plan", "--json", "--target", _spec)


@pytest.mark.parametrize("spec,accept", ACCEPTANCE, ids=[s for s, _ in ACCEPTANCE])
@pytest.mark.parametrize("via", ["env", "flag"])
def test_acceptance_targets(spec, accept, via, runs):
    data = loaded(runs[f"{via}:{spec}"])
    assert data["settings"]["target"] == spec
    assert data["environment"]["posed"]
    accept(data)


def test_plan_text_shows_the_commands(runs):
    result = runs[PLAN_TEXT]
    assert result.returncode == 0, result.stderr
    assert re.search(r"^tilelang: install - .*fla#640", result.stdout, re.M)
    assert re.search(r"--no-deps .*tilelang==\S+ apache-tvm-ffi==\S+$", result.stdout, re.M)
    assert result.stdout.rstrip().splitlines()[-1].startswith("Summary: install() would install fla")


def test_plan_for_some_kernels(runs):
    data = loaded(runs[PLAN_FLA])
    assert [d["kernel"] for d in data["decisions"]] == ["fla"]


def _kernel_lines(result) -> list:
    assert result.returncode == 0, result.stderr
    return [line.split(":")[0] for line in result.stdout.splitlines()
            if re.match(r"^(fla|causal-conv1d|mamba-ssm|tilelang): [a-z]+ - ", line)]


def test_install_dry_run_shows_the_kernels_asked_for_and_what_they_need(runs):
    # fla needs tilelang on this Hopper target (the hazard), so its dry run shows both
    assert _kernel_lines(runs[INSTALL_DRY_FLA]) == ["fla", "tilelang"]
    assert _kernel_lines(runs[INSTALL_DRY_CAUSAL]) == ["causal-conv1d"]
    assert "tilelang==" not in runs[INSTALL_DRY_CAUSAL].stdout and "fla-core==" not in runs[INSTALL_DRY_CAUSAL].stdout


# -- auto mode and pip's own index configuration -------------------------------------------------

def test_auto_uses_uv_without_pip_configuration_and_pip_with_it(runs):
    plain = loaded(runs[PLAN_JSON])
    assert plain["environment"]["uv"] and plain["environment"]["pip_index_config"] is None
    assert (plain["installer"], plain["installer_reason"]) == ("uv", "auto: uv found")
    configured = loaded(runs[PLAN_PIP_CONFIG])
    check_document(configured, "plan")
    assert configured["environment"]["pip_index_config"] == "PIP_INDEX_URL"
    assert configured["installer"] == "pip" and "PIP_INDEX_URL" in configured["installer_reason"]
    assert all(c["argv"][1:3] == ["-m", "pip"] for cmds in configured["commands"].values() for c in cmds)
    doctor = runs[DOCTOR_PIP_CONFIG]
    assert doctor.returncode == 0, doctor.stderr
    row = next(line for line in doctor.stdout.splitlines() if line.startswith("  installer "))
    assert re.match(r"^  installer +pip - auto: pip's configuration names an index or find-links \(PIP_INDEX_URL\), "
                    r"which uv would ignore$", row), row


# -- bad input: exit 2, the message, no traceback ------------------------------------------------

BAD_ENV = {
    "FASTPATH_HOOKS_DISABLE": "maybe",
    "FASTPATH_HOOKS_SKIP": "flaa",
    "FASTPATH_HOOKS_MODE": "dry-run",
    "FASTPATH_HOOKS_FIND_LINKS": "/nonexistent/wheelhouse",
    "FASTPATH_HOOKS_OFFLINE": "sometimes",
    "FASTPATH_HOOKS_INDEX_URL": "pypi.org/simple",
    "FASTPATH_HOOKS_INSTALLER": "conda",
    "FASTPATH_HOOKS_TIMEOUT": "ten",
    "FASTPATH_HOOKS_ALLOW_BUILD": "please",
    "FASTPATH_HOOKS_SPLIT_COMPILE": "yes",
    "FASTPATH_HOOKS_CACHE_DIR": "{a-file}",
    "FASTPATH_HOOKS_PINS": "/nonexistent/pins.json",
    "FASTPATH_HOOKS_TARGET": "gpu=hopper",
    "FASTPATH_HOOKS_LOG": "verbose",
    "FASTPATH_HOOKS_CAUSAL_CONV1D_WHEEL_URL": "github.com/releases",
    "FASTPATH_HOOKS_MAMBA_SSM_WHEEL_URL": "s3://bucket/mamba",
    "FASTPATH_HOOKS_FLASH_ATTN_WHEEL_URL": "ftp://mirror/flash-attn",
    "FASTPATH_HOOKS_RETRY_AFTER": "-1",
    "FASTPATH_HOOKS_LOCK_TIMEOUT": "0",
    "FASTPATH_HOOKS_OFLINE": "1",
}


def test_bad_env_table_covers_every_variable():
    from fastpath_hooks.facts.settings import VARIABLES

    assert set(VARIABLES) <= set(BAD_ENV)


for _name, _value in BAD_ENV.items():
    batched(f"bad:{_name}", "plan", **{_name: _value})


@pytest.mark.parametrize("name", sorted(BAD_ENV))
def test_bad_env_value_exits_2_with_a_clear_message(name, runs):
    result = runs[f"bad:{name}"]
    value = BAD_ENV[name]
    if value == "{a-file}":
        value = result.stderr.split(f"{name}=", 1)[1].split(" is not valid")[0].strip("'")
        if "..." in value:   # a long temporary path, cut in the middle to keep the line <= 160 characters
            head, tail = value.split("...")
            assert head.startswith("/") and tail.endswith("/a-file") and len(result.stderr.strip()) <= 160
        else:
            assert os.path.isfile(value)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastpath-hooks: ")
    assert f"{name}={value!r} is not valid: " in lines[0]


BAD_ARGS = [
    (["plan", "--target", "gpu=sm_90,torch=latest"], "--target='gpu=sm_90,torch=latest' is not valid: 'torch=latest'"),
    (["doctor", "--target", "cuda"], "--target='cuda' is not valid: expected key=value"),   # the entry is the value: said once
    (["plan", "mamba"], "unknown kernel 'mamba'"),
]
for _args, _ in BAD_ARGS:
    batched(" ".join(_args), *_args)


@pytest.mark.parametrize("args,fragment", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_arguments_exit_2(args, fragment, runs):
    result = runs[" ".join(args)]
    assert result.returncode == 2 and fragment in result.stderr
    assert "Traceback" not in result.stderr


def test_no_command_prints_help_and_exits_2(runs):
    result = runs[NO_COMMAND]
    assert result.returncode == 2 and "doctor" in result.stdout and "plan" in result.stdout

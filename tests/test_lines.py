"""Every line the policy can make fits the width with its reason and its fix whole - short by design,
never by cutting (issue 17, defect 2).

- every rule id declared in decide/messages.py has a short form (`line=`, `fix=`);
- the policy's real decisions for every rule (the rows of tests/test_policy.py, which cover every
  declared rule, those other branches add included) made again with the longest realistic inputs -
  long paths, long version strings, wheelhouses full of long wheel names, many missing requirements -
  give lines of at most MAX_LINE characters that name the kernel, the outcome, the reason's facts
  (every slot of the rule's templates, whole) and the fix, and that events.fit leaves alone;
- the engine says exactly those lines (the same rows through the real state machine in a TableWorld);
- a build says its estimate and how to build ahead of time.
"""

from __future__ import annotations

import dataclasses
import os
import re
import string

import pytest

from fastpath_hooks import engine, events
from fastpath_hooks.decide import messages as rule_ids
from fastpath_hooks.events import MAX_LINE, PREFIX, fit
from fastpath_hooks.facts.settings import Settings
from support.worlds import TableWorld
from test_cli_fast import clean  # noqa: F401 - the fixture of a CLI run in this process, speaking for the node
from test_policy import BASE, PINS, ROWS, make_env, plan_for

HOME = "/home/a.very.long.user.name/projects/2026-12/hybrid-linear-attention-finetuning"
CACHE = "/lustre/fsw/portfolios/llmservice/users/a.very.long.user.name/.cache/fastpath-hooks"
NVCC = "/opt/nvidia/hpc_sdk/Linux_x86_64/25.5/compilers/cuda/12.8/bin/nvcc"
LONG_WHEELS = (   # names a real wheelhouse holds beside the kernels' (none of them fits a kernel here)
    "causal_conv1d-1.7.0+cu13torch2.10cxx11abiTRUE-cp312-cp312-linux_x86_64.whl",
    "causal_conv1d-1.6.2.post1+cu13torch2.11cxx11abiFALSE-cp313-cp313-linux_aarch64.whl",
    "mamba_ssm-2.3.2.post1+cu13torch2.12cxx11abiTRUE-cp313-cp313-linux_aarch64.whl",
    "nvidia_cudnn_cu12-9.10.2.21-py3-none-manylinux_2_27_x86_64.whl",
    "nvidia_cusparselt_cu12-0.7.1-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    "flash_attn-2.8.3+cu12torch2.10cxx11abiTRUE-cp312-cp312-linux_x86_64.whl",
)
LONG_CACHED = ("causal_conv1d-1.6.2.post1+fph.torch2.12.0.cu130.abi1.sm100.sm120-cp313-cp313-linux_aarch64.whl",)


# -- the longest realistic inputs: each changes one kind of fact, none is meant to change the rule -----

def long_paths(env: dict, dists: dict, settings: dict):
    """A venv and a cache deep in a cluster's home directory, a toolkit deep in the HPC SDK, three long
    FASTPATH_HOOKS_FIND_LINKS directories, mirrors with long URLs."""
    env = {**env, "wheel_cache": CACHE + "/wheels", "prefix": HOME + "/.venv"}
    if str(env.get("nvcc", BASE["nvcc"])).startswith("/"):   # a toolkit's (not the nvcc wheel, not posed)
        env["nvcc"] = NVCC
    if env.get("hipcc"):
        env["hipcc"] = "/opt/rocm-6.4.1/lib/llvm/bin/../../bin/hipcc"
    settings = {**settings, "cache_dir": CACHE, "pins_file": HOME + "/config/fastpath-hooks-pins.toml",
                "wheel_urls": {"causal-conv1d": "https://artifactory.example.com/artifactory/api/github-mirror/"
                               "Dao-AILab/causal-conv1d/releases/download/v1.6.2.post1/"}}
    if settings.get("find_links"):
        settings["find_links"] = tuple(f"{HOME}/wheelhouses/{n}-cu128-torch2.10-py312" for n in ("kernels", "deps", "extra"))
    return env, dists, settings


def long_versions(env: dict, dists: dict, settings: dict):
    """torch with its build's local label (2.10.0+cu128), a nightly triton (3.6.0+git...), a dev
    transformers, a two-digit Python patch, installed compiled kernels with their release wheels' labels."""
    torch = env.get("torch", BASE["torch"])
    if torch is None:
        return env, dists, settings
    cuda, hip = env.get("torch_cuda", BASE["torch_cuda"]), env.get("torch_hip")
    label = f"cu{cuda.replace('.', '')}" if cuda else f"rocm{hip}" if hip else "xpu" if env.get("torch_xpu") else "cpu"
    env = {**env, "torch": f"{torch}+{label}"}
    triton = env.get("triton", BASE["triton"])
    if triton:
        env["triton"] = f"{triton}+git9a7cd3e2"
    python = env.get("python", BASE["python"])
    env["python"] = ".".join(python.split(".")[:2]) + ".11"
    dists = dict(dists)
    transformers = dists.get("transformers", "5.24.0")
    if transformers:
        dists["transformers"] = f"{transformers}.dev0"
    for name in ("causal-conv1d", "mamba-ssm"):
        version = dists.get(name)
        if version and "+" not in version:
            dists[name] = f"{version}+cu12torch2.10cxx11abiTRUE"
    return env, dists, settings


def many_files(env: dict, dists: dict, settings: dict):
    return ({**env, "wheelhouse": tuple(env.get("wheelhouse", ())) + LONG_WHEELS,
             "cached_wheels": tuple(env.get("cached_wheels", ())) + LONG_CACHED}, dists, settings)


def many_missing(env: dict, dists: dict, settings: dict):
    """Offline, and the dependencies a kernel needs are not installed either: more for the wheelhouse to lack."""
    if not settings.get("offline"):
        return env, dists, settings
    return env, {**dists, "einops": None, "packaging": None}, settings


LENGTHENERS = (long_paths, long_versions, many_files, many_missing)


def decided(row, env, dists, settings):
    s = dataclasses.replace(Settings(), **settings)
    environment = make_env(dists, **env)
    pins = row.pins or PINS
    if row.via is not None:
        d = row.via(environment, s, pins)
        return environment, s, pins, d, None
    plan = plan_for(environment, s, pins)
    return environment, s, pins, plan[row.kernel], plan


def lengthened(row):
    """The row's decision with every lengthener that leaves its rule as it is (applied one after another)."""
    env, dists, settings, applied = dict(row.env), dict(row.dists), dict(row.settings), []
    for lengthen in LENGTHENERS:
        longer = lengthen(env, dists, settings)
        if decided(row, *longer)[3].rule == row.rule:
            (env, dists, settings), applied = longer, applied + [lengthen.__name__]
    return decided(row, env, dists, settings), applied, (env, dists, settings)


def _fields(template: str) -> list:
    return [f for _, f, _, _ in string.Formatter().parse(template.replace("[", "").replace("]", "")) if f]


def lines_of(d, environment, settings, pins):
    """(rule id, line, the values its templates named) of what the start-up says for this decision:
    a machine-wide skip once for every kernel, else the kernel's line; its repair's too."""
    from fastpath_hooks.decide import messages as short
    from fastpath_hooks.decide.common import Context

    ctx = Context(environment, settings, pins, False)
    short.strict(ctx, d)      # a KeyError naming the rule that has no short form, or a slot nobody fills
    values = short.slots(ctx, d)
    rule = rule_ids.lookup(pins, d.rule)
    named = {f: values[f] for f in _fields(rule.line) + _fields(rule.fix) if values.get(f)}
    said = [(d.rule, short.machine_line(d) if rule.machine_wide else short.line(d), named, d)]
    if d.repair is not None:
        said.append((d.repair.rule, short.line(d.repair), {"target": short.versions(pins.kernel(d.kernel),
                                                                                    d.repair.target)}, d.repair))
    return said


def assert_whole_and_short(rule: str, line: str, named: dict, d) -> None:
    from fastpath_hooks.decide import messages as short

    where = f"{rule}: {PREFIX + line!r} ({len(PREFIX + line)} characters)"
    assert len(PREFIX + line) <= MAX_LINE, f"over {MAX_LINE}: {where} - shorten its templates in decide/messages.py"
    assert fit(line) == PREFIX + line and "..." not in line, f"events.fit would cut it: {where}"
    assert d.short_reason and d.short_reason in line, f"no short reason: {where}"
    assert d.short_fix in line, f"its fix {d.short_fix!r} is not whole: {where}"
    outcome = short.MACHINE_WIDE if line.startswith(short.MACHINE_WIDE) else f"{d.kernel}: {short.outcome(d)} - "
    assert outcome in line, f"no kernel and outcome {outcome!r}: {where}"
    for slot, value in named.items():
        assert value in line, f"the fact {slot}={value!r} is not whole: {where}"


def without_short_form() -> list:
    """Every rule of every kind (also those no shipped kernel gets) that declares no line or fix template."""
    tables = {rule_ids.SHARED_SCOPE: rule_ids.SHARED, **{f"<{kind} prefix>": t for kind, t in rule_ids.KINDS.items()}}
    return [f"{scope}.{template}" for scope, table in tables.items() for template, rule in table.items()
            if rule.line is None or rule.fix is None] + [rule for rule, r in rule_ids.FORWARD.items()
                                                         if r.line is None or r.fix is None]


def test_every_declared_rule_has_a_short_form():
    missing = without_short_form()
    assert not missing, (f"rules without a short form: {missing} - give each `line=` (the reason, short) and `fix=` "
                         "(\"\" where the user can change nothing) in decide/messages.py; docs/safety.md#messages")


def test_a_rule_without_a_short_form_is_named(monkeypatch):
    """What a merged branch's new rule meets: the rule is named, by the table check and by the walk."""
    monkeypatch.setitem(rule_ids.PURE, "numeric.block", rule_ids.Rule(events.Severity.WARNING))
    assert without_short_form() == ["<pure prefix>.numeric.block"]
    monkeypatch.setitem(rule_ids.PURE, "offline-missing", rule_ids.Rule(events.Severity.STATUS))
    monkeypatch.setattr(rule_ids, "_declared", {})    # declared() again from the tables
    from fastpath_hooks.decide import messages as short

    row = next(r for r in ROWS if r.rule == "fla.offline-missing")
    environment, settings, pins, d, _ = decided(row, row.env, row.dists, row.settings)
    assert d.short_reason == "" and short.line(d) == f"fla: not installed - {d.reason} ({d.fix})"   # the whole, fitted
    with pytest.raises(KeyError, match="rule 'fla.offline-missing': no short form"):
        lines_of(d, environment, settings, pins)


def test_every_rule_is_said_within_the_width_with_its_reason_and_fix():
    said, lengthened_by, problems = {}, {}, []
    for row in ROWS:
        (environment, settings, pins, d, _), applied, _ = lengthened(row)
        lengthened_by[row.id] = applied
        try:
            for rule, line, named, decision in lines_of(d, environment, settings, pins):
                assert_whole_and_short(rule, line, named, decision)
                said.setdefault(rule, (line, applied))
        except (AssertionError, KeyError) as exc:
            problems.append(f"{row.id}: {exc}")
    assert not problems, "\n".join(problems)
    declared = set(rule_ids.declared(PINS))
    assert declared - set(said) == set(), f"rules no row said: {sorted(declared - set(said))}"
    # the long inputs were really there: long paths everywhere, long versions nearly everywhere
    assert all("long_paths" in applied for applied in lengthened_by.values()), \
        [r for r, a in lengthened_by.items() if "long_paths" not in a]
    assert sum("long_versions" in a for a in lengthened_by.values()) > 0.8 * len(ROWS)
    assert any("many_missing" in a for a in lengthened_by.values())
    longest = max(said.items(), key=lambda item: len(item[1][0]))
    print(f"{len(said)} rules; the longest line ({len(PREFIX + longest[1][0])} characters): {longest[0]}: {longest[1][0]}")


# -- a kernel's line composed with its dependency's reason (issue 34, defect 3) ------------------

FLA_INSTALLED = {"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"}


def _composing(pins) -> set:
    """The rule ids whose line is composed with a dependency's short reason and fix (`{hazard_line}`:
    fla's under fla#640, with tilelang's)."""
    return {rule for rule, r in rule_ids.declared(pins).items() if r.line and "{hazard_line}" in r.line}


def _variants(row):
    """The row as it is, and with the kernel a hazard concerns installed and not (fla's hazard.skip and
    hazard.block compose the same dependency's reasons): each as a row of its own decision's rule."""
    out = [row]
    for dists in ({**row.dists, **FLA_INSTALLED}, {**row.dists, **{d: None for d in FLA_INSTALLED}}):
        if all(row.dists.get(d) == v for d, v in dists.items()):
            continue   # the row as it is
        variant = dataclasses.replace(row, dists=dists)
        out.append(dataclasses.replace(variant, rule=decided(variant, variant.env, variant.dists, variant.settings)[3].rule))
    return out


def _dependency_missing(row) -> bool:
    """A hazard applies in the row, and the kernel it needs is skipped or blocked (what a composed line says)."""
    from fastpath_hooks.decide.common import Context
    from fastpath_hooks.decide.plan import BLOCK, SKIP

    environment, settings, pins, _, plan = decided(row, row.env, row.dists, row.settings)
    ctx = Context(environment, settings, pins, False)
    return any(ctx.hazards(hz.kernel) and plan[hz.needs].action in (SKIP, BLOCK) for hz in pins.hazards)


def _kept_parts(template: str, values: dict) -> list:
    """The parts of a rule's line a compact form must keep: its text outside `[...]`, filled."""
    from fastpath_hooks.decide import messages as short

    return [short.fill(part, values) for part in re.split(r"\[[^\[\]]*\]", template) if part.strip(" ;,")]


def test_every_line_composed_with_a_dependencys_reason_keeps_both_within_the_width():
    """fla's line under fla#640 names why tilelang is missing and tilelang's fix (`fla: not installed - fla#640
    ... needs tilelang: offline; ... lacks a known-good pair (fastpath-hooks download gets them)`). Every pair of
    a composing rule and a dependency's rule the rows reach - each row also with fla installed and not - with the
    longest realistic inputs: within the width, the hazard, the dependency's reason (its text outside `[...]`,
    the rest goes first) and its fix whole."""
    from fastpath_hooks.decide import messages as short
    from fastpath_hooks.decide.common import Context
    from fastpath_hooks.decide.plan import BLOCK, SKIP

    composing = _composing(PINS)
    assert composing == {"fla.hazard.skip", "fla.hazard.block"}, composing
    pairs, under_hazard, problems = {}, set(), []
    for row in (r for r in ROWS if r.via is None and _dependency_missing(r)):
        for variant in _variants(row):
            (environment, settings, pins, _, plan), _, _ = lengthened(variant)
            ctx = Context(environment, settings, pins, False)
            for hz in pins.hazards:
                dep = plan[hz.needs]
                if dep.action in (SKIP, BLOCK) and ctx.hazards(hz.kernel) and hz.kernel not in settings.skip:
                    under_hazard.add(dep.rule)
            for d in plan.decisions.values():
                if d.rule not in composing:
                    continue
                hz = next(h for h in pins.hazards if h.id == d.facts["hazard"] and h.kernel == d.kernel)
                dep = plan[hz.needs]
                line = short.line(d)
                where = f"{row.id}: {d.rule} + {dep.rule}: {PREFIX + line!r} ({len(PREFIX + line)} characters)"
                values = short.slots(ctx, dep)
                dep_rule = rule_ids.lookup(pins, dep.rule)
                kept = _kept_parts(dep_rule.line, values) if dep_rule and dep_rule.line else [dep.reason.split("; ")[0]]
                checks = {f"within {MAX_LINE}": len(PREFIX + line) <= MAX_LINE and fit(line) == PREFIX + line,
                          "the kernel and outcome": line.startswith(f"{d.kernel}: {short.outcome(d)} - "),
                          "the hazard": f"{hz.id} " in line and f"needs {hz.needs}: " in line,
                          "the dependency's reason": all(part in line for part in kept),
                          "its fix": line.endswith(f" ({dep.short_fix or hz.fix})"),
                          "nothing cut": "..." not in line}
                failed = [name for name, ok in checks.items() if not ok]
                if failed:
                    problems.append(f"{where}: not {', '.join(failed)} (kept: {kept})")
                pairs.setdefault((d.rule, dep.rule), line)
    assert not problems, "\n".join(problems)
    composed = {dep for _, dep in pairs}
    assert under_hazard and under_hazard <= composed, f"never composed: {sorted(under_hazard - composed)}"
    assert {rule for rule, _ in pairs} == composing
    longest = max(pairs.values(), key=len)
    print(f"{len(pairs)} pairs; the longest ({len(PREFIX + longest)} characters): {longest}")


# -- the engine says exactly these lines --------------------------------------------------------

@pytest.fixture
def speaking(monkeypatch, tmp_path):
    """This process speaks for the node; the variables decisions set (FLA_TILELANG=0 on ROCm) are undone."""
    import os

    saved = dict(os.environ)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("FASTPATH_HOOKS_LOG", raising=False)
    heard = []
    events.add_listener(heard.append)
    yield heard
    events.clear_listeners()
    events.forget()
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("mode", ["install", "report"])
def test_the_engine_says_every_rules_line_whole(mode, speaking, monkeypatch, tmp_path, capsys):
    """Each row through the real state machine (a TableWorld: the real policy, verdict cache and said-markers):
    every line printed is the event's own message, uncut, within the width."""
    problems, printed = [], 0
    for i, row in enumerate(r for r in ROWS if r.via is None):
        (environment, settings, pins, d, _), _, (env, dists, over) = lengthened(row)
        monkeypatch.setenv("FASTPATH_HOOKS_CACHE_DIR", str(tmp_path / f"said-{mode}-{i}"))
        world = TableWorld(environment, tmp_path / f"{mode}-{i}", settings=dataclasses.replace(settings, mode=mode),
                           pins=pins)
        events.forget()
        speaking.clear()
        world.run(row.kernel)
        messages = {e["message"] for e in speaking}
        for line in capsys.readouterr().err.splitlines():
            if not line.startswith(PREFIX):
                continue
            printed += 1
            if len(line) > MAX_LINE or line[len(PREFIX):] not in messages:
                problems.append(f"{row.id}: {line!r} ({len(line)} characters)")
    engine.use_world(None)
    assert not problems, "\n".join(problems)
    assert printed > len(ROWS) / 2


# -- a build says its estimate and how to build ahead of time -------------------------------------

BUILD_ROWS = [r for r in ROWS if r.rule in ("causal.build", "mamba.build", "causal.build.timeout", "mamba.build.timeout")]


@pytest.mark.parametrize("row", BUILD_ROWS, ids=[r.id for r in BUILD_ROWS])
def test_a_build_line_keeps_its_estimate_and_how_to_build_ahead(row, speaking, monkeypatch, tmp_path, capsys):
    (environment, settings, pins, d, _), applied, _ = lengthened(row)
    assert "long_paths" in applied and "long_versions" in applied
    monkeypatch.setenv("FASTPATH_HOOKS_CACHE_DIR", str(tmp_path / "said"))
    TableWorld(environment, tmp_path, settings=settings, pins=pins).run(row.kernel)
    engine.use_world(None)
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"{PREFIX}{row.kernel}: ")]
    estimate = re.search(r"about (\d+ (?:min|s))", d.reason).group(1)   # the policy's whole reason says it
    estimated = [line for line in said if "estimated" in line]
    assert estimated, f"no line says the estimate: {said}"
    line = estimated[0]
    assert len(line) <= MAX_LINE and line == fit(line[len(PREFIX):]), line
    assert f"an estimated {estimate}" in line, (estimate, line)
    assert f"fastpath-hooks build {row.kernel}" in line, line


# -- a later start reminds in one line (real processes) ---------------------------------------------

# The kernel's import, as era C's modeling import makes it (the finder decides fla first)
START = "import importlib.util, fastpath_hooks; fastpath_hooks.install(); importlib.util.find_spec('fla')"
HOPPER_NO_NVCC = "gpu=sm_90,cuda=12.8,torch=2.10.0,triton=3.6.0,nvcc=no"   # fla#640 applies, tilelang cannot be had


def start(env: dict, *args) -> list:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, *(args or ("-c", START))], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return [line for line in (proc.stderr if not args else proc.stdout).splitlines()   # the posed target's own
            if args or (line.startswith(PREFIX) and not line.startswith(f"{PREFIX}posing "))]   # line aside


def test_a_later_start_names_the_missing_kernel_and_doctor_in_one_line(tmp_path):
    from support import venvs

    env = venvs.clean_env(FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"), FASTPATH_HOOKS_TARGET=HOPPER_NO_NVCC,
                          LOCAL_RANK="0")
    first = start(env)
    assert len(first) == 1, first
    (line,) = first
    assert len(line) <= MAX_LINE and not line.endswith("..."), line
    assert line.startswith(f"{PREFIX}fla: not installed - ")                  # the kernel and the outcome
    assert all(part in line for part in ("fla#640", "sm_90", "triton 3.6.0", "tilelang", "no nvcc")), line  # why
    assert line.endswith("(set CUDA_HOME to a CUDA toolkit)"), line           # and the fix, whole
    reminder = f"{PREFIX}fla not in use (torch path): see fastpath-hooks doctor"
    assert start(env) == [reminder]                       # not the whole line again, and not nothing
    assert start(dict(env, LOCAL_RANK="1")) == []        # another rank of the node says nothing
    assert start(env) == [reminder]                       # every later start, while fla stays missing
    # the debug log has the whole line, and doctor - where the reminder points - the whole reason and fix
    debug = start(dict(env, FASTPATH_HOOKS_LOG="debug"))
    assert any("(said before)" in d and "computes fla's backward wrongly" in d and "CUDA_HOME" in d for d in debug), debug
    doctor = "\n".join(start(env, "-m", "fastpath_hooks", "doctor"))
    assert "computes fla's backward wrongly" in doctor and "point CUDA_HOME at one" in doctor, doctor


# -- the lines the engine says about settings, the cache and measured numbers ---------------------

LONG_DIR = HOME + "/wheelhouses/kernels-cu128-torch2.10-py312-built-on-the-login-node-2026-11-30"
BAD_SETTINGS = [   # (variables, what the line must keep whole: the variable, the outcome, what is accepted)
    ({"FASTPATH_HOOKS_LOG": "verbose"}, ["FASTPATH_HOOKS_LOG=", "is not valid, so nothing is installed",
                                         "off, error, warning, info, debug"]),
    ({"FASTPATH_HOOKS_FIND_LINKS": LONG_DIR}, ["FASTPATH_HOOKS_FIND_LINKS", "is not valid, so nothing is installed",
                                                "is not a directory"]),
    ({"FASTPATH_HOOKS_SKIP": "bogus-kernel-name-from-an-old-config", "FASTPATH_HOOKS_LOG": "verbose"},
     ["FASTPATH_HOOKS_", "is not valid, so nothing is installed (and 1 more)"]),
]


def said_lines(capsys) -> list:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith(PREFIX)]


@pytest.mark.parametrize("variables,kept", BAD_SETTINGS, ids=[",".join(v) for v, _ in BAD_SETTINGS])
def test_an_invalid_setting_is_one_line_within_the_width(variables, kept, speaking, capsys):
    from fastpath_hooks.engine.context import bad_settings, value_once
    from fastpath_hooks.facts.settings import Settings, SettingsError

    with pytest.raises(SettingsError) as caught:
        Settings.from_env(variables)
    bad_settings(caught.value)
    (line,) = said_lines(capsys)
    assert len(line) <= MAX_LINE and fit(line[len(PREFIX):]) == line, line
    assert all(part in line for part in kept), (kept, line)
    var, value, why = caught.value.problems[0]
    whole = speaking[-1].get("detail", speaking[-1]["message"])   # the event (on_event, the debug log) has it whole
    assert f"{var}={value!r} is not valid" in whole and value_once(value, why) in whole, whole


def test_an_unusable_cache_dir_says_the_fallback_and_the_fix_within_the_width(speaking, capsys, monkeypatch, tmp_path):
    from fastpath_hooks.engine.context import unusable_cache_dir

    monkeypatch.setenv("FASTPATH_HOOKS_CACHE_DIR", str(tmp_path / "cache"))   # where the said-marker goes
    from fastpath_hooks.facts.settings import Settings

    settings = Settings.from_env({"FASTPATH_HOOKS_CACHE_DIR": "/proc/nope" + CACHE, "HOME": HOME,
                                  "XDG_CACHE_HOME": CACHE + "/../../xdg-cache-of-this-very-long-user"})
    assert settings.cache_dir_unusable and settings.cache_dir is None
    unusable_cache_dir(settings)
    (line,) = said_lines(capsys)
    assert len(line) <= MAX_LINE, line
    assert line.startswith(f"{PREFIX}FASTPATH_HOOKS_CACHE_DIR") and "cannot be created" in line, line
    assert "instead" in line and line.endswith("(set it to a directory you can write)"), line
    assert speaking[-1]["detail"] == settings.cache_dir_unusable    # whole, with both paths


@pytest.mark.parametrize("detail", [
    "on sm_90, causal_conv1d_fn forward differs from torch by 0.53 (tolerance 0.05 + 1%)",
    "on sm_90+sm_100 (CPU tensors), mamba_chunk_scan_combined forward+backward differs from torch by 0.031, "
    "relative error 0.12 (tolerance 0.05)",
])
@pytest.mark.parametrize("kernel", ["causal-conv1d", "mamba-ssm", "fla"])
def test_a_measured_error_is_said_with_the_fix_within_the_width(kernel, detail):
    """The engine's line when a check measures wrong numbers, and the policy's at the next start."""
    from fastpath_hooks.decide import messages as short
    from fastpath_hooks.decide.common import numeric_measured
    from fastpath_hooks.decide.messages import NUMERIC_SHORT_FIX

    said = numeric_measured(kernel, detail, "sm_90")
    line = PREFIX + short.compose(kernel, short.BLOCKED, said, NUMERIC_SHORT_FIX)
    assert len(line) <= MAX_LINE and fit(line[len(PREFIX):]) == line, line
    assert line.endswith(f"({NUMERIC_SHORT_FIX})") and "..." not in line, line
    assert said in (detail, detail.split(" (tolerance")[0]) or "sm_90" in said, said
    if len(detail) < 90 and kernel != "causal-conv1d":
        assert "differs from torch by" in said, said       # the measure itself whenever it fits


# -- a handed-over error keeps the error itself (issue 34, defect 3) ---------------------------------

SITE = HOME + "/.venv/lib/python3.12/site-packages"
WHEEL = "causal_conv1d-1.6.2.post1+cu12torch2.10cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
HANDED_OVER = [   # (what the installer or the download hands over, as the real parts compose it; what must stay)
    (f"Processing /tmp/fph-work/{WHEEL}\nInstalling collected packages: causal-conv1d\nERROR: Could not install "
     f"packages due to an OSError: [Errno 28] No space left on device: '{SITE}/causal_conv1d_cuda.cpython-312-x86_64-"
     "linux-gnu.so'\n", "pip", "[Errno 28] No space left on device"),
    (f"Resolved 1 package in 3ms\nerror: Failed to install: {WHEEL} (causal-conv1d==1.6.2.post1)\n  Caused by: failed "
     f"to write to file `{SITE}/causal_conv1d_cuda.cpython-312-x86_64-linux-gnu.so`: No space left on device (os error "
     "28)\n", "uv", "No space left on device (os error 28)"),
    (None, None, "Connection refused"),
]


@pytest.mark.parametrize("output, installer, kept", HANDED_OVER, ids=["pip-disk-full", "uv-disk-full", "download-refused"])
def test_an_install_failure_line_keeps_the_error_itself(output, installer, kept, speaking, monkeypatch, tmp_path,
                                                        capsys):
    """The disk-full install line ended `ERROR: Could...` before "No space left on device"; a refused download
    ended in the middle of its URL. What failed (its start), the error itself and the pointer stay."""
    from fastpath_hooks.act.runner import summary
    from support.worlds import environment

    if output is None:   # act/fetch.py's words, the mirror's own variable named after them
        url = "http://127.0.0.1:40221/files/" + WHEEL.replace("+", "%2B")
        text = (f"could not download {url}: <urlopen error [Errno 111] Connection refused> "
                "(FASTPATH_HOOKS_CAUSAL_CONV1D_WHEEL_URL points at a mirror)")
    else:                # act/installer.py's: the step's label, the installer's exit, its output's summary
        text = f"installing {WHEEL} failed ({installer} exit {1 if installer == 'pip' else 2}): {summary(output)}"
    monkeypatch.setenv("FASTPATH_HOOKS_CACHE_DIR", str(tmp_path / "said"))
    world = TableWorld(environment(), tmp_path, settings=Settings())
    world.install_error = text
    assert world.run("causal-conv1d").outcome.state == "failed"
    engine.use_world(None)
    (line,) = [ln for ln in said_lines(capsys) if "could not install" in ln]
    assert len(line) <= MAX_LINE and line == fit(line[len(PREFIX):]), line
    assert kept in line and line.endswith("(the whole: fastpath-hooks doctor)"), line
    assert line.startswith(f"{PREFIX}causal-conv1d: could not install - {text.split()[0]} "), line   # what failed


# -- the commands' own lines keep their fix whole (issue 40, defect 6) -------------------------------

def _whole(line: str, fix: str) -> None:
    """One line of at most MAX_LINE characters, nothing cut, ending with its fix whole."""
    where = f"{line!r} ({len(line)} characters)"
    assert line.startswith(PREFIX) and len(line) <= MAX_LINE, where
    assert fit(line[len(PREFIX):]) == line and "..." not in line, f"cut: {where}"
    assert fix in line, f"its fix {fix!r} is not whole: {where}"


@pytest.mark.parametrize("args,said,fix", [
    ((), "a build needs CUDA (or ROCm) torch and nvcc, no GPU: torch 2.13.0+cpu is a",
     "(install the torch it runs with, or --target cuda=12.8)"),
    (("--arch", "sm_999", "--target", "cuda=12.8"), "--arch sm_999: sm_999 is not a CUDA GPU arch",
     "known: sm_35 37 50 "),
    (("--arch", "sm_9x", "--target", "cuda=12.8"), "--arch sm_9x: a GPU is sm_XY", "gfxNNN (ROCm) or none"),
], ids=["cpu-torch", "unknown-arch", "not-an-arch"])
def test_build_refusing_its_input_says_the_fix_whole(args, said, fix, clean, capsys):
    """`build` on a CPU torch, and with an --arch it cannot build for: one line, the fix whole (issue 40)."""
    from fastpath_hooks import cli

    assert cli.main(["build", "causal-conv1d", *args]) == 2
    (line,) = said_lines(capsys)
    _whole(line, fix)
    assert line.startswith(PREFIX + said), line


def test_download_with_nothing_to_fetch_says_why_and_the_fix_whole(clean, capsys, tmp_path):
    """`download --target gpu=sm_90` from a CPU torch: every kernel skipped for one reason, said once with its fix."""
    from fastpath_hooks import cli

    assert cli.main(["download", "--dest", str(tmp_path / "house"), "--target", "gpu=sm_90"]) == 1
    (line,) = said_lines(capsys)
    _whole(line, "add cuda=X.Y, hip=X.Y or xpu=yes")
    assert line.startswith(f"{PREFIX}nothing to download for this target: ") and "CPU build" in line


def _variables_with_a_bad_value():
    from fastpath_hooks.facts.settings import VARIABLES

    return [v for v in VARIABLES if v not in ("FASTPATH_HOOKS_DISABLE", "FASTPATH_HOOKS_CACHE_DIR")]


@pytest.mark.parametrize("variable", _variables_with_a_bad_value())
def test_a_bad_value_is_refused_with_what_is_accepted_whole(variable, clean, speaking, capsys, monkeypatch):
    """Every variable set to a value it does not accept: the CLI's line and a start's line each name it and say
    what is accepted (the parser's whole text, its value said once), within the width."""
    from fastpath_hooks import cli
    from fastpath_hooks.engine.context import bad_settings, value_once
    from fastpath_hooks.facts.settings import SettingsError

    with pytest.raises(SettingsError) as caught:
        Settings.from_env({variable: "maybe"})
    var, value, why = caught.value.problems[0]
    accepted = value_once(value, why).replace(f" {value!r}", "")   # said without the value where it is repeated
    monkeypatch.setenv(variable, "maybe")
    assert cli.main(["doctor"]) == 2
    (line,) = said_lines(capsys)
    _whole(line, accepted)
    assert line.startswith(f"{PREFIX}{variable}='maybe' is not valid: ")
    bad_settings(caught.value)
    (line,) = said_lines(capsys)
    head = f"{PREFIX}{variable}='maybe' is not valid, so nothing is installed: "
    if len(head + accepted) > MAX_LINE and "; " in accepted:   # the list too long for any line: where it is, whole
        _whole(line, accepted.split("; ")[0] + " (`fastpath-hooks doctor` lists them)")
    else:
        _whole(line, accepted)
    assert line.startswith(head)


def test_a_cached_wheel_refused_for_its_digest_keeps_cache_clear_on_the_line(speaking, monkeypatch, tmp_path, capsys):
    """act/fetch's own refusal of an altered cache entry, handed to the engine as an install failure: the line says
    what is wrong and `fastpath-hooks cache clear`, whole (the file and both digests: the debug log, `cache list`).
    causal-conv1d: the longest name of a kernel whose wheels are cached."""
    import os

    from fastpath_hooks.act import fetch
    from fastpath_hooks.decide.plan import Step
    from support import wheels
    from support.worlds import environment

    kernel = "causal-conv1d"
    name = (f"{kernel.replace('-', '_')}-1.6.2.post1+fph.torch2.12.0.cu130.abi1.sm100.sm120-cp313-cp313-linux_"
            "aarch64.whl")
    root = str(tmp_path / "cache")
    path = fetch.store(root, wheels.build_wheel(str(tmp_path / "w"), kernel, "1.6.2.post1", {"x.py": ""}), meta={},
                       filename=name)
    with open(path, "r+b") as fh:
        fh.seek(10)
        byte = fh.read(1)
        fh.seek(10)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(fetch.FetchError) as caught:
        fetch.fetch_wheel(Step(kind="wheel", requirements=(name,), url="file://" + path), Settings(cache_dir=root),
                          str(tmp_path))
    monkeypatch.setenv("FASTPATH_HOOKS_CACHE_DIR", str(tmp_path / "said"))
    world = TableWorld(environment(), tmp_path, settings=Settings())
    world.install_error = str(caught.value)
    assert world.run(kernel).outcome.state == "failed"
    engine.use_world(None)
    (line,) = [ln for ln in said_lines(capsys) if "could not install" in ln]
    _whole(line, "fastpath-hooks cache clear")
    assert "sha256" in line and os.path.basename(path) not in line


# -- a model's forward: packed rows that leak (issue 41) ---------------------------------------------

def _longest_model_type() -> str:
    """The longest model type of the installed transformers whose modeling module builds a causal mask."""
    import transformers

    root = os.path.join(os.path.dirname(transformers.__file__), "models")
    found = [""]
    for name in os.listdir(root):
        modeling = os.path.join(root, name, f"modeling_{name}.py")
        configuration = os.path.join(root, name, f"configuration_{name}.py")
        if os.path.exists(modeling) and os.path.exists(configuration) and \
                "create_causal_mask(" in open(modeling, encoding="utf-8").read():
            found += re.findall(r'model_type\s*=\s*"([^"]+)"', open(configuration, encoding="utf-8").read())
    return max(found, key=len)


def test_the_packed_rows_line_keeps_its_reason_and_fix_whole_within_the_width():
    """hooks/packed.py's line (issue 41) with the longest model type transformers has, every attention
    implementation and remedy: whole, within the width."""
    from fastpath_hooks._names import MASKED_ATTENTION

    model = _longest_model_type()
    assert len(model) > 20, model
    short = rule_ids.forward_line(rule_ids.PACKED_LEAK, {"attention": "sdpa", "remedy": "use_cache=False", "flash": ""},
                                  subject="llama")
    assert short == "llama: packed documents attend to each other under sdpa (use_cache=False)"   # the model where it fits
    for attention in MASKED_ATTENTION:
        for remedy in ("attention_mask=None", "use_cache=False", "attention_mask=None and use_cache=False"):
            for flash in ("flash_attention_2", ""):
                values = {"attention": attention, "remedy": remedy, "flash": flash}
                line = rule_ids.forward_line(rule_ids.PACKED_LEAK, values, subject=model)
                assert len(PREFIX + line) <= MAX_LINE and fit(line) == PREFIX + line and "..." not in line, line
                assert f"under {attention} ({remedy}" in line and line.endswith(
                    f', or attn_implementation="{flash}")' if flash else f"{remedy})"), line

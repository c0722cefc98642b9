"""Numbers, not just imports: the numeric verification of a compiled kernel (and fla on Hopper).

On this CPU machine the GPU is posed; `numeric=cpu` in FASTPATH_HOOKS_TARGET (the package's own
override of the probed environment) runs the pinned checks on CPU tensors, against stand-in kernels
whose functions compute in plain torch - or, built from a `wrong` stand-in sdist, 0.5 off (what
causal-conv1d#105 does on sm_103). Real builds with real pip in real venvs; the real checks (the
shipped pins' shapes, dtypes and tolerances) against the stand-ins.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from types import SimpleNamespace

import pytest

from conftest import offline_env
from support import sdists, wheels

HOPPER_CPU = "gpu=sm_90,cuda=13.0,torch=2.13.0,cpus=16,numeric=cpu"


def _stand_ins(tmp_path, *, wrong: bool = False) -> str:
    """A directory with the stand-in causal_conv1d, mamba_ssm (and its selective_scan_cuda) and fla modules."""
    root = tmp_path / ("wrong" if wrong else "right")
    files = {"causal_conv1d/__init__.py": wheels.conv_module("1.7.0", wrong=wrong), **wheels.mamba_ssm_files("2.3.2.post1"),
             "fla/__init__.py": "", "fla/ops/__init__.py": "from .gated_delta_rule import chunk_gated_delta_rule\n",
             "fla/ops/gated_delta_rule/__init__.py": wheels._GDR}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


def _numbers(plan, distributions, *, env_extra, timeout):
    """The kernel's numeric check through the one check child (act/verify.verify_many), its import trivial."""
    from fastpath_hooks.act.verify import verify_many

    spec = SimpleNamespace(name=plan.kernel, verify_modules=(), verify_attributes=(), distributions=distributions)
    (result,) = verify_many([spec], timeout=timeout, env_extra=env_extra, numeric=[plan])
    return result


def _plan(kernel, target="gpu=sm_90,cuda=13.0,torch=2.13.0,numeric=cpu", root=None):
    from fastpath_hooks.act.numeric import plan_for
    from fastpath_hooks.facts.pins import load
    from fastpath_hooks.facts.probe import probe
    from fastpath_hooks.facts.settings import Settings

    pins = load()
    return plan_for(kernel, probe(Settings(target=target), pins=pins), pins, root)


# -- what runs where (fast) ---------------------------------------------------------------------

def test_a_posed_gpu_has_no_device_here_so_the_check_is_skipped_and_says_why():
    plan = _plan("causal-conv1d", "gpu=sm_90,cuda=13.0,torch=2.13.0")
    assert plan.device is None and "posed by FASTPATH_HOOKS_TARGET and none is here" in plan.skip
    assert _plan("causal-conv1d").device == "cpu"                       # numeric=cpu: CPU stand-ins
    assert [c.name for c in plan.checks] == ["causal_conv1d_fn", "causal_conv1d_fn_channel_last", "causal_conv1d_update"]
    assert _plan("causal-conv1d", "gpu=none,cuda=13.0,torch=2.13.0") is None    # no accelerator: nothing to check
    # fla's numbers are checked by its one gated-delta-rule pass at the model's shapes (issue 39), not here; its
    # numeric check is a hub kernel's (transformers 5.25), on Hopper
    assert _plan("fla", "gpu=sm_80,cuda=13.0,torch=2.13.0,numeric=cpu") is None
    assert _plan("fla") is None
    from fastpath_hooks.act.numeric import plan_for
    from fastpath_hooks.facts.pins import load
    from fastpath_hooks.facts.probe import probe
    from fastpath_hooks.facts.settings import Settings

    pins = load()
    env = probe(Settings(target="gpu=sm_90,cuda=13.0,torch=2.13.0,numeric=cpu"), pins=pins)
    assert [c.name for c in plan_for("fla", env, pins, hub=True).checks] == ["chunk_gated_delta_rule"]


@pytest.mark.slow   # two child interpreters importing torch: ~10 s on 2 cores
def test_flas_check_is_of_fla_own_path_with_flash_qla_switched_off(tmp_path):
    """fla 0.6 dispatches its chunk entry point to an importable flash_qla by itself; fla's check (its one
    gated-delta-rule pass, act/check_child.py) measures fla's own path with its backends off (FLA_FLASH_QLA=0, the
    check's `own`) - a wrong flash_qla beside it is the backend check's business, not a verdict on fla."""
    from fastpath_hooks.act.verify import check_now
    from fastpath_hooks.decide.plan import gdr_check
    from fastpath_hooks.facts.pins import load
    from fastpath_hooks.facts.probe import probe
    from fastpath_hooks.facts.settings import Settings

    root = _stand_ins(tmp_path)
    files = {"flash_qla/__init__.py": wheels._QLA.replace("MODE_VALUE", "wrong").replace("VERSION", "0.1.3"),
             "tilelang/__init__.py": ""}
    for name, text in files.items():
        (tmp_path / "right" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "right" / name).write_text(text)
    pins = load()
    check = gdr_check(probe(Settings(target=HOPPER_CPU), pins=pins), pins, "fla", served="fla",
                      shapes=((1, 2, 128, 128),), shapes_from="test")
    check = {**check, "check_seq": 16, "tune_seq": None}
    assert check["own"] == {"FLA_FLASH_QLA": "0"}
    spec = SimpleNamespace(name="fla", verify_modules=("fla.ops.gated_delta_rule",), verify_attributes=(),
                           distributions=("fla-core",))
    own = check_now(spec, check, timeout=180, env_extra=(("PYTHONPATH", root),))
    assert own.ok and own.child and "gated-delta-rule check" in own.detail, own.detail
    # the same check with flash_qla left on measures the wrong stand-in: the switch is what keeps it fla's
    through = check_now(spec, {**check, "own": {}}, timeout=180, env_extra=(("PYTHONPATH", root),))
    assert not through.ok and "gated-delta-rule check: at T=16" in through.detail, through.detail


def test_the_target_takes_numeric_cpu_and_refuses_other_values():
    from fastpath_hooks.facts.environment import parse_target

    assert parse_target("gpu=sm_90,numeric=cpu")["numeric"] == "cpu"
    with pytest.raises(ValueError, match="numeric=cpu runs the numeric checks on CPU tensors"):
        parse_target("numeric=gpu")


@pytest.mark.slow   # two child interpreters importing torch: ~10 s on 2 cores
def test_wrong_numbers_fail_with_the_measured_error_and_right_ones_pass(tmp_path):
    """The child process, the shipped causal-conv1d checks, a stand-in on PYTHONPATH (no dist-info: nothing
    is remembered)."""
    plan = _plan("causal-conv1d", root=str(tmp_path / "cache"))
    wrong = _numbers(plan, ("causal-conv1d",), timeout=120, env_extra=(("PYTHONPATH", _stand_ins(tmp_path, wrong=True)),))
    assert not wrong.ok and wrong.numeric and wrong.child
    assert re.fullmatch(r"on sm_90 \(CPU tensors\), causal_conv1d_fn forward differs from torch by 0\.5\d? "
                        r"\(tolerance 0\.05 \+ 1%\)", wrong.detail), wrong.detail
    right = _numbers(plan, ("causal-conv1d",), timeout=120, env_extra=(("PYTHONPATH", _stand_ins(tmp_path),),))
    assert right.ok and right.child, right.detail
    assert re.fullmatch(r"numbers match torch on sm_90 \(CPU tensors\): 3 checks, max abs diff [\d.e-]+, in [\d.]+ s",
                        right.detail.split("; ", 1)[1]), right.detail


def test_a_remembered_mismatch_blocks_that_release_on_that_arch_under_that_torch():
    """The policy (pure): the probe's numeric_failures in, a block with the measured error out - only for the
    release, arch and torch build measured."""
    from test_policy import make_env, plan_for

    failure = ("causal-conv1d", "1.7.0+fph.torch2.13.0.cu130.abi1.sm100", "sm_103", "torch 2.13.0 CUDA 13.0",
               "on sm_103, causal_conv1d_fn forward differs from torch by 0.43 (tolerance 0.05 + 1%)",
               "/cache/numeric/causal-conv1d.json")
    env = make_env(torch="2.13.0", torch_cuda="13.0", nvcc_version="13.0", gpus=("sm_103",), numeric_failures=(failure,))
    d = plan_for(env)["causal-conv1d"]
    assert (d.action, d.rule, d.on_failure) == ("block", "causal.block.numeric", "block")
    assert d.reason.startswith("on sm_103, causal_conv1d_fn forward differs from torch by 0.43") and not d.steps
    assert "/cache/numeric/causal-conv1d.json" in d.fix
    for other in (dict(gpus=("sm_90",)), dict(torch="2.14.1")):           # another GPU, another torch: not blocked
        assert plan_for(dataclasses.replace(env, **other))["causal-conv1d"].action == "install"


# -- the pinned checks themselves, against stand-ins that compute in torch (slow: fla's on CPU) ------------

@pytest.mark.slow
def test_every_pinned_check_passes_on_torch_computed_stand_ins_and_fails_on_wrong_ones(tmp_path, dep_wheels):
    """The references of act/check_child.py agree with independent torch implementations (the stand-ins)
    with the shipped shapes, dtypes and tolerances: the checks can pass. The wrong conv stand-in fails."""
    import glob
    import subprocess

    from fastpath_hooks.act.check_child import MARK
    from fastpath_hooks.act.numeric import CHILD, _payload
    from fastpath_hooks.facts.pins import load

    checks = [_payload(c) for kernel in ("causal-conv1d", "mamba-ssm", "fla") for c in load().kernel(kernel).numeric_checks]
    kernels = [{"modules": [], "attributes": [], "numeric": {"device": "cpu", "checks": checks}}]
    for wrong in (False, True):
        proc = subprocess.run([sys.executable, CHILD, json.dumps(kernels)], text=True,
                              capture_output=True, timeout=600,
                              # the stand-in mamba_ssm imports einops, as the real one does: its real wheel (a zip)
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                  [_stand_ins(tmp_path, wrong=wrong), *glob.glob(os.path.join(dep_wheels, "einops-*.whl"))])))
        report = json.loads(proc.stdout.split(MARK)[-2])["numeric"]   # the last line names the loaded distributions
        states = {r["name"]: r["state"] for r in report["results"]}
        assert len(states) == 7, report
        if not wrong:
            assert set(states.values()) == {"ok"}, report
        else:
            assert {n for n, s in states.items() if s != "ok"} == {"causal_conv1d_fn", "causal_conv1d_fn_channel_last"}


# -- for real: a build that imports fine but computes wrongly is rolled back and blocked -------------------

@pytest.fixture
def house(tmp_path, build_dep_wheels):
    def make(*, wrong: bool) -> str:
        path = str(tmp_path / ("house-wrong" if wrong else "house"))
        os.makedirs(path)
        for name in os.listdir(build_dep_wheels):
            os.link(os.path.join(build_dep_wheels, name), os.path.join(path, name))
        sdists.causal_conv1d_sdist(path, wrong=wrong)
        return path
    return make


@pytest.mark.slow
def test_a_kernel_with_wrong_numbers_is_rolled_back_and_blocked_with_the_measured_error(make_venv, toolkit, house,
                                                                                        tmp_path, test_pins):
    cache = str(tmp_path / "cache")
    env = offline_env(house(wrong=True), HOPPER_CPU, cache_dir=cache, pins=test_pins(), CUDA_HOME=toolkit.home)
    venv = make_venv(transformers=None)
    before = venv.versions()
    proc = venv.cli("install", "causal-conv1d", env=env)
    assert proc.returncode == 1
    assert toolkit.calls(), "it was built"
    # one line, never cut: the kernel, the GPU, the function, what differs, by how much, and the fix (the
    # tolerance is in doctor and the import's error when the line has no room for it)
    assert re.search(r"^fastpath-hooks: causal-conv1d: blocked - on sm_90 \(CPU tensors\), causal_conv1d_fn forward "
                     r"differs from torch by 0\.5\d?( \(tolerance 0\.05 \+ 1%\))? "
                     r"\(pin a good release: fastpath-hooks doctor\)$", proc.stderr, re.M), proc.stderr
    assert "rolled back" in proc.stderr
    assert venv.versions() == before, "nothing stays installed"
    where = os.path.join(cache, "wheels")
    assert not os.path.isdir(where) or not [n for n in os.listdir(where) if n.endswith(".whl")], "nothing cached"
    (entry,) = json.load(open(os.path.join(cache, "numeric", "causal-conv1d.json"))).values()
    assert entry["state"] == "mismatch" and entry["arch"] == "sm_90" and entry["version"].startswith("1.6.2.post1+fph")

    # the next run: blocked by the policy before anything is built, the measured error in the plan
    calls = toolkit.calls()
    plan = json.loads(venv.cli("plan", "causal-conv1d", "--json", env=env).stdout)
    (conv,) = [d for d in plan["decisions"] if d["kernel"] == "causal-conv1d"]
    assert conv["rule"] == "causal.block.numeric" and "differs from torch by 0.5" in conv["reason"]
    again = venv.cli("install", "causal-conv1d", env=env)
    assert "causal-conv1d: blocked - on sm_90 (CPU tensors), causal_conv1d_fn forward differs" in again.stderr
    assert toolkit.calls() == calls and venv.versions() == before
    # and the kernel's import keeps transformers on its torch path
    probe = venv.run("import fastpath_hooks; fastpath_hooks.install()\n"
                     "try:\n    import causal_conv1d\nexcept ImportError as exc:\n    print('blocked:', exc)\n", env=env)
    assert "blocked:" in probe.stdout and "differs from torch" in probe.stdout, probe.stdout + probe.stderr


@pytest.mark.slow
def test_right_numbers_are_checked_once_per_wheel_arch_and_torch_and_remembered(make_venv, toolkit, house, tmp_path,
                                                                                test_pins):
    cache = str(tmp_path / "cache")
    env = offline_env(house(wrong=False), HOPPER_CPU, cache_dir=cache, pins=test_pins(), CUDA_HOME=toolkit.home)
    first = make_venv(transformers=None)
    proc = first.cli("install", "causal-conv1d", env=env)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"causal-conv1d: numbers match torch on sm_90 \(CPU tensors\): 3 checks, max abs diff [\d.e-]+, "
                     r"in [\d.]+ s", proc.stderr), proc.stderr
    record = os.path.join(cache, "numeric", "causal-conv1d.json")
    (entry,) = json.load(open(record)).values()
    assert entry["state"] == "good"
    stamp = os.stat(record).st_mtime_ns
    # another environment gets the same wheel from the cache: the same files, arch and torch - not checked again
    second = make_venv(transformers=None)
    proc = second.cli("install", "causal-conv1d", env=env)
    assert proc.returncode == 0 and "from the local wheel cache" in proc.stderr, proc.stderr
    assert "numbers match torch" not in proc.stderr and os.stat(record).st_mtime_ns == stamp


@pytest.mark.slow   # one child interpreter importing torch
def test_one_verification_child_for_several_kernels_runs_their_numeric_checks_too(tmp_path, dep_wheels):
    """The batched path (act/verify.verify_many, as act/installer.py calls it): the import checks and the numeric
    checks of causal-conv1d and mamba-ssm in ONE child; the wrong causal-conv1d fails on its numbers (marked
    numeric, so the engine blocks it), mamba-ssm's numbers match."""
    from fastpath_hooks.act.verify import verify_many
    from fastpath_hooks.facts.pins import load

    pins = load()
    children = []
    root = str(tmp_path / "cache")
    import glob

    path = os.pathsep.join([_stand_ins(tmp_path, wrong=True), *glob.glob(os.path.join(dep_wheels, "einops-*.whl"))])
    conv, mamba = verify_many([pins.kernel("causal-conv1d"), pins.kernel("mamba-ssm")], timeout=300,
                              env_extra=(("PYTHONPATH", path),),
                              started=lambda pgid: children.append(pgid) if pgid is not None else None,
                              numeric=[_plan("causal-conv1d", root=root), _plan("mamba-ssm", root=root)])
    assert len(children) == 1, children
    assert not conv.ok and conv.numeric
    assert re.fullmatch(r"on sm_90 \(CPU tensors\), causal_conv1d_fn forward differs from torch by 0\.5\d? "
                        r"\(tolerance 0\.05 \+ 1%\)", conv.detail), conv.detail
    assert mamba.ok and not mamba.numeric, mamba.detail
    assert re.search(r"one check for 2 kernels\); numbers match torch on sm_90 \(CPU tensors\): \d+ checks", mamba.detail)


def test_the_check_clause_names_its_one_pass():
    """One pass (issue 39): the length it compiled and tuned at, said once; its worst error against its limit."""
    from fastpath_hooks.act.verify import summary

    worst = {"tensor": "dg", "error": 0.011, "limit": 0.16}
    assert summary({"tune_seq": 4096, "check_seq": 256, "worst": worst, "seconds": 61.2}) == \
        "dg 1.1e-02 (limit 1.6e-01) at T=256, JIT compiled and tuned at 4096 tokens, 61.2 s"
    assert summary({"check_seq": 256, "seconds": 3.0}) == "3.0 s"


def test_the_gated_delta_rule_reference_on_a_few_heads_is_the_whole_ones_there():
    """The check compares at 1024 tokens (fla's kernels specialise on the number of 64-token chunks: 256 tokens gave
    4, not a multiple of 16, and compiled anew on the H100): its float32 reference runs on a few heads only - heads are
    independent, a grouped value head reads its key head - and gives exactly the whole reference's numbers there."""
    import importlib.util

    import torch

    from fastpath_hooks.act import check_child as path
    from fastpath_hooks.facts.pins import load

    spec = importlib.util.spec_from_file_location("check_child_by_path", path.__file__)
    child = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(child)   # as the package runs it: by path, nothing of the package imported
    for shape, heads in (([2, 4, 16, 16], (1, 2)), ([4, 4, 16, 16], (2, 2)), ([1, 3, 8, 8], (1, 3))):
        x = child._inputs(torch, shape, 24, "cpu", 0, torch.float32)
        leaves = {n: x[n].float().clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")}
        ref, _ = child.gdr_ref(**leaves)
        ref.backward(x["do"].float())
        whole = child._few({"o": ref.detach(), **{f"d{n}": t.grad for n, t in leaves.items()}}, heads)
        few = child._reference(torch, x)
        assert child._heads(x) == heads and set(few) == set(whole)
        assert all(torch.equal(few[n], whole[n]) for n in few), shape
    assert load().kernel("fla").warm.check_seq % (64 * 16) == 0    # its chunks a multiple of 16, as 4096's are

"""The CLI over the engine, in process and in milliseconds: exit codes, what it prints, and that every
command goes through the engine (`install`, `build` and `download` through the World it is handed -
support.worlds.TableWorld - where the real parts would need a GPU, a compiler or the network).
tests/test_cli.py runs the same commands as subprocesses of real venvs (slow)."""

from __future__ import annotations

import json
import os

import pytest

from conftest import A100
from fastpath_hooks import cli, engine, events
from fastpath_hooks.facts.settings import Settings
from support.worlds import TableWorld, environment


@pytest.fixture
def clean(tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("FASTPATH_HOOKS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FASTPATH_HOOKS_CACHE_DIR", str(tmp_path / "cache"))
    # this process speaks for the node (local rank 0), whichever process beside it (a parallel test worker
    # of the same parent) spoke first
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("_FASTPATH_HOOKS_VOICE", raising=False)
    saved = dict(os.environ)
    events.forget()
    yield
    engine.use_world(None)
    events.forget()
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def table(tmp_path, clean):
    """The engine deciding in a TableWorld (CUDA 12.8, torch 2.10, an A100 posed)."""
    world = TableWorld(environment(), tmp_path, settings=Settings(cache_dir=str(tmp_path / "cache")))
    engine.use_world(world)
    return world


def test_install_target_is_a_parameter_never_an_environment_variable(clean, capsys, monkeypatch):
    monkeypatch.setenv("FASTPATH_HOOKS_MODE", "report")      # decide for real, install nothing
    code = cli.main(["install", "fla", "--target", A100])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "FASTPATH_HOOKS_TARGET" not in os.environ
    assert out.out.startswith("fla: reported - fla 0.6.0 fits triton 3.6.0"), out.out   # decided for the posed A100
    assert "would install fla-core 0.6.0 + flash-linear-attention 0.6.0" in out.err


def test_install_goes_through_the_engine_and_exits_1_for_a_failure(table, capsys):
    table.install_error = "verification failed: ImportError: boom"
    assert cli.main(["install", "fla"]) == 1
    out = capsys.readouterr()
    assert out.out.strip() == "fla: failed - verification failed: ImportError: boom"
    assert table.calls["install"] == 1 and table.calls["read"] == 1


def test_install_of_several_kernels_reads_the_world_once_while_nothing_changes(table, capsys):
    table.install_error = "no wheel"     # nothing changes on disk: one reading serves every kernel
    assert cli.main(["install", "fla", "causal-conv1d"]) == 1
    assert table.calls["read"] == 1 and table.calls["install"] == 2


def test_install_tries_now_what_a_start_remembers_as_failed_and_says_when_it_was_seen(table, capsys):
    """Issue 34, defect 1: with the wheel source down `install causal-conv1d` fails; back up, the same command
    printed the same stale cause for up to FASTPATH_HOOKS_RETRY_AFTER without trying. A remembered failure
    spares interpreter starts (they say when it was seen), never a command the user types."""
    refused = "fetching causal_conv1d-1.6.2.post1 failed: <urlopen error [Errno 111] Connection refused>"
    table.install_error = refused
    assert cli.main(["install", "causal-conv1d"]) == 1
    assert table.calls["install"] == 1
    table.install_error = None                  # the source is back
    engine.forget()                             # a new process: a start replays the failure, tries nothing
    outcome = engine.ensure("causal-conv1d")
    assert outcome.state == "failed" and table.calls["install"] == 1
    said = [line for line in capsys.readouterr().err.splitlines() if "causal-conv1d: failed" in line]
    assert said and all(" s ago" in line and "fastpath-hooks install causal-conv1d" in line for line in said), said
    engine.forget()                             # a new process: the command tries now
    assert cli.main(["install", "causal-conv1d"]) == 0, capsys.readouterr().err
    assert table.calls["install"] == 2
    out = capsys.readouterr()
    assert out.out.startswith("causal-conv1d: installed") and "Connection refused" not in out.out + out.err


@pytest.mark.parametrize("argv, message", [
    (["build", "fla"], "fla is not built from source (its wheels are prebuilt); `build` knows causal-conv1d, mamba-ssm"),
    (["build", "causal-conv1d"], "a build needs CUDA (or ROCm) torch and nvcc, no GPU"),
    (["build", "nope"], "nope"),
    (["download", "--dest", "{tmp}/wh"], "download needs the network: unset FASTPATH_HOOKS_OFFLINE"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, clean, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTPATH_HOOKS_OFFLINE", "1")
    monkeypatch.setenv("FASTPATH_HOOKS_FIND_LINKS", str(tmp_path))
    assert cli.main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_build_plans_then_builds_under_the_lock_and_exports(table, capsys, tmp_path):
    dest = str(tmp_path / "house")
    assert cli.main(["build", "causal-conv1d", "--arch", "sm_90", "--dest", dest]) == 0
    out = capsys.readouterr().out
    (decision,) = table.built_decisions
    assert decision.kernel == "causal-conv1d" and [s.archs for s in decision.steps if s.kind == "build"] == [("sm_90",)]
    assert table.calls["lock"] == 1 and table.calls["recover"] == 1 and table.held == 0
    assert out.splitlines()[0] == f"causal-conv1d: {decision.reason}"
    built = [n for n in os.listdir(dest) if n.endswith(".whl")]
    assert len(built) == 1 and f"copied to {os.path.join(dest, built[0])}" in out


def test_build_says_a_fitting_cached_wheel_is_there_and_builds_nothing(table, capsys, tmp_path):
    from fastpath_hooks.act import fetch as wheelcache

    name = "causal_conv1d-1.6.2.post1+fph.torch2.10.0.cu128.abi1.sm90-cp312-cp312-linux_x86_64.whl"
    wheel = tmp_path / name
    wheel.write_bytes(b"a built wheel")
    wheelcache.store(str(tmp_path / "cache"), str(wheel), meta={"origin": "built", "distribution": "causal-conv1d"})
    table.env = environment(cached_wheels=(name,))
    assert cli.main(["build", "causal-conv1d", "--arch", "sm_90"]) == 0
    assert "is already in the wheel cache" in capsys.readouterr().out and table.calls["build"] == 0


def test_build_a_failure_exits_1_and_says_why(table, capsys):
    table.install_error = "source build of causal-conv1d failed (pip exit 1); full log: /w/build.log"
    assert cli.main(["build", "causal-conv1d", "--arch", "sm_90"]) == 1
    assert "causal-conv1d: build failed - source build of causal-conv1d failed" in capsys.readouterr().err


def test_download_fetches_the_fresh_plan_for_the_target(table, capsys, tmp_path):
    dest = str(tmp_path / "house")
    assert cli.main(["download", "fla", "--dest", dest]) == 0
    out = capsys.readouterr()
    ((binary, wheels),) = table.downloaded
    # planned as for a fresh machine: fla's runtime dependencies too, although this one has them
    assert binary == ("einops", "packaging", "fla-core==0.6.0", "flash-linear-attention==0.6.0") and wheels == ()
    assert table.calls["decide"] == 1 and table.calls["probe"] == 1
    assert f"wheelhouse {dest}: 4 files" in out.out and "FASTPATH_HOOKS_OFFLINE=1" in out.out


def test_download_with_nothing_to_fetch_exits_1(table, capsys, tmp_path):
    table.env = environment(gpus=())
    assert cli.main(["download", "--dest", str(tmp_path / "house")]) == 1
    assert "nothing to download for this target" in capsys.readouterr().err


def test_plan_and_doctor_json_read_the_world_the_engine_decides_from(clean, capsys):
    assert cli.main(["plan", "--json", "fla", "--target", A100]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [d["kernel"] for d in plan["decisions"]] == ["fla"] and plan["decisions"][0]["action"] == "install"
    assert cli.main(["doctor", "--json", "--target", A100]) == 0
    doctor = json.loads(capsys.readouterr().out)
    assert doctor["environment"]["gpus"] == ["sm_80"]

"""One install reads the world once when nothing else is going on - and again only when the world
changed while it waited for the lock.

The real engine (`engine.ensure`, the state machine, the real settings, probe, policy, stamp,
environment lock, recovery and verdict cache), with one stand-in: the installer writes the
decision's distributions into a directory on sys.path instead of running pip
(support.worlds.CountingWorld). Posing as an A100 machine (FASTPATH_HOOKS_TARGET), offline,
with fla's wheels in a local wheelhouse.
"""

from __future__ import annotations

import os
import sys
import threading
import types

import pytest

from conftest import A100
from fastpath_hooks import engine, events
from fastpath_hooks.engine.context import load
from fastpath_hooks.engine.world import EnvironmentLock
from fastpath_hooks.engine.outcome import OutcomeState
from support.worlds import CountingWorld, write_dist_info

FLA_WHEELS = ("fla_core-0.6.0-py3-none-any.whl", "flash_linear_attention-0.6.0-py3-none-any.whl",
              "einops-0.8.1-py3-none-any.whl")   # names only: the policy reads the wheelhouse listing


@pytest.fixture
def world(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    house = tmp_path / "wheelhouse"
    house.mkdir()
    for name in FLA_WHEELS:
        (house / name).write_bytes(b"")
    monkeypatch.syspath_prepend(str(site))
    for name in [k for k in os.environ if k.startswith("FASTPATH_HOOKS_")]:
        monkeypatch.delenv(name)
    # nvcc's release posed: a real toolkit on the host stays the one that runs (`nvcc=yes` would ask its release
    # where a build is considered: a second decision, on a host with a toolkit only)
    monkeypatch.setenv("FASTPATH_HOOKS_TARGET", A100.replace("nvcc=yes", "nvcc=12.8"))
    monkeypatch.setenv("FASTPATH_HOOKS_OFFLINE", "1")
    monkeypatch.setenv("FASTPATH_HOOKS_FIND_LINKS", str(house))
    monkeypatch.setenv("FASTPATH_HOOKS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FASTPATH_HOOKS_LOG", "warning")
    counting = CountingWorld(tmp_path, str(site))
    before = engine.use_world(counting)
    yield counting
    engine.use_world(before)
    events.forget()


def test_one_uncontended_install_probes_once_and_decides_once(world):
    outcome = engine.ensure("fla")
    assert outcome.state == OutcomeState.INSTALLED, outcome
    assert dict(world.calls) == {"probe": 1, "decide": 1, "install": 1}
    assert os.path.isdir(os.path.join(world.site, "fla_core-0.6.0.dist-info"))
    # what the engine settled from the installer's scan is what a probe finds now: the verdict it
    # recorded is found by the next process, which probes
    engine.forget()
    settings, pins, _ = load()
    fresh = world.probe(settings, pins)
    assert engine.fingerprint(fresh, settings, pins, "fla") == \
        engine.current_world().cache(settings).entries()["fla"]["fingerprint"]
    # and the next decision of fla in a new process is the warm verdict: nothing probed or decided
    calls = dict(world.calls)
    assert engine.ensure("fla").state == OutcomeState.OK and dict(world.calls) == calls


def _held_by_another(world, *, then=None):
    """The environment lock held by another thread of this process (as another process would hold it),
    released after `then()` ran; the holder waits until this process's run is waiting too."""
    settings, _, _ = load()
    held, waiting = threading.Event(), threading.Event()

    def hold():
        with EnvironmentLock(settings, "causal-conv1d", world.state_dir(settings)):
            held.set()
            waiting.wait(30)
            if then is not None:
                then()

    events.add_listener(lambda e: "waiting for causal-conv1d" in e["message"] and waiting.set())
    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(30)
    return thread


def test_a_contended_install_reads_again_only_when_the_world_changed_meanwhile(world):
    thread = _held_by_another(world)                # the other holder changes nothing
    assert engine.ensure("fla").state == OutcomeState.INSTALLED
    thread.join(30)
    assert dict(world.calls) == {"probe": 1, "decide": 1, "install": 1}
    events.clear_listeners()


def test_a_contended_install_reads_again_when_another_process_installed_meanwhile(world):
    def other_installs():
        for name in ("fla-core", "flash-linear-attention"):
            write_dist_info(world.site, name, "0.6.0")

    thread = _held_by_another(world, then=other_installs)
    outcome = engine.ensure("fla")
    thread.join(30)
    assert outcome.state == OutcomeState.OK, outcome
    assert dict(world.calls) == {"probe": 2, "decide": 2}, "read again, and nothing installed twice"
    events.clear_listeners()


def test_a_model_imported_between_two_decisions_is_read_again(world, monkeypatch):
    """Kernels decided while nothing changed share one reading - unless a model was imported meanwhile (its
    configuration module): the policy reads the models' shapes (FA3 is built for their head dims), so a second
    reading holds it."""
    monkeypatch.setenv("FASTPATH_HOOKS_MODE", "report")   # decisions only
    engine.ensure("fla")
    assert world.calls["probe"] == 1
    module = types.ModuleType("transformers.models.fakemodel.configuration_fakemodel")
    module.FakeConfig = type("FakeConfig", (), {"__module__": module.__name__, "head_dim": 192,
                                                "num_attention_heads": 8})
    monkeypatch.setitem(sys.modules, module.__name__, module)
    engine.ensure("flash-attn-3")
    assert world.calls["probe"] == 2
    newest = list(engine.current_world().readings.values())[-1][0]
    assert ("fakemodel", 192, None, 8, False) in newest.attention_shapes

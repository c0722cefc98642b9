"""flash-qla through the engine, in milliseconds (a TableWorld: tests/support/worlds.py): the real state
machine, policy and verdict cache; the installer and the verification children are values.

- `import fla` on Hopper ensures tilelang, then fla, then flash-qla - before the import goes on
  (fla's backend registry looks for `flash_qla` with find_spec, at its first call);
- a flash-qla that cannot be installed or fails its check leaves fla usable, on its own path:
  FLA_FLASH_QLA=0 in this process (fla does not catch flash-qla's JIT errors), never a block;
- a remembered failure keeps it switched off at the next start;
- fla's Triton/TileLang path warms in fla's own verification (its `check`), flash-qla's against it.
The real children and installs: tests/test_flash_qla.py.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from fastpath_hooks import engine, events
from fastpath_hooks.engine.outcome import OutcomeState
from fastpath_hooks.engine.world import InstallFailed
from support.worlds import PINS, TILELANG_PAIR, TableWorld, environment

HOPPER = dict(gpus=("sm_90",), triton="3.6.0")
FLA = {"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"}
QLA = {"flash-qla": "0.1.3"}
# flash-qla is off by default on Hopper (the H200 benchmark: it does not pay at small sizes, pins pays.hazard);
# these tests turn it on, as a user's FASTPATH_HOOKS_PINS file does
QLA_ON = dataclasses.replace(PINS, kernels={**PINS.kernels, "flash-qla": dataclasses.replace(
    PINS.kernel("flash-qla"), pays=dataclasses.replace(PINS.kernel("flash-qla").pays, hazard=True))})


class QlaFails(TableWorld):
    """flash-qla's install is rolled back (its check failed in the transaction); the rest installs."""

    def install(self, decision, *, settings, env, pins):
        if decision.kernel == "flash-qla":
            self.calls["install"] += 1
            self.installed_decisions.append(decision)
            raise InstallFailed("verification failed: flash-qla's gated-delta-rule check: flash-qla raised "
                                "RuntimeError: nvcc fatal")
        return super().install(decision, settings=settings, env=env, pins=pins)


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTPATH_HOOKS_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("FLA_FLASH_QLA", "FLA_TILELANG", "TRITON_CACHE_DIR", "TILELANG_CACHE_DIR"):
        monkeypatch.setenv(var, "")      # restored (removed) after the test: the engine sets some of them
        monkeypatch.delenv(var)
    worlds = []

    def make(cls=TableWorld, dists=None, pins=QLA_ON, **facts):
        w = cls(environment(dists, **{**HOPPER, **facts}), tmp_path, pins=pins)
        worlds.append(engine.use_world(w))
        return w

    yield make
    if worlds:
        engine.use_world(worlds[0])


def _ensure_fla():
    """engine.ensure("fla"), and what it said."""
    seen = []
    events.add_listener(seen.append)
    try:
        return engine.ensure("fla"), seen
    finally:
        events.clear_listeners()


def _said(capture):
    return [e["message"] for e in capture]


def test_with_the_shipped_pins_import_fla_on_hopper_installs_tilelang_and_fla_not_flash_qla(world):
    w = world(pins=PINS)
    outcome, seen = _ensure_fla()
    assert outcome.state == OutcomeState.INSTALLED
    assert [d.kernel for d in w.installed_decisions] == ["tilelang", "fla"]
    assert not any("flash-qla" in m for m in _said(seen) if "installing" in m)
    qla = engine.outcomes().get("flash-qla")
    assert qla is None or qla.state != OutcomeState.INSTALLED
    assert os.environ.get("FLA_FLASH_QLA") is None     # nothing installed to switch off


def test_import_fla_on_hopper_installs_tilelang_then_fla_then_flash_qla_before_it_returns(world):
    w = world()
    outcome, seen = _ensure_fla()
    assert outcome.state == OutcomeState.INSTALLED
    assert [d.kernel for d in w.installed_decisions] == ["tilelang", "fla", "flash-qla"]
    qla = w.installed_decisions[-1]
    assert dict(qla.target) == QLA and qla.needs == ("tilelang", "fla")
    # what its verification runs: flash-qla against fla's own path; fla's own install warms that path
    assert qla.check["compare"]["module"] == "flash_qla" and qla.check["own"] == {"FLA_FLASH_QLA": "0"}
    fla = w.installed_decisions[1]
    assert fla.check["own"] == {"FLA_FLASH_QLA": "0"} and "compare" not in fla.check
    assert engine.outcomes()["flash-qla"].state == OutcomeState.INSTALLED
    assert os.environ.get("FLA_FLASH_QLA") is None     # it works: fla uses it
    assert any(m.startswith("flash-qla: installed flash-qla 0.1.3") for m in _said(seen))


def test_a_failed_flash_qla_leaves_fla_on_its_own_path_not_the_torch_path(world):
    w = world(QlaFails)
    outcome, seen = _ensure_fla()
    assert outcome.state == OutcomeState.INSTALLED and outcome.block is None       # fla: usable, not blocked
    assert engine.outcomes()["flash-qla"].state == OutcomeState.FAILED
    assert engine.outcomes()["flash-qla"].block is None                            # never a blocked import
    assert os.environ["FLA_FLASH_QLA"] == "0"                                      # fla will not dispatch to it
    assert any("flash-qla: could not install - verification failed" in m and "(fla keeps its own path" in m
               for m in _said(seen))

    # the next start: the failure is remembered (not retried), and flash-qla stays switched off
    del os.environ["FLA_FLASH_QLA"]
    engine.forget()
    again = engine.ensure("fla")
    assert again.state == OutcomeState.OK and os.environ["FLA_FLASH_QLA"] == "0"
    assert [d.kernel for d in w.installed_decisions].count("flash-qla") == 1


def test_an_installed_flash_qla_that_fails_its_check_is_switched_off(world):
    w = world(dists={**FLA, **TILELANG_PAIR, **QLA})
    w.verifications = [(True, "tilelang imports"), (False, "flash-qla's gated-delta-rule check: dq 4.1e-01 > 1.6e-02")]
    outcome = engine.ensure("fla")
    assert outcome.state == OutcomeState.OK
    qla = engine.outcomes()["flash-qla"]
    assert qla.state == OutcomeState.FAILED and qla.block is None and "dq 4.1e-01" in qla.reason
    assert os.environ["FLA_FLASH_QLA"] == "0"
    assert w.checks[-1]["compare"]["switch"] == "FLA_FLASH_QLA"       # the check the verification was handed
    assert w.calls["install"] == 0                                     # the user's flash-qla is never removed


def test_an_installed_flash_qla_where_it_cannot_train_is_switched_off_before_fla_is_imported(world):
    world(dists={**FLA, **QLA}, gpus=("sm_80",))
    assert engine.ensure("fla").state == OutcomeState.OK
    assert engine.outcomes()["flash-qla"].state == OutcomeState.SKIPPED
    assert os.environ["FLA_FLASH_QLA"] == "0"


def test_skipped_by_the_user_flash_qla_is_not_even_decided(world):
    import dataclasses

    w = world()
    w.settings = dataclasses.replace(w.settings, skip=frozenset({"flash-qla"}))
    assert engine.ensure("fla").state == OutcomeState.INSTALLED
    assert [d.kernel for d in w.installed_decisions] == ["tilelang", "fla"]
    assert "flash-qla" not in engine.outcomes()


def test_fla_looking_for_flash_qla_at_its_first_call_installs_nothing(world, tmp_path, monkeypatch):
    """fla's backend registry asks find_spec("flash_qla") at its first call, inside a training step: with fla
    imported and flash_qla not on the path, the finder leaves that lookup alone (flash-qla was decided right
    after fla, before fla's import). Before fla is imported, the same lookup is the engine's."""
    import importlib.util
    import sys
    import types

    import fastpath_hooks

    from support.worlds import write_dist_info

    site = tmp_path / "site"
    site.mkdir()
    write_dist_info(str(site), "fla-core", "0.6.0", {"fla/__init__.py": ""})   # fla installed: its metadata says so
    monkeypatch.syspath_prepend(str(site))
    # modeling modules other tests imported into this process would make install()'s late pass decide (and
    # import fla) already: out of sight for this test, back after it
    for name in [n for n in sys.modules if n.startswith("transformers.models.") and ".modeling_" in n]:
        monkeypatch.delitem(sys.modules, name)
    w = world()
    fastpath_hooks.install()
    try:
        monkeypatch.setitem(sys.modules, "fla", types.ModuleType("fla"))
        assert importlib.util.find_spec("flash_qla") is None
        assert w.calls["read"] == 0 and "flash-qla" not in engine.outcomes()
        monkeypatch.delitem(sys.modules, "fla")
        assert importlib.util.find_spec("flash_qla") is None        # not installed: TableWorld installs no files
        assert w.calls["read"] >= 1 and engine.outcomes()["flash-qla"].state == OutcomeState.INSTALLED
    finally:
        fastpath_hooks.uninstall()

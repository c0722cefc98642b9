"""An install killed half-way (issue 17, defect 5): seen at the very next start - one stat at install() -
and rolled back before any kernel is imported, whatever FASTPATH_HOOKS_SKIP or install(kernels=...) leave
out; doctor shows it meanwhile.

Before, a run that skipped fla left the journal alone and `import fla` ran on the half-written tree
(`pip check` failing) until a later run happened to decide fla; doctor said nothing.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from conftest import A100, offline_env
from fastpath_hooks.act import transaction as state
from test_crash import PADDING, USER_SCRIPT, _fla_files, _popen, _wait_for
from support.processes import link_uv


AFTER = r'''
import json, sys
import fastpath_hooks
fastpath_hooks.install(%s)
try:
    import fla
    out = {"fla": "imported", "file": fla.__file__}
except ImportError as exc:
    out = {"fla": type(exc).__name__}
print(json.dumps(out))
'''


def test_install_looks_for_the_journal_the_transaction_writes():
    """hooks.install() checks a literal path (no helper function at every start): the journal's."""
    import inspect

    from fastpath_hooks import hooks
    from fastpath_hooks.act import transaction

    assert f'"/{state.STATE_DIR_NAME}/{state.JOURNAL}"' in inspect.getsource(hooks.install)
    assert transaction.JOURNAL == state.JOURNAL


@pytest.mark.slow   # a real venv, a real install killed with SIGKILL
@pytest.mark.parametrize("left_out", ["FASTPATH_HOOKS_SKIP", "install(kernels=...)"])
def test_a_killed_install_is_rolled_back_at_the_next_start_whatever_is_skipped(left_out, make_venv, make_wheelhouse,
                                                                                tmp_path):
    venv = make_venv(transformers=None)
    link_uv(venv)
    wheelhouse = make_wheelhouse(fla="0.6.0", fla_padding=PADDING)
    env = offline_env(wheelhouse, A100, cache_dir=str(tmp_path / "cache"), FASTPATH_HOOKS_LOCK_TIMEOUT="60")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    pip_check_before = venv.pip_check()
    journal = os.path.join(venv.site, ".fastpath-hooks", state.JOURNAL)

    # pip writes fla's files one by one: killed while it does
    victim = _popen(venv, USER_SCRIPT, dict(env, FASTPATH_HOOKS_INSTALLER="pip"), tmp_path, "victim")
    _wait_for(lambda: _fla_files(venv) > 0, 120, victim, "fla's files appear")
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL
    assert os.path.exists(journal) and os.path.isdir(os.path.join(venv.site, "fla"))

    # doctor shows it (and touches nothing)
    doctor = venv.cli("doctor", env=env)
    assert doctor.returncode == 0, doctor.stderr
    assert "interrupted   install of fla" in doctor.stdout and "rolled back at the next start" in doctor.stdout, \
        doctor.stdout
    as_json = venv.cli("doctor", "--json", env=env)
    pending = json.loads(as_json.stdout)["interrupted_install"]
    assert pending["journal"] == journal and pending["description"].startswith("install of fla")
    assert pending["running"] is False, pending
    assert os.path.exists(journal)

    # the next start leaves fla out - and still rolls the half-written fla back before anything imports it
    if left_out == "FASTPATH_HOOKS_SKIP":
        script, run_env = AFTER % "", dict(env, FASTPATH_HOOKS_SKIP="fla")
    else:
        script, run_env = AFTER % "kernels=['causal-conv1d']", env
    after = venv.run(script, env=run_env, timeout=300)
    assert after.returncode == 0 and "Traceback" not in after.stderr, after.stderr
    assert json.loads(after.stdout.strip().splitlines()[-1]) == {"fla": "ModuleNotFoundError"}, after.stdout
    assert "was interrupted" in after.stderr, after.stderr
    assert not os.path.exists(journal)
    assert not os.path.exists(os.path.join(venv.site, "fla"))
    assert not [n for n in os.listdir(venv.site) if n.startswith(("fla_core", "flash_linear_attention"))]
    assert venv.pip_check() == pip_check_before

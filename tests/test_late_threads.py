"""A late install() holds no lock while it installs (issue 17, defect 6).

install() after a modeling module was imported runs the late pass (hooks/late.py), which may install a
kernel - minutes for a build. That pass used to hold the package's lock the whole time, callbacks
included, so another thread's install() / uninstall() waited for the whole install. Now it claims its
modules under the lock, decides (installs) with no lock held, and takes the lock again only to rebind.

Real threads in a real process of a real venv (real transformers, era C): the install is made slow
through the package's own setting, FASTPATH_HOOKS_INDEX_URL - a local index that answers only when
the test lets it - while the wheels come from a local wheelhouse.
"""

from __future__ import annotations

import json

import pytest

from conftest import A100, offline_env
from support.processes import link_uv

pytestmark = pytest.mark.slow   # a real venv with torch and transformers, a real install

SCRIPT = r'''
import http.server, json, os, sys, threading, time

requested, release = threading.Event(), threading.Event()

class SlowIndex(http.server.BaseHTTPRequestHandler):
    """An index that knows nothing, and says so only once released: the installer waits on it."""
    def do_GET(self):
        requested.set()
        release.wait(60)
        self.send_response(404)
        self.end_headers()
    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowIndex)
threading.Thread(target=server.serve_forever, daemon=True).start()
os.environ["FASTPATH_HOOKS_INDEX_URL"] = f"http://127.0.0.1:{server.server_address[1]}/simple"

import transformers.models.qwen3_5.modeling_qwen3_5 as modeling   # chooses the torch path: no fla yet
import fastpath_hooks

events = []
late = threading.Thread(target=lambda: fastpath_hooks.install(on_event=events.append))
late.start()                                     # the late pass decides fla: installs it
assert requested.wait(180), "the installer never asked the index"
took = {}

def other_thread():
    for name, call in (("install", fastpath_hooks.install), ("uninstall", fastpath_hooks.uninstall),
                       ("install again", fastpath_hooks.install)):
        start = time.monotonic()
        call()
        took[name] = time.monotonic() - start

other = threading.Thread(target=other_thread)
other.start()
other.join(10)                                   # promptly - or not at all while the install runs
took["while the install ran"] = not release.is_set() and "fla" not in sys.modules
release.set()
other.join(120)
late.join(300)
import importlib.metadata
import inspect
def _decorated(fn):
    """The function transformers' decorator made: the module global itself, or - under HF kernels (5.25; 5.23/5.24
    with kernels 0.18) - the one the `Func` module it became calls (the `func` its forward closes over)."""
    if getattr(fn, "__code__", None) is None and callable(getattr(type(fn), "forward", None)):
        fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)
    return fn

function = _decorated(modeling.torch_chunk_gated_delta_rule)
closure = dict(zip(function.__code__.co_freevars, (c.cell_contents for c in function.__closure__)))
print(json.dumps({"took": took, "fla": importlib.metadata.version("fla-core"), "late_alive": late.is_alive(),
                  "said": [e["message"] for e in events if e["kernel"] == "fla"],
                  "resolved": closure["implementation"].__module__}))
'''


def test_another_threads_install_and_uninstall_return_while_a_late_install_runs(make_venv, make_wheelhouse, tmp_path):
    venv = make_venv()                     # transformers "latest" (era C)
    link_uv(venv)
    wheelhouse = make_wheelhouse(fla="0.6.0")
    env = offline_env(wheelhouse, A100, cache_dir=str(tmp_path / "cache"), FASTPATH_HOOKS_INSTALLER="uv",
                      FASTPATH_HOOKS_SKIP="causal-conv1d,mamba-ssm")
    env.pop("FASTPATH_HOOKS_OFFLINE")      # the (slow) index is asked too
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = venv.run(SCRIPT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    took = out["took"]
    assert set(took) == {"install", "uninstall", "install again", "while the install ran"}, (took, proc.stderr)
    assert took["while the install ran"] is True, took
    assert all(took[name] < 5 for name in ("install", "uninstall", "install again")), took
    # and the late pass still did its job: installed fla, and (installed again by then) rebound the module to it
    assert out["fla"] == "0.6.0" and not out["late_alive"], (out, proc.stderr)
    assert out["resolved"].startswith("fla."), (out, proc.stderr)

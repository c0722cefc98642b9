"""act/jit_share.py: the check's parallel JIT. A CPU machine has no Triton compiler, so a stand-in `triton` package
(the autotuner's API as Triton 3.6 has it: configs, prune_configs, fn.run(..., warmup=...)) records what was
compiled and what ran: a helper compiles only its share of each autotuned kernel's configurations and runs the
first of them untimed; the check process compiles all of them first (threads where Triton has AsyncCompileMode)
and leaves the timing and the choice to Triton."""

import json
import os
import subprocess
import sys

STAND_IN = '''
import json, os
LOG = []

class Config:
    def __init__(self, n):
        self.n = n
    def all_kwargs(self):
        return {"BLOCK": self.n}

class JIT:
    def run(self, *args, grid, warmup, **kw):
        LOG.append(("compile" if warmup else "launch", kw["BLOCK"]))

class Autotuner:
    def __init__(self, configs):
        self.configs, self.fn, self.arg_names, self.nargs = configs, JIT(), ["x"], None
    def prune_configs(self, kwargs):
        return self.configs
    def run(self, *args, **kwargs):   # Triton: time each configuration (a launch each), then run the best
        if len(self.configs) > 1:
            for c in self.configs:
                self.fn.run(*args, **kwargs, **c.all_kwargs())
        self.fn.run(*args, **kwargs, **self.configs[0].all_kwargs())
'''

CHILD = r'''
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("share", sys.argv[1])
share = importlib.util.module_from_spec(spec)
spec.loader.exec_module(share)
from triton.runtime import autotuner as at
assert share.patch_autotuner(share=json.loads(sys.argv[2]), threads=int(sys.argv[3]))
tuner = at.Autotuner([at.Config(n) for n in range(8)])
tuner.run(1, grid=(1,), warmup=False)
tuner.run(1, grid=(1,), warmup=False)   # the same call again: its share is not compiled twice
print(json.dumps(at.LOG))
'''


def _run(tmp_path, share, threads=0):
    pkg = tmp_path / "triton" / "runtime"
    pkg.mkdir(parents=True, exist_ok=True)
    (tmp_path / "triton" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "autotuner.py").write_text(STAND_IN)
    from fastpath_hooks.act import jit_share

    proc = subprocess.run([sys.executable, "-c", CHILD, jit_share.__file__, json.dumps(share), str(threads)],
                          env=dict(os.environ, PYTHONPATH=str(tmp_path)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [tuple(x) for x in json.loads(proc.stdout)]


def test_a_helper_compiles_its_share_and_runs_its_first_untimed(tmp_path):
    log = _run(tmp_path, [2, 3])          # helper 2 of 3: configurations 2 and 5
    assert [b for k, b in log if k == "compile"] == [2, 5]
    assert [b for k, b in log if k == "launch"] == [2, 2]   # one untimed run per call, no timing of the others


def test_the_check_compiles_every_configuration_first_and_triton_still_times_them(tmp_path):
    log = _run(tmp_path, None)
    assert [b for k, b in log if k == "compile"] == list(range(8))      # once, not again at the second call
    assert log[:8] == [("compile", n) for n in range(8)]                # before Triton's own timing launches
    assert [b for k, b in log if k == "launch"] == list(range(8)) + [0] + list(range(8)) + [0]


def test_without_triton_nothing_is_patched(tmp_path):
    from fastpath_hooks.act import jit_share

    code = ("import importlib.util, sys\nspec = importlib.util.spec_from_file_location('s', sys.argv[1])\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "sys.modules['triton'] = None\nprint(m.patch_autotuner())")
    proc = subprocess.run([sys.executable, "-c", code, jit_share.__file__], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr

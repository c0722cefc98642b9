"""A kernel whose check waits for its first call (issue 39): fla's one check pass runs at the shapes, dtype, length
and variant the model calls it with, and its JIT lands in the caches the training process reads.

Installed kernels are imported and checked as always; the check pass is not run then. It starts at once in the
background at the shapes the decision knows (the model's configuration, else the pins' defaults), while the model
is built; the kernel's first call (hooks/first_call.py holds its functions) gives the real ones and waits for the
verdict of a pass with exactly those - the running one, a remembered one, or one started then. A pass serves the
kernel (and writes the warm verdict the decision held back); a failure blocks it on this GPU (remembered as a
numeric mismatch) and the call takes transformers' torch path. A payload of plain data describes it, so a warm
verdict carries it to later processes, whose first call then finds the remembered pass.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time

from .. import events
from ..act.store import check_key   # (a warm verdict makes a FirstCall at every start: only what is loaded then)

CALL_FIELDS = ("shapes", "dtype", "tune_seq", "final_state", "varlen")   # what a first call gives the check


class _Spec:
    """What the check child needs of the kernel's pins entry."""

    def __init__(self, payload: dict):
        self.name = payload["kernel"]
        self.verify_modules = tuple(payload["modules"])
        self.verify_attributes = tuple(payload["attributes"])
        self.distributions = tuple(payload["distributions"])


class _Job:
    """One check pass in the check child, run by a thread of ours; its group killed if this process exits first."""

    def __init__(self, owner, check: dict, key: str):
        self.key, self.done, self.result, self.pgid = key, threading.Event(), None, None
        self.thread = threading.Thread(target=self._run, args=(owner, check), daemon=True,
                                       name=f"fastpath-hooks check {owner.kernel}")
        self.thread.start()

    def _run(self, owner, check):
        try:
            self.result = owner.run(check, started=self._started)
        except BaseException as exc:   # noqa: BLE001 - never into the user's thread: the waiter reads it
            self.result = (False, f"the check could not run: {type(exc).__name__}: {exc}", 0.0, True, False)
        finally:
            self.done.set()

    def _started(self, pgid):
        self.pgid = pgid
        if pgid is not None:
            _LIVE.add(pgid)
        else:
            _LIVE.discard(self.pgid)

    def cancel(self) -> None:
        pgid = self.pgid
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass


_LIVE: set = set()   # process groups of running checks: killed at exit (a check outlives no user process)


@atexit.register
def _kill_live() -> None:
    for pgid in list(_LIVE):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


class FirstCall:
    """A kernel's check held for its first call. `payload`: plain data (first_call_payload); `warm`: the warm verdict
    the decision held back, written once a pass is known, with `cache` (this process's VerdictCache)."""

    def __init__(self, payload: dict, runner, *, warm=None, cache=None):
        self.payload, self.kernel, self._runner = payload, payload["kernel"], runner
        self.check = dict(payload["check"])
        self.functions = tuple(payload.get("functions") or ())
        self._warm, self._cache = warm, cache
        self._lock = threading.Lock()
        self.numeric = False        # a failed verdict was on the kernel's numbers (else: the check could not run)
        self._jobs: dict = {}       # check key -> _Job
        self._verdicts: dict = {}   # check key -> (ok, detail)
        self.ran: list = []         # the checks run by this process (the call's facts), for doctor and tests

    def for_call(self, call: dict | None = None) -> dict:
        """The decision's check with what the kernel's first call gives (shapes, dtype, length, variant)."""
        check = {**self.check, "first_call": False}
        check.update({k: v for k, v in (call or {}).items() if k in CALL_FIELDS and v is not None})
        return check

    def start(self, facts: dict | None = None) -> None:
        """The pass at the shapes the decision knows - or the model's configuration gives (`facts`) - in the
        background while the model is built (hooks/first_call.py starts it once the kernel's functions are held)."""
        check = self.for_call(facts)
        with self._lock:
            self._job(check)

    def _job(self, check: dict) -> _Job:
        key = check_key(check)
        job = self._jobs.get(key)
        if job is None:
            job = self._jobs[key] = _Job(self, check, key)
        return job

    def verdict(self, call: dict) -> tuple:
        """(ok, detail) of the pass at the call's facts: waits for it; a pass started for other facts is stopped."""
        check = self.for_call(call)
        key = check_key(check)
        with self._lock:
            known = self._verdicts.get(key)
            if known is not None:
                return known
            for other in list(self._jobs.values()):
                if other.key != key and not other.done.is_set():
                    other.cancel()     # it compiles what this model never runs: the cores go to the right one
            job = self._job(check)
        began = time.monotonic()
        if not job.done.is_set():
            events.status(f"{self.kernel}: its first call waits for its check at the model's shapes "
                          f"({_facts(check)})", self.kernel)
        job.done.wait()
        ok, detail, seconds, child, numeric = job.result
        with self._lock:
            first = key not in self._verdicts
            self._verdicts[key] = (ok, detail)
        if first:
            self.ran.append({"check": {k: check.get(k) for k in CALL_FIELDS}, "ok": ok, "child": child,
                             "waited_s": round(time.monotonic() - began, 2), "seconds": round(seconds, 2)})
            self._conclude(ok, detail, numeric)
        return ok, detail

    def run(self, check: dict, *, started=None) -> tuple:
        """(ok, detail, seconds, ran a child, a verdict on its numbers) of one pass (remembered, else the child),
        run through the World (world.py: `first_check`)."""
        result = self._runner(self.payload, check, started=started)
        # a pass that ran its numbers and missed (or raised in its kernel) is a verdict; a child killed or timed out
        # is not (a FAILED verdict, tried again after FASTPATH_HOOKS_RETRY_AFTER)
        numeric = not result.ok and "gated-delta-rule check:" in result.detail
        return result.ok, result.detail, result.seconds, result.child, numeric

    def _conclude(self, ok: bool, detail: str, numeric: bool) -> None:
        p = self.payload
        self.numeric = numeric
        if ok:
            events.status(f"{self.kernel}: checked at its first call: {detail}", self.kernel, human=False)
            if self._warm is not None and self._cache is not None:
                warm, self._warm = self._warm, None
                self._cache.record(self.kernel, warm=warm)
            return
        if numeric:
            from ..act.numeric import remember_mismatch
            from ..act.store import installed_digest

            remember_mismatch(p["root"], self.kernel, digest=installed_digest(p["distributions"]),
                              version=p.get("version"), archs=p["gpus"], build=p["torch_build"], detail=detail)


def config_facts(attrs: dict, repeat: bool, frame) -> dict:
    """The shapes (and dtype, where it says) of the model being built: the transformers configuration in the
    nearest frame that holds one (`from_config(config)`, `from_pretrained` after loading it) - the kernel is
    imported and installed while its modeling module is, for that model. `attrs`: "k" / "v" / "heads_k" /
    "heads_v" -> the configuration's attributes (facts/probe.config_attributes); `repeat`: this transformers
    repeats q and k to the value heads. {} where none is found."""
    while frame is not None:
        for value in list(frame.f_locals.values()):
            kind = type(value)   # the class only: a lazy module's __getattr__ must not run
            if isinstance(getattr(kind, "model_type", None), str) and callable(getattr(kind, "to_dict", None)):
                try:
                    config = value.get_text_config() if callable(getattr(kind, "get_text_config", None)) else value
                    return _shape_facts(config, attrs, repeat)
                except Exception:   # a configuration of another shape: the decision's shapes
                    return {}
        frame = frame.f_back
    return {}


def _shape_facts(config, attrs: dict, repeat: bool) -> dict:
    found = {}
    for key in ("k", "v", "heads_k", "heads_v"):
        value = next((getattr(config, a) for a in attrs.get(key, ()) if hasattr(config, a)), None)
        if not isinstance(value, int) or isinstance(value, bool):
            return {}
        found[key] = value
    facts = {"shapes": [[found["heads_v"] if repeat else found["heads_k"], found["heads_v"], found["k"], found["v"]]]}
    # transformers 5 names it `dtype` (its `torch_dtype` says it is deprecated), 4.x `torch_dtype`
    dtype = getattr(config, "dtype", None) if "dtype" in dir(config) else getattr(config, "torch_dtype", None)
    dtype = str(dtype or "").replace("torch.", "")
    if dtype in ("bfloat16", "float16"):   # float32 / unset: the model may be cast or autocast - the pins' default
        facts["dtype"] = dtype
    return facts


def _facts(check: dict) -> str:
    shapes = ", ".join("x".join(str(n) for n in s) for s in check.get("shapes") or ())
    tail = f", {check['tune_seq']} tokens" if check.get("tune_seq") else ""
    return f"{shapes}, {check.get('dtype')}{tail}"


def run_check(payload: dict, check: dict, *, started=None):
    """The pass in the check child, unless remembered (act/verify.check_now): the World's `first_check`."""
    from ..act.verify import check_now

    return check_now(_Spec(payload), check, timeout=payload["timeout"],
                     env_extra=tuple(map(tuple, payload["env_extra"])), root=payload["root"],
                     gpus=tuple(payload["gpus"]), keyed=tuple(payload["keyed"]), started=started)


def repeats_heads(spec, env) -> bool:
    """Whether this transformers repeats q and k to the value heads before calling the kernel (pins `warm`)."""
    warm, transformers = spec.warm, env.dist_version("transformers")
    return bool(warm and transformers is not None and not warm.gva_transformers.contains(transformers,
                                                                                        prereleases=True))


def beside_build(decision, spec, env, pins, frame):
    """A decision whose check waits for the first call, installed while another kernel builds (a batch): its check
    runs now, beside the build, at the shapes the model's configuration gives - the first call then finds the pass
    remembered (engine/first_call.FirstCall)."""
    from dataclasses import replace

    from ..facts.frozen import thaw
    from ..facts.probe import config_attributes

    check = thaw(decision.check) if decision.check else None
    if not check or not check.get("first_call"):
        return decision
    facts = config_facts(config_attributes(pins), repeats_heads(spec, env), frame)
    return replace(decision, check={**check, **{k: v for k, v in facts.items() if k in CALL_FIELDS},
                                    "first_call": False})


def first_call_payload(decision, spec, *, settings_root: str, env, pins, timeout: float, version) -> dict | None:
    """What a FirstCall needs, as plain data, where `decision`'s check waits for the kernel's first call;
    `config`/`repeat`: how a model's configuration gives the shapes (hooks/first_call.config_facts)."""
    from ..facts.frozen import thaw
    from ..facts.memory import torch_build
    from ..facts.probe import config_attributes

    check = thaw(decision.check) if decision.check else None
    if not check or not check.get("first_call"):
        return None
    return {"kernel": spec.name, "check": check, "functions": list(spec.verify_attributes),
            "config": config_attributes(pins), "repeat": repeats_heads(spec, env),
            "modules": list(spec.verify_modules), "attributes": list(spec.verify_attributes),
            "distributions": list(spec.distributions), "env_extra": [list(p) for p in decision.env],
            "root": settings_root, "gpus": list(env.gpus), "keyed": sorted(pins.keyed), "timeout": timeout,
            "torch_build": torch_build(env), "version": version}

"""benchmarks/qla_speedup.py, checked on a CPU: its report decides what the H200 run means (the speedup of
flash-qla over fla + tilelang at the longest sequence -> pins `pays.hazard`; the first step after the
warm-up against a warm one; the first losses of all paths), and its dry run drives every phase on tiny
models in child processes, as the H200 run does (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import benchmarks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = benchmarks.path("qla_speedup")


def _bench():
    return benchmarks.load("qla_speedup")


def _run(model, seq, mode, ms, loss=10.8, first=None, calls=None):
    return {"model": model, "seq": seq, "mode": mode, "median_step_ms": ms, "first_loss": loss,
            "first_step_s": first if first is not None else ms / 1e3 * 1.5, "flash_qla_calls": calls}


def _phases(qla_ms_16k, *, first_s=0.05, qla_loss=10.8, calls=4):
    return {
        "torch": {"phase": "torch", "runs": [_run("qwen3_5", 4096, "torch", 213.0), _run("qwen3_5", 16384, "torch", 1429.0)]},
        "fast": {"phase": "fast", "setup_s": 240.0, "runs": [
            _run("qwen3_5", 4096, "qla", 30.0, first=first_s, calls=calls), _run("qwen3_5", 4096, "fla", 36.7),
            _run("qwen3_5", 16384, "qla", qla_ms_16k, loss=qla_loss, calls=calls), _run("qwen3_5", 16384, "fla", 145.8)]},
        "cold": {"phase": "cold", "runs": [_run("qwen3_5", 4096, "qla", 30.0, first=61.0, calls=calls)]},
    }


def test_flash_qla_pays_keeps_the_pins_and_the_table_has_every_path():
    bench = _bench()
    rep = bench.report(_phases(100.0))
    v = rep["verdict"]
    assert v["pays"] and round(v["speedup_at_longest"], 3) == round(145.8 / 100.0, 3)
    assert v["pins"] == "keep kernels.flash-qla.pays.hazard = true"
    assert v["first_within_2x"] and round(v["first_over_warm"], 3) == round(0.05 / 0.03, 3) and v["losses_agree"]
    row = next(r for r in rep["rows"] if r["seq"] == 4096)
    assert (row["torch_ms"], row["fla_ms"], row["qla_ms"], row["cold_first_s"]) == (213.0, 36.7, 30.0, 61.0)
    text = bench.table(rep)
    assert "| qwen3_5 | 16384 | 1429.0 | 145.8 | 100.0 | 1.46x | 14.3x |" in text and "pays ->" in text


@pytest.mark.parametrize("change,verdict,fragment", [
    (dict(qla_ms_16k=130.0), "pays", 'set "hazard": false in kernels.flash-qla.pays'),        # 1.12x < 1.3x
    (dict(qla_ms_16k=100.0, calls=0), "pays", 'set "hazard": false in kernels.flash-qla.pays'),  # it never ran
    (dict(qla_ms_16k=100.0, first_s=0.09), "first_within_2x", "3.0x a warm step"),
    (dict(qla_ms_16k=100.0, qla_loss=10.9), "losses_agree", "first losses agree within 0.001: False"),
])
def test_what_misses_a_target_is_said(change, verdict, fragment):
    bench = _bench()
    rep = bench.report(_phases(**change))
    assert rep["verdict"][verdict] is False
    assert fragment in bench.table(rep)


def test_the_cold_phase_gives_only_its_first_step_never_a_step_time():
    """The cold phase times its first steps, JIT included: without a fast phase its runs must not stand in for
    flash-qla's step time (the 2026-12-01 table showed a 73 s "median" that way)."""
    bench = _bench()
    phases = _phases(100.0)
    del phases["fast"]
    phases["cold"]["runs"][0]["median_step_ms"] = 73297.6
    row = next(r for r in bench.report(phases)["rows"] if r["seq"] == 4096)
    assert row["qla_ms"] is None and row["qla_over_fla"] is None and row["cold_first_s"] == 61.0


def test_a_model_this_transformers_lacks_is_skipped_with_a_line_saying_so():
    """The H200 image has transformers 5.17.0: both models are there (qwen3_5_text / qwen3_next causal LMs,
    read from its wheel); one a transformers lacks is skipped, said in the phase and the table."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    bench = _bench()
    assert [bench.missing(k, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "x") for k in bench.MODELS] == [None, None]
    without_next = {k: v for k, v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items() if k != "qwen3_next"}
    why = bench.missing("qwen3_next", without_next, "5.1.0")
    assert why == "qwen3_next: transformers 5.1.0 has no Qwen3-Next causal-LM model ('qwen3_next'): skipped"
    assert "not a model of this benchmark" in bench.missing("qwen3", MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "x")
    phases = _phases(100.0)
    phases["fast"]["skipped"] = [why]
    assert f"skipped: {why}" in bench.table(bench.report(phases))


@pytest.mark.slow
def test_the_dry_run_drives_every_phase_on_a_cpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPATH_HOOKS_")}
    env["FASTPATH_HOOKS_CACHE_DIR"] = str(tmp_path / "cache")
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, SCRIPT, "dry-run"], capture_output=True, text=True, env=env, timeout=900,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (work,) = [p for p in os.listdir(tmp_path) if p.startswith("flash-qla-dry-")]
    rep = json.load(open(tmp_path / work / "report.json"))
    assert {p for p in rep["phases"]} == {"torch", "fast", "cold"} and not rep["errors"]
    assert [(r["model"], r["seq"]) for r in rep["rows"]] == [("qwen3_5", 32), ("qwen3_5", 64), ("qwen3_next", 32),
                                                              ("qwen3_next", 64)]
    assert all(r["torch_ms"] and r["fla_ms"] and r["qla_ms"] for r in rep["rows"])
    assert rep["verdict"]["losses_agree"]     # one init, one batch: the same first loss on every path
    assert "| qwen3_next | 64 |" in proc.stdout


@pytest.mark.slow
def test_the_h200_script_runs_every_phase_in_one_call_on_a_cpu(tmp_path, fastpath_wheel):
    """benchmarks/h200_qla.sh as the lead runs it (no arguments: facts start torch wait report), on a CPU with
    tiny models and no kernel wheels for the cold venv: the background (cold, then fast after the torch phase)
    is waited for, its files come to $OUT and the report is made - the orchestration, not the figures."""
    import shutil

    run_dir = tmp_path / "run"
    (run_dir / ".gpu").mkdir(parents=True)
    shutil.copy(fastpath_wheel, run_dir / ".gpu")
    shutil.copytree(os.path.join(ROOT, "benchmarks"), run_dir / "benchmarks")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPATH_HOOKS_")}
    env.update(BASE=sys.executable, COLD_WHEELS="", WORK=str(tmp_path / "work"), OUT=str(tmp_path / "out"),
               WAIT_UNTIL="500", BENCH_ARGS="--device cpu --hidden 64 --intermediate 128 --heads 2 --vocab 128 "
               "--linear 2x2x16 --seqs 32 --steps 1 --warmup 0 --torch-short-from 32")
    proc = subprocess.run(["bash", "benchmarks/h200_qla.sh"], cwd=run_dir, env=env, capture_output=True, text=True,
                          timeout=580)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "background done: fast 0, cold 0" in proc.stdout, proc.stdout[-3000:]
    out = tmp_path / "out"
    assert {"log.txt", "torch.json", "bg.log", "cold.json", "fast.json", "qla-h200.json"} <= set(os.listdir(out))
    rep = json.load(open(out / "qla-h200.json"))
    assert {p for p in rep["phases"]} == {"torch", "fast", "cold"} and not rep["errors"]
    assert [(r["model"], r["seq"], bool(r["cold_first_s"])) for r in rep["rows"]] == [("qwen3_5", 32, True),
                                                                                      ("qwen3_next", 32, False)]


# -- benchmarks/first_step.py: the first training step of a fresh process ----------------------------------

def _first_step():
    return benchmarks.load("first_step")      # it imports qla_speedup beside it


def _case(case, path, first_s, warm_ms, **kw):
    return {"case": case, "path": path, "model": "qwen3_5", "seq": kw.pop("seq", 4096), "primer": None,
            "preload": None, "profile": False, "first_step_s": first_s, "first_forward_s": first_s / 2,
            "first_backward_s": first_s / 2, "median_warm_ms": warm_ms, "first_over_warm": first_s / (warm_ms / 1e3),
            "modules_imported_in_step": 0, "imported_in_backward": [], "timings_s": {"build": 1.0}, **kw}


def test_the_first_step_verdict_comes_from_the_plain_fresh_processes_only():
    """The verdict is the median of the plain fresh processes of each path; the cold case (minutes of JIT), the
    long sequence and the primed or profiled cases are shown, never mixed into it."""
    bench = _first_step()
    runs = [_case("fla-1", "fla", 0.070, 37.0), _case("fla-2", "fla", 0.060, 37.0), _case("fla-3", "fla", 0.090, 38.0),
            _case("torch-1", "torch", 3.0, 250.0), _case("torch-2", "torch", 3.2, 254.0),
            _case("fla-cold", "fla", 144.0, 37.0), _case("fla-16k", "fla", 9.0, 147.0, seq=16384),
            _case("fla-primer", "fla", 0.040, 36.0, primer="cuda")]
    rep = bench.report(runs)
    v = rep["verdict"]
    assert v["fla_first_s"] == 0.070 and v["fla_warm_ms"] == 37.0 and v["first_within_2x"] is True    # 1.9x
    assert round(v["fla_first_over_warm"], 2) == round(0.070 / 0.037, 2)
    assert v["torch_first_s"] == 3.1 and v["fla_cold_first_s"] == 144.0 and v["fla_16k_first_s"] == 9.0
    text = bench.table(rep)
    assert "without the warm-up (empty JIT caches): first step 144.00 s" in text
    assert [r["case"] for r in rep["rows"]][:3] == ["torch-1", "fla-1", "fla-2"]      # the series' order
    runs[1] = _case("fla-2", "fla", 0.095, 37.0)                                        # the median now 2.4x
    slower = bench.report(runs)
    assert slower["verdict"]["first_within_2x"] is False and "2.4x a warm step (target <= 2.0x): not met" in \
        bench.table(slower)

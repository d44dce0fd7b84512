"""``s1omni bench`` on the tiny synthetic member, on the CPU: one short run in process and over HTTP
against a real ``s1omni serve``, then checks that the record's figures follow from its own samples."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from pathlib import Path

import pytest

from s1omni.bench.profiler import HOST, idle
from s1omni.bench.run import http_ratios, subject_names
from s1omni.cli.bench import served_instances
from s1omni.bench.http_load import Load, captured_graphs, request_body, server_cpu, server_timing, settle
from s1omni.bench.stats import nearest_rank, quantiles_ms, ratios, summarize
from s1omni.bench.workloads import REFERENCE, backbone, measure, named
from s1omni.cli.main import main
from s1omni.runtime.errors import UsageError

STAGES = {"parse", "tokenize", "queue", "forward", "heads", "post", "serialize", "total"}


def ranked(values: list[float], q: float) -> float:
    """Nearest rank, written out independently of the code under test."""
    ordered = sorted(values)
    return ordered[math.ceil(q / 100 * len(ordered)) - 1]


def check_summary(summary: dict, count: int) -> None:
    samples = summary["samples_ms"]
    assert summary["count"] == len(samples) == count
    assert summary["p50_ms"] == ranked(samples, 50)
    assert summary["p95_ms"] == ranked(samples, 95)
    assert summary["min_ms"] <= summary["p50_ms"] <= summary["p95_ms"] <= summary["max_ms"]
    assert summary["requests_per_s"] == pytest.approx(count / summary["wall_s"], rel=1e-3)


@pytest.fixture(scope="module")
def record(tiny_vela: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("bench")
    argv = ["bench", "--package", str(tiny_vela), "--workloads", "backbone,noul-default,noul-default@2", "--tokens", "32",
            "--requests", "3", "--warmup", "1", "--profile", "noul-default",
            "--http", "--http-workload", "noul-default", "--http-profile", "batching", "--concurrency", "1,2",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    return json.loads((out / "bench.json").read_text(encoding="utf-8")), out


def test_record_structure(record: tuple[dict, Path]) -> None:
    data, out = record
    assert data["format"] == "s1omni-bench/2"
    assert data["started"] <= data["finished"]
    assert data["failures"] == 0
    machine = data["machine"]
    assert machine["cpu_count"] >= 1 and machine["gpu_count"] == len(machine["gpus"])
    assert machine["torch"] and machine["onnxruntime"]
    assert data["member"]["id"] == "vela2-synth-tiny-s0"
    reference = data["subjects"][REFERENCE]
    assert (reference["runner"], reference["device"], reference["precision"]) == ("torch", "cpu", "fp32")
    # On the CPU the fallback is the only reference, and the record says why.
    assert (reference["kernels"], reference["fla_version"]) == ("torch", None)
    assert set(reference["layer_functions"].values()) == {"transformers.models.qwen3_5.modeling_qwen3_5"}
    fla = data["references"]["fla"]
    assert data["references"]["subjects"] == [REFERENCE] and list(data["subjects"]) == [REFERENCE]
    assert fla["available"] is False and fla["version"] is None and "CUDA devices only" in fla["reason"]
    assert data["http"]["reference_kernels"] == "torch"
    assert [entry["name"] for entry in data["workloads"]] == ["backbone-32", "noul-default", "noul-default@2"]
    first, single, merged = data["workloads"]
    assert (first["prefix_tokens"], first["block_tokens"], first["input_tokens"]) == (32, 8, 40)
    assert single["input_tokens"] > 0 and single["results"][REFERENCE]["answer_errors"] == 0
    assert merged["merged_requests"] == 2 and merged["input_tokens"] == single["input_tokens"]
    assert merged["results"][REFERENCE]["answer_errors"] == 0
    profile = data["profile"]
    assert profile["workload"] == "noul-default" and profile["subject"] == REFERENCE
    assert profile["wall_ms"] > 0 and profile["operators"] and profile["kernel_ms"] is None
    # A request is also timed step by step: where its milliseconds go on the host.
    assert list(profile["stages_ms"]) == ["plan", "forward", "readout", "finish"]
    assert all(value > 0 for value in profile["stages_ms"].values())
    assert sum(profile["stages_ms"].values()) < 3 * profile["wall_ms_per_iteration"]
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_in_process_percentiles_are_nearest_rank(record: tuple[dict, Path]) -> None:
    for entry in record[0]["workloads"]:
        assert list(entry["results"]) == [REFERENCE] and entry["ratios"] == {}
        assert entry["ratio_reference"] == REFERENCE and entry["reference_ratios"] == {}
        check_summary(entry["results"][REFERENCE], 3)


def test_http_runs(record: tuple[dict, Path]) -> None:
    data, out = record
    http = data["http"]
    assert http["case"] == "noul-default"
    assert (out / http["servers"][REFERENCE]["log"]).is_file()
    # Every request asked for batching, which the bench enabled on the server it started.
    assert http["profile"] == data["settings"]["http_profile"] == "batching"
    assert http["servers"][REFERENCE]["profiles"] == ["exact", "batching"]
    assert "--profiles" in http["servers"][REFERENCE]["command"]
    assert [(run["subject"], run["profile"], run["concurrency"]) for run in http["runs"]] == [
        (REFERENCE, "batching", 1),
        (REFERENCE, "batching", 2),
    ]
    for run in http["runs"]:
        # Steady state: every client warms up, then has at least its 3 requests timed.
        per_client = run["per_client"]
        assert (run["requests_per_client"], run["warmup_per_client"]) == (3, 1)
        assert len(per_client) == run["concurrency"] and min(per_client) == 3 and sum(per_client) == run["count"]
        check_summary(run, run["count"])
        assert run["failures"] == {} and run["untimed"] >= run["concurrency"]
        assert set(run["server_timing_median_ms"]) == STAGES
        # Each response's server time lies inside its client time, so the medians keep that order (the
        # stages' medians average the middle two of an even count, as statistics.median does).
        client_median = statistics.median(run["samples_ms"])
        assert run["server_timing_median_ms"]["total"] <= client_median and run["client_minus_server_median_ms"] >= 0
        # The server's CPU over the level: every answered request seen by both scrapes, the forwards' worker
        # and the event loop among its pools, and the pools within the process's time (its clock ticks 10 ms).
        cpu = run["server_cpu"]
        assert cpu["answered"] == sum(per_client) + run["untimed"]
        assert cpu["pools_ms_per_request"]["s1omni-worker"] > 0 and cpu["pools_ms_per_request"]["MainThread"] > 0
        assert sum(cpu["pools_ms_per_request"].values()) <= cpu["process_ms_per_request"] + 10e3 / cpu["answered"]
        assert 1 <= cpu["mean_requests_per_forward"] <= run["concurrency"] and cpu["forwards"] >= cpu["answered"] / run["concurrency"]
        # The heads begun during the forward ran on the readout pool: per task, a wait for a thread and a run.
        readout = cpu["head_pools"]["s1omni-head-readout"]
        assert readout["tasks_per_request"] >= 1 and readout["wait_ms_per_task"] >= 0 and readout["run_ms_per_task"] > 0
        # The torch reference captures no CUDA graph: no untimed rounds before its levels.
        assert run["settle"]["rounds"] == 0 and run["settle"]["captures"] == 0 and run["settle"]["settled"] is True


def test_merged_requests_answer_as_one_request_each(tiny_model) -> None:
    merged = named("noul-default@3", "vela2")
    single = named("noul-default", "vela2")
    assert merged.copies == 3 and merged.body == single.body
    alone = tiny_model.answer(single.body)
    responses = merged.call(tiny_model)()
    assert len(responses) == 3
    for response in responses:
        assert response["answers"] == alone["answers"] and response["usage"] == alone["usage"]
    with pytest.raises(UsageError, match="only requests merge"):
        named("backbone-16@2", "vela2")
    with pytest.raises(UsageError, match="no workload"):
        named("noul-default@0", "vela2")


def test_a_shared_context_workload_runs_the_packed_forward_where_there_is_one(tiny_model, cpu_engine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from s1omni.runtime.engine import load_engine_model

    packed = named("router:shared_context", "vela2")
    assert packed.packed and packed.body == named("router", "vela2").body and packed.facts["profile"] == "shared_context"
    engine = load_engine_model(cpu_engine, allow_unvalidated=True)
    ran: list[str] = []
    monkeypatch.setattr(engine, "forward_packed", lambda plans, run=engine.forward_packed: ran.append("packed") or run(plans))
    exact = engine.answer(packed.body)
    assert [response["answers"].keys() for response in packed.call(engine)()] == [exact["answers"].keys()] and ran == ["packed"]
    assert packed.forward(tiny_model) == tiny_model.forward  # the torch reference has no packed forward: exact
    with pytest.raises(UsageError, match="only Vela 2.0 requests run shared_context"):
        named("backbone-16:shared_context", "vela2")


def test_a_request_runs_in_steps_and_a_backbone_workload_does_not(tiny_model) -> None:
    steps = named("noul-default@2", "vela2").stages(tiny_model)()
    assert list(steps) == ["plan", "forward", "readout", "finish"] and all(value > 0 for value in steps.values())
    with pytest.raises(UsageError, match="only requests run in steps"):
        named("backbone-16", "vela2").stages(tiny_model)


def test_server_cpu_is_per_answered_request_and_only_where_the_scrapes_saw_them_all() -> None:
    def samples(requests: float, process: float, worker: float, loop: float, forwards: float, merged: float, heads: tuple,
                graphs: tuple) -> dict:  # fmt: skip
        ok = (("code", "ok"), ("route", "/v1/systemone"), ("status", "200"))
        readout, chunks = (("pool", "s1omni-head-readout"),), (("pool", "s1omni-span-head"),)
        return {
            ("s1omni_cuda_graph_captures_total", ()): graphs[0],
            ("s1omni_cuda_graph_capture_seconds_total", ()): graphs[1],
            ("s1omni_cuda_graph_deferred_runs_total", ()): graphs[2],
            ("s1omni_head_pool_tasks_total", readout): heads[0],
            ("s1omni_head_pool_wait_seconds_total", readout): heads[1],
            ("s1omni_head_pool_run_seconds_total", readout): heads[2],
            ("s1omni_head_pool_tasks_total", chunks): 3.0,  # no task between the scrapes
            ("s1omni_head_pool_wait_seconds_total", chunks): 0.1,
            ("s1omni_head_pool_run_seconds_total", chunks): 0.2,
            ("s1omni_requests_total", ok): requests,
            ("s1omni_requests_total", (("code", "ok"), ("route", "/metrics"), ("status", "200"))): requests * 7,
            ("process_cpu_seconds_total", ()): process,
            ("s1omni_thread_cpu_seconds", (("pool", "s1omni-worker"),)): worker,
            ("s1omni_thread_cpu_seconds", (("pool", "MainThread"),)): loop,
            ("s1omni_batch_requests_count", (("profile", "batching"),)): forwards,
            ("s1omni_batch_requests_sum", (("profile", "batching"),)): merged,
        }

    before = samples(10, 5.0, 1.0, 0.5, 10, 10, (50.0, 1.0, 2.0), (9.0, 1.5, 4.0))
    after = samples(14, 5.2, 1.1, 0.54, 12, 14, (70.0, 1.4, 2.1), (12.0, 2.25, 11.0))
    cpu = server_cpu(before, after, 4)
    assert cpu == {
        "answered": 4, "process_ms_per_request": 50.0, "pools_ms_per_request": {"MainThread": 10.0, "s1omni-worker": 25.0},
        "outside_python_ms_per_request": 15.0, "forwards": 2, "mean_requests_per_forward": 2.0,
        "head_pools": {
            "s1omni-head-readout": {"tasks_per_request": 5.0, "wait_ms_per_task": 20.0, "run_ms_per_task": 5.0},
            "s1omni-span-head": {"tasks_per_request": 0.0, "wait_ms_per_task": None, "run_ms_per_task": None},
        },
        "cuda_graphs": {"captures": 3, "capture_ms": 750.0, "deferred_runs": 7},
    }  # fmt: skip
    assert server_cpu(before, after, 5) is None  # another process's metrics (a Ray Serve replica's) saw fewer
    assert server_cpu(None, after, 4) is None and server_cpu(before, None, 4) is None and server_cpu(before, before, 0) is None


def test_the_http_profile_is_in_every_vela_request_and_in_no_omnijev_one() -> None:
    body = {"state": "x", "questions": {}, "options": {"max_tokens": 8}}
    assert request_body(body, "batching", "vela2") == {**body, "options": {"max_tokens": 8, "profile": "batching"}}
    assert request_body({"state": "x"}, "exact", "vela2") == {"state": "x", "options": {"profile": "exact"}}
    assert request_body(body, "exact", "omnijev") is body  # its contract takes no options


def test_http_clients_are_not_merged_requests(tiny_vela: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--package", str(tiny_vela), "--workloads", "", "--http", "--http-workload", "noul-default@2",
            "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 2  # usage
    assert "must be one request" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_server_of_several_instances_is_warmed_on_each_before_a_level_is_timed(
    tiny_vela: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One client's warm-ups need not reach every instance (on a GPU, a request's first run on an instance
    captures its CUDA graphs: the 4B's p95 at one client was two such runs); a burst of one request an
    instance, untimed, does, before the levels."""
    out = tmp_path / "out"
    argv = ["bench", "--package", str(tiny_vela), "--workloads", "", "--requests", "2", "--warmup", "1", "--http",
            "--http-workload", "noul-default", "--concurrency", "1", "--serve-arg=--instances=2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "warmed its 2 instances (1 x 2 requests at once)" in capsys.readouterr().err
    (run,) = json.loads((out / "bench.json").read_text(encoding="utf-8"))["http"]["runs"]
    assert run["instance_warmup"] == {"instances": 2, "bursts": 1}
    assert run["count"] == sum(run["per_client"]) == 2 and run["failures"] == {}  # the burst is not sampled
    assert served_instances(["--batch-window-ms=2", "--instances", "3"]) == 3 and served_instances([]) == 1


def _rounds_over(counts: list[float | None], limit: int) -> tuple[dict, int, Counter]:
    """``settle`` against a server whose capture counter reads ``counts`` in turn; the rounds it ran."""
    readings, ran = iter(counts), []

    def one_round() -> Load:
        ran.append(1)
        return Load(failures=Counter({"http_500": 1}) if len(ran) == 2 else Counter())

    settled, failures = settle(lambda: next(readings), one_round, limit)
    return settled, len(ran), failures


def test_settling_runs_rounds_until_one_captures_no_graph_and_no_more_than_the_limit() -> None:
    # Captured before, two rounds capture more, the third none: three rounds, settled, the second's failure kept.
    settled, ran, failures = _rounds_over([4, 9, 12, 12], 10)
    assert (settled["rounds"], settled["captures"], settled["settled"], ran) == (3, 8, True, 3) and failures == {"http_500": 1}
    # Still capturing at the limit: stopped there, not settled.
    settled, ran, _ = _rounds_over([4, 9, 12, 15], 3)
    assert (settled["rounds"], settled["captures"], settled["settled"], ran) == (3, 11, False, 3)
    # Nothing captured so far (a server without graphs), no metrics, or no rounds allowed: no round at all.
    for counts, limit in (([0], 10), ([None], 10), ([4], 0)):
        settled, ran, failures = _rounds_over(counts, limit)
        assert ran == 0 and settled["rounds"] == 0 and settled["captures"] == 0 and not failures
    assert _rounds_over([0], 10)[0]["settled"] is True and _rounds_over([4], 0)[0]["settled"] is False
    # The metrics stop answering after a round: not known to have settled.
    settled, ran, _ = _rounds_over([4, None], 10)
    assert (settled["rounds"], settled["settled"], ran) == (1, False, 1)


def test_captured_graphs_sum_the_capture_counter_of_every_label_set() -> None:
    samples = {("s1omni_cuda_graph_captures_total", ()): 3.0, ("s1omni_cuda_graph_captures_total", (("x", "1"),)): 2.0,
               ("s1omni_cuda_graph_deferred_runs_total", ()): 7.0}  # fmt: skip
    assert captured_graphs(samples) == 5.0 and captured_graphs({}) == 0 and captured_graphs(None) is None


def test_ratios_come_from_the_same_run(tiny_model) -> None:
    # Two subjects of one process, timed on the same inputs (the same model twice keeps it quick).
    entry = measure(backbone(16), {REFERENCE: tiny_model, "again": tiny_model}, 3, 1, lambda _: None)
    mine, theirs = entry["results"]["again"], entry["results"][REFERENCE]
    assert entry["ratios"]["again"] == {
        "p50": round(mine["p50_ms"] / theirs["p50_ms"], 4),
        "p95": round(mine["p95_ms"] / theirs["p95_ms"], 4),
    }
    runs = [{"subject": REFERENCE, "concurrency": 1, **theirs}, {"subject": "again", "concurrency": 1, **mine}]
    assert http_ratios(runs)["again"]["1"] == ratios(mine, theirs, ("p50_ms", "p95_ms", "requests_per_s"))


def test_idle_time_is_what_no_kernel_covers_split_by_the_host_call_meanwhile() -> None:
    # Kernels 10-30 (two overlapping) and 50-60 us of a 100 us span, two iterations; a copy call 30-40 and a
    # synchronisation 55-70 on the host.
    found = idle([(10, 20), (15, 30), (50, 60)], [("cudaMemcpy", 30, 40), ("cudaStreamSynchronize", 55, 70)], (0, 100), 2)
    assert found["idle_ms_per_iteration"] == pytest.approx(0.035)  # 0-10, 30-50, 60-100
    assert found["gaps_per_iteration"] == 1.5
    assert found["by_host_call_ms_per_iteration"] == {HOST: 0.025, "cudaMemcpy": 0.005, "cudaStreamSynchronize": 0.005}
    assert [gap["us"] for gap in found["widest"]] == [40, 20, 10]
    assert found["widest"][0]["host"] == {"cudaStreamSynchronize": 10, HOST: 30} and found["widest"][0]["at_ms"] == 0.06
    # A device busy throughout leaves nothing idle, whatever the host did.
    assert idle([(0, 100)], [("cudaMemcpy", 30, 40)], (0, 100), 1)["idle_ms_per_iteration"] == 0


def test_nearest_rank_and_summary() -> None:
    assert nearest_rank([4.0, 1.0, 3.0, 2.0], 50) == 2.0
    assert nearest_rank([float(i) for i in range(1, 21)], 95) == 19.0
    assert nearest_rank([float(i) for i in range(1, 101)], 95) == 95.0
    assert nearest_rank([7.0], 95) == 7.0
    summary = summarize([10.0, 30.0, 20.0], 0.5)
    assert (summary["p50_ms"], summary["p95_ms"], summary["mean_ms"], summary["requests_per_s"]) == (20.0, 30.0, 20.0, 6.0)


def test_quantiles_of_calls_skip_the_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four timed calls of 1, 2, 3 and 4 ms on a fake clock after one warm-up: p50 2 ms and p95 4 ms, nearest rank."""
    clock = iter([0.0, 0.0, 0.001, 0.001, 0.003, 0.003, 0.006, 0.006, 0.010, 0.010])  # start, each call's begin/end, end
    calls = []
    monkeypatch.setattr("s1omni.bench.stats.time.perf_counter", lambda: next(clock))
    assert quantiles_ms(lambda: calls.append(1), 4) == {"p50_ms": 2.0, "p95_ms": 4.0}
    assert len(calls) == 5


def test_server_timing_header() -> None:
    header = (
        "parse;dur=0.120, tokenize;dur=1.500, queue;dur=0.000, forward;dur=12.250, heads;dur=0.800, "
        "post;dur=0.300, serialize;dur=0.050, total;dur=14.400"
    )
    assert server_timing(header) == {
        "parse": 0.12, "tokenize": 1.5, "queue": 0.0, "forward": 12.25, "heads": 0.8, "post": 0.3, "serialize": 0.05,
        "total": 14.4,
    }  # fmt: skip


def test_subjects_are_named_by_backend_target_kernel_and_what_is_not_the_default() -> None:
    cuda = {"backend": "onnxruntime", "target": "cuda", "gated_delta_kernel": "GatedDeltaNet", "op_fusion": True}
    manifests = [{**cuda, "precision": "fp32"}, {**cuda, "precision": "bf16"}, {**cuda, "precision": "fp32"},
                 {**cuda, "precision": "fp32", "op_fusion": False}, {**cuda, "precision": "bf16", "cuda_graphs": True},
                 {"backend": "onnxruntime", "target": "cpu", "gated_delta_kernel": "Scan", "precision": "fp32", "op_fusion": False},
                 {**cuda, "precision": "bf16", "cuda_graphs": True, "gated_delta_inputs": "fp16", "merged_projections": True},
                 {**cuda, "precision": "fp32", "gated_delta_inputs": "fp32", "merged_projections": False},
                 {**cuda, "precision": "bf16", "cuda_graphs": True, "fused_mixers": True}, {**cuda, "precision": "fp32", "fused_mixers": False},
                 {**cuda, "precision": "bf16", "cuda_graphs": True, "fused_mixers": True, "fused_attention": True},
                 {**cuda, "precision": "bf16", "cuda_graphs": True, "fused_mixers": True, "fused_attention": True, "attention_inputs": "fp16"},
                 {**cuda, "precision": "bf16", "cuda_graphs": True, "fused_mixers": True, "bf16_convolutions": True, "fused_short_convolutions": True}]  # fmt: skip
    assert subject_names(manifests) == [
        REFERENCE, "onnxruntime/cuda/GatedDeltaNet", "onnxruntime/cuda/GatedDeltaNet/bf16", "onnxruntime/cuda/GatedDeltaNet#3",
        "onnxruntime/cuda/GatedDeltaNet/unfused", "onnxruntime/cuda/GatedDeltaNet/bf16/graphs", "onnxruntime/cpu/Scan",
        "onnxruntime/cuda/GatedDeltaNet/bf16/graphs/gdn16/merged", "onnxruntime/cuda/GatedDeltaNet#8",
        "onnxruntime/cuda/GatedDeltaNet/bf16/graphs/mixers", "onnxruntime/cuda/GatedDeltaNet#10",
        "onnxruntime/cuda/GatedDeltaNet/bf16/graphs/mixers/attn", "onnxruntime/cuda/GatedDeltaNet/bf16/graphs/mixers/attn16",
        "onnxruntime/cuda/GatedDeltaNet/bf16/graphs/mixers16/convs",
    ]  # fmt: skip


def test_an_engine_that_missed_its_gate_is_timed_in_process_and_not_served(
    exported: Path, tiny_vela: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A built, never validated engine: refused by ``--http`` alone; with ``--allow-unvalidated`` timed in
    process beside the reference and left out of the HTTP levels, which say why."""
    engine = tmp_path / "engine"
    assert main(["build", str(exported), "--backend", "onnxruntime", "--target", "cpu", "--out", str(engine)]) == 0
    argv = ["bench", "--package", str(tiny_vela), "--engine", str(engine), "--workloads", "backbone", "--tokens", "16",
            "--requests", "2", "--warmup", "0", "--http", "--http-workload", "noul-default", "--concurrency", "1"]  # fmt: skip
    assert main([*argv, "--out", str(tmp_path / "refused")]) == 3  # the engine refused
    assert "has not passed validation" in capsys.readouterr().err
    assert main([*argv, "--allow-unvalidated", "--out", str(tmp_path / "record")]) == 0
    data = json.loads((tmp_path / "record" / "bench.json").read_text(encoding="utf-8"))
    name = "onnxruntime/cpu/Scan"
    assert not data["subjects"][name]["validated"] and list(data["workloads"][0]["results"]) == [REFERENCE, name]
    assert [run["subject"] for run in data["http"]["runs"]] == [REFERENCE]
    assert list(data["http"]["servers"]) == [REFERENCE] and data["http"]["skipped"] == {name: "missed its gate: s1omni serve refuses it"}


def test_without_the_http_reference_only_the_engines_are_served(
    cpu_engine: Path, cpu_validation: tuple, tiny_vela: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--no-http-reference``: the validated engine's server alone, the reference listed as skipped and no
    ratios (nothing of this run to divide by); refused before anything loads when no engine is given."""
    argv = ["bench", "--package", str(tiny_vela), "--workloads", "", "--requests", "2", "--warmup", "0",
            "--http", "--http-workload", "noul-default", "--concurrency", "1", "--no-http-reference"]  # fmt: skip
    assert main([*argv, "--out", str(tmp_path / "nothing")]) == 2
    assert "leaves nothing to serve" in capsys.readouterr().err
    assert main([*argv, "--engine", str(cpu_engine), "--out", str(tmp_path / "record")]) == 0
    http = json.loads((tmp_path / "record" / "bench.json").read_text(encoding="utf-8"))["http"]
    name = "onnxruntime/cpu/Scan"
    assert [run["subject"] for run in http["runs"]] == [name] and list(http["servers"]) == [name]
    assert list(http["skipped"]) == [REFERENCE] and http["ratios"] == {}

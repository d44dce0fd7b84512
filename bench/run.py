"""``s1omni bench``: the torch reference and each engine given, timed in one run, as one record.

In process, the reference (loaded from the package: BF16 autocast on CUDA, float32 on the CPU), on
CUDA the same reference with flash-linear-attention's Gated DeltaNet kernels where FLA imports
(``references``), and every engine run the same workloads one after another in the same process;
then, with ``http``, each is served by its own ``s1omni serve`` subprocess in turn and loaded by
closed-loop clients whose requests ask for ``http_profile`` (the server started with it enabled).
Every ratio compares figures of this run only, an engine's against the faster reference of the
workload. The record (``bench.json``) is written after each step, so a run that breaks keeps what
it measured; the plot (``bench.png``) is drawn at the end.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from s1omni.runtime.api import load_model
from s1omni.runtime.engine import build_facts, load_engine_model, read_manifest, validated
from s1omni.runtime.errors import InputError, UsageError
from s1omni.runtime.package import detect_family
from s1omni.runtime.progress import note, track
from s1omni.runtime.registry import Registry
from s1omni.runtime.runners.torch_runner import release_gpu_memory

from . import http_load, records, references, workloads as catalogue
from .http_load import EXACT, SHARED_CONTEXT, BenchFailed
from .references import REFERENCE, REFERENCES
from .stats import DIGITS, now, ratios
from .workloads import Workload

PROFILE_ITERATIONS = 5
MEMBER_KEYS = ("id", "family", "repo", "revision", "model_sha256", "manifest_sha256", "parameters", "weights")


@dataclass(frozen=True)
class Settings:
    package: Path
    out: Path
    engines: tuple[Path, ...] = ()
    device: str = "cpu"
    reference_precision: str | None = None  # None: the reference's policy (bf16 on CUDA, fp32 on the CPU)
    workloads: tuple[str, ...] = ("backbone", "router", "long-span")
    tokens: tuple[int, ...] = (128, 600, 2048)
    requests: int = 30
    warmup: int = 5
    http: bool = False
    http_workload: str = "router"
    http_profile: str = "exact"  # options.profile of every HTTP request; each server is started with it enabled
    concurrency: tuple[int, ...] = (1, 8, 16)
    serve_args: tuple[str, ...] = ()
    http_reference: bool = True  # False: the reference is not served (its HTTP figures come from another run)
    instances: int = 1  # the model instances each server runs with serve_args (its --instances): each is warmed
    settle_rounds: int = http_load.SETTLE_ROUNDS  # untimed rounds at most before a level while the server captures CUDA graphs
    profile: str | None = None  # a workload name: profiled on the first engine (the reference without one)
    allow_unvalidated: bool = False  # in process only: `s1omni serve` refuses such engines, so --http skips them
    registry: str | None = None
    start_timeout_s: float = 900.0
    command: tuple[str, ...] = ()


def check(settings: Settings, manifests: Sequence[dict[str, Any]]) -> None:
    """Refuse a run that could not stand as a measurement before anything loads."""
    if not settings.workloads and not settings.http and not settings.profile:
        raise UsageError("nothing to run (no workloads, no --http, no --profile)")
    if settings.http and not settings.http_reference and not settings.engines:
        raise UsageError("--no-http-reference with no --engine leaves nothing to serve")
    if settings.requests < 1 or settings.warmup < 0 or settings.settle_rounds < 0:
        raise UsageError("--requests must be at least 1, --warmup and --settle-rounds at least 0")
    for path, manifest in zip(settings.engines, manifests, strict=True):
        if settings.http and not validated(manifest) and not settings.allow_unvalidated:
            raise InputError(
                f"{path} has not passed validation, and `s1omni serve --engine` refuses it "
                "(--allow-unvalidated times it in process and leaves it out of --http)"
            )


def subject_names(manifests: Sequence[dict[str, Any]]) -> list[str]:
    """``reference``, then ``backend/target[/kernel][/precision][/unfused][/graphs][/gdn16][/merged][/mixers][/convs][/gates][/onorms][/silu][/norms][/rotary]`` per
    engine, the precision where it is not float32, ``unfused`` for a CUDA build without op fusion, ``graphs`` for one
    replaying CUDA graphs, ``gdn16`` and ``merged`` for a bf16 build with float16 GatedDeltaNet inputs or merged
    projections, ``mixers`` and ``attn`` for one with fused mixers or attention (``mixers16``: its short convolutions in
    bfloat16; ``attn16``: the attention's q/k/v in float16), ``convs`` for one with those short convolutions as the op
    library's (``convheads``: writing the rule's q, k and v), ``gates`` for one with the rule's gates as its op, ``onorms`` for one with its output norms as its op, ``rotary`` for one with the attention's head norms and rotary embeddings as its op, ``silu`` for one with its MLPs' SiLU products fused, ``norms`` for one with its residual norms fused,
    ``vgraphs`` for one replaying its vision tower as CUDA graphs; numbered where two engines share one)."""
    names = [REFERENCE]
    for manifest in manifests:
        precision = manifest.get("precision") if manifest.get("precision") != "fp32" else None
        unfused = "unfused" if manifest.get("op_fusion") is False and manifest["target"] == "cuda" else None
        graphs = "graphs" if manifest.get("cuda_graphs") else None
        gdn16 = "gdn16" if manifest.get("gated_delta_inputs") == "fp16" else None
        merged = "merged" if manifest.get("merged_projections") else None
        mixers = ("mixers16" if manifest.get("bf16_convolutions") else "mixers") if manifest.get("fused_mixers") else None
        convolutions = ("convheads" if manifest.get("fused_convolution_heads") else "convs") if manifest.get("fused_short_convolutions") else None
        gates = "gates" if manifest.get("fused_delta_gates") else None
        output_norms = "onorms" if manifest.get("fused_output_norms") else None
        rotary = "rotary" if manifest.get("fused_head_rotary") else None
        silu = "silu" if manifest.get("fused_silu") else None
        norms = "norms" if manifest.get("fused_residual_norms") else None
        attention = ("attn16" if manifest.get("attention_inputs") == "fp16" else "attn") if manifest.get("fused_attention") else None
        vision_graphs = "vgraphs" if manifest.get("vision_cuda_graphs") else None
        parts = (manifest["backend"], manifest["target"], manifest.get("gated_delta_kernel"), precision, unfused, graphs, gdn16, merged, mixers,
                 convolutions, gates, output_norms, silu, norms, rotary, attention, vision_graphs)  # fmt: skip
        name = "/".join(part for part in parts if part)
        names.append(name if name not in names else f"{name}#{len(names)}")
    return names


def engine_facts(path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    return {
        "engine_dir": str(path),
        **build_facts(manifest),
        "member": manifest["member"]["name"],
        "revision": manifest["member"]["revision"],
        "validated": validated(manifest),
    }


def member_facts(card: dict[str, Any]) -> dict[str, Any]:
    return {key: card.get(key) for key in MEMBER_KEYS}


def load_subjects(
    settings: Settings,
    registry: Registry,
    names: Sequence[str],
    manifests: Sequence[dict[str, Any]],
    reference_names: Sequence[str],
) -> dict[str, Any]:
    """The reference from the package (and its other kernels' twins), then each engine, all in this process;
    refuses another member's engine."""
    note(f"loading the reference from {settings.package} on {settings.device}")
    models = {REFERENCE: load_model(settings.package, registry, settings.device, settings.reference_precision)}
    for name in reference_names[1:]:
        note(f"{name}: the reference's model through {references.KERNELS[name]} kernels")
        models[name] = references.with_kernels(models[REFERENCE], name)
    revision = models[REFERENCE].card()["revision"]
    for name, path, manifest in zip(names[1:], settings.engines, manifests, strict=True):
        member = manifest["member"]
        if member["revision"] != revision:
            raise InputError(
                f"{path} was built from {member['name']}@{member['revision']}, not the package's {revision}"
            )
        note(f"loading the engine {path} as {name}")
        models[name] = load_engine_model(path, registry, settings.device, allow_unvalidated=settings.allow_unvalidated)
    return models


def profile(chosen: Workload, models: dict[str, Any], warmup: int) -> dict[str, Any]:
    from .profiler import capture

    subject = next((name for name in models if name not in REFERENCES), REFERENCE)
    call = chosen.call(models[subject])
    for _ in range(warmup + 1):
        call()
    note(f"profiling {chosen.name} on {subject} ({PROFILE_ITERATIONS} iterations)")
    record = {"workload": chosen.name, "subject": subject, **capture(call, PROFILE_ITERATIONS)}
    if chosen.body is not None:
        # Outside the profiler, whose own overhead would land in the host steps.
        steps = chosen.stages(models[subject])
        samples = [steps() for _ in range(PROFILE_ITERATIONS)]
        record["stages_ms"] = {name: round(statistics.median(s[name] for s in samples) * 1e3, DIGITS) for name in samples[0]}
        note(f"{chosen.name} on {subject}, median ms: " + ", ".join(f"{k} {v:.2f}" for k, v in record["stages_ms"].items()))
    return record


def in_process(
    settings: Settings,
    names: Sequence[str],
    manifests: Sequence[dict[str, Any]],
    workloads: Sequence[Workload],
    profiled: Workload | None,
    record: dict[str, Any],
) -> None:
    """Every workload on every subject in this process, then the profile; the record grows as they finish."""
    fla = record["references"]["fla"]
    models = load_subjects(settings, Registry.load(settings.registry), names, manifests, record["references"]["subjects"])
    record["member"] = member_facts(models[REFERENCE].card())
    for name, model in models.items():
        record["subjects"][name] |= {
            "runner": model.runner.name,
            "device": model.runner.device,
            "precision": model.runner.precision,
            **(references.kernel_facts(model.runner, fla) if name in REFERENCES else {}),
        }
    for chosen in track(workloads, "in-process workloads", unit="workload"):
        record["workloads"].append(catalogue.measure(chosen, models, settings.requests, settings.warmup, note))
        records.write(record, settings.out)
    if profiled is not None:
        record["profile"] = profile(profiled, models, settings.warmup)


def http(
    settings: Settings,
    chosen: Workload,
    family: str,
    names: Sequence[str],
    manifests: Sequence[dict[str, Any]],
    record: dict[str, Any],
) -> None:
    """Each subject's server in turn (never two at once: they would share the device and the CPUs), with
    ``settings.http_profile`` enabled and asked for (the reference's with exact under shared_context, which it
    cannot run); an engine that missed its gate is not served (``s1omni serve`` refuses it) and is listed as skipped."""
    profile = settings.http_profile
    # The torch reference has no packed forward: under shared_context its server answers exact.
    reference_profile = EXACT if profile == SHARED_CONTEXT else profile
    common = ["--device", settings.device, *(["--registry", settings.registry] if settings.registry else []), *settings.serve_args]
    section: dict[str, Any] = {
        "workload": chosen.name,
        **chosen.facts,
        "profile": profile,
        "reference_profile": reference_profile,
        "requests": settings.requests,
        "warmup": settings.warmup,
        "concurrency": list(settings.concurrency),
        "servers": {},
        "reference_kernels": "torch",  # s1omni serve loads the package's reference with its default kernels
        "skipped": {},
        "runs": [],
        "ratios": {},
    }
    record["http"] = section
    sources = [[str(settings.package)], *(["--engine", str(path)] for path in settings.engines)]
    servable = [True, *(validated(manifest) for manifest in manifests)]
    subjects = list(enumerate(zip(names, sources, servable, strict=True)))
    # The engines first, the reference (the slowest server) last: a run cut short keeps the engines' figures.
    for index, (name, source, serve) in subjects[1:] + subjects[:1]:
        if name == REFERENCE and not settings.http_reference:
            section["skipped"][name] = "--no-http-reference: not served in this run"
            note(f"not serving {name}: --no-http-reference")
            continue
        if not serve:
            section["skipped"][name] = "missed its gate: s1omni serve refuses it"
            note(f"not serving {name}: it missed its gate")
            continue
        log = settings.out / f"serve-{index}.log"
        served = reference_profile if name == REFERENCE else profile
        enabled = ["--profiles", served] if served != EXACT else []
        note(f"starting s1omni serve for {name} (log {log})")
        with http_load.serving(name, [*source, *common, *enabled], log, settings.start_timeout_s) as server:
            card = http_load.card(server)
            offered = [entry.get("name") for entry in card.get("profiles", [])]
            section["servers"][name] = {
                "command": server.command,
                "log": log.name,
                **{key: card.get(key) for key in ("engine", "device", "dtype")},
                "profiles": offered,
            }
            if served not in offered:
                raise BenchFailed(f"the server of {name} does not run the profile {served!r} (its card lists {offered})")
            record["member"] = record["member"] or member_facts(card)
            body = http_load.request_body(chosen.body, served, family)
            section["runs"] += http_load.measure(server, body, served, settings.concurrency, settings.requests, settings.warmup, note,
                                                 settings.instances, settings.settle_rounds)  # fmt: skip
        records.write(record, settings.out)
    section["ratios"] = http_ratios(section["runs"])
    record["failures"] = sum(sum(run["failures"].values()) for run in section["runs"])


def http_ratios(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Per engine and concurrency, engine / reference of p50, p95 and requests/s, from these runs (the
    served reference is the fallback's: ``s1omni serve`` has no FLA reference)."""
    table = {(run["subject"], run["concurrency"]): run for run in runs}
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for (name, level), run in table.items():
        if name != REFERENCE and (REFERENCE, level) in table:
            out.setdefault(name, {})[str(level)] = ratios(run, table[REFERENCE, level], ("p50_ms", "p95_ms", "requests_per_s"))
    return out


def bench(settings: Settings) -> dict[str, Any]:
    """Run, then write ``bench.json`` and ``bench.png`` under ``settings.out``; raises BenchFailed, after
    writing them, if any HTTP request failed."""
    manifests = [read_manifest(path) for path in settings.engines]
    check(settings, manifests)
    family = detect_family(settings.package)
    # Every workload name is resolved now, so a typo fails before minutes of loading.
    workloads = catalogue.resolve(settings.workloads, settings.tokens, family)
    profiled = catalogue.named(settings.profile, family) if settings.profile else None
    served = catalogue.named(settings.http_workload, family) if settings.http else None
    if served is not None and (served.body is None or served.copies > 1):
        raise UsageError("--http-workload must be one request (router, long-span or a case name; the clients merge)")
    if family != "vela2" and settings.http_profile != EXACT:
        raise UsageError(f"--http-profile {settings.http_profile}: {family} requests run exact only")
    names = subject_names(manifests)
    fla = references.fla_status(settings.device)
    reference_names = references.reference_names(fla) if workloads or profiled else [REFERENCE]  # only in process
    if fla["reason"]:
        note(f"no {references.FLA_REFERENCE} in this run: {fla['reason']}")
    settings.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "format": records.FORMAT,
        "command": list(settings.command),
        "started": now(),
        "finished": None,
        "settings": {key: value for key, value in asdict(settings).items() if key != "command"},
        "machine": records.machine(),
        "member": None,
        "references": {"subjects": reference_names, "fla": fla, "ratios_against": "the faster reference of each workload, by p50"},
        "subjects": {
            **{name: {"package": str(settings.package)} for name in reference_names},
            **{
                name: engine_facts(path, manifest)
                for name, path, manifest in zip(names[1:], settings.engines, manifests, strict=True)
            },
        },
        "workloads": [],
        "profile": None,
        "http": None,
        "failures": 0,
    }
    if workloads or profiled:
        in_process(settings, names, manifests, workloads, profiled, record)
        release_gpu_memory()  # the models died with in_process's frame; the servers load their own
    if served is not None:
        http(settings, served, family, names, manifests, record)
    record["finished"] = now()
    record["plot"] = "bench.png"
    records.plot(record, settings.out / record["plot"])
    path = records.write(record, settings.out)
    note(f"wrote {path} and {settings.out / record['plot']}")
    if record["failures"]:
        raise BenchFailed(f"{record['failures']} HTTP requests failed (see {path})")
    return record

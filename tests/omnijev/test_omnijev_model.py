"""OmniJev end to end on the tiny synthetic member: synthesis, plan, execute, finish, parity checks."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from s1omni.runtime.omnijev.contract import ContractError
from s1omni.runtime.omnijev.model import OmniJevModel
from s1omni.runtime.synth import omnijev as synth


def probabilities(answer: dict[str, Any]) -> dict[str, float]:
    """Every probability-like value of an answer, by name."""
    values = {name: answer[name] for name in ("noul", "abstain", "confidence") if name in answer}
    values.update({f"p:{key}": p for key, p in answer.get("probabilities", {}).items()})
    return values


def decision(answer: dict[str, Any]) -> Any:
    return answer.get("choice", answer.get("score", answer.get("noul", 0) >= 0.5))


def without_latency(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if not k.startswith("latency")}


@pytest.fixture(scope="module")
def request_body(omnijev_model: OmniJevModel) -> dict[str, Any]:
    """The warm-up plus a Choice from an option list with an abstain entry and a plain Noul."""
    body = omnijev_model.golden_request()
    body["questions"]["pick"] = {
        "type": "choice",
        "instructions": "Which region shows the error?",
        "options": [
            {"key": "top", "region": {"box": [0, 0, 1000, 120.4]}},
            {"text": "the dialog"},
            {"abstain": True},
            {},
        ],
    }
    body["questions"]["plain"] = {"type": "noul", "instructions": "The image is mostly blue."}
    return body


# ----------------------------------------------------------------------------- synthesis


def test_the_same_seed_writes_byte_identical_files(omnijev_member, tmp_path: Path) -> None:
    root, member = omnijev_member
    again = synth.write(tmp_path / "again", "tiny", 0)
    assert again == member
    for name in member.files:
        assert (tmp_path / "again" / name).read_bytes() == (root / name).read_bytes(), name
    other = synth.write(tmp_path / "other", "tiny", 1)
    assert other.name == "omnijev-synth-tiny-s1"
    assert other.files["vision.safetensors"] != member.files["vision.safetensors"]
    assert other.files["tokenizer.json"] == member.files["tokenizer.json"]


def test_the_registry_entry_describes_the_synthetic_member(omnijev_member) -> None:
    root, member = omnijev_member
    manifest = json.loads((root / "omnijev_export.json").read_text())
    assert member.family == "omnijev" and member.synthetic and member.name != "OmniJev-4B-v1.1"
    assert member.extra["manifest"] == {k: manifest[k] for k in synth.PINNED_FIELDS}
    assert set(manifest) >= {"format", "model_id", "checkpoint_revision", "base_revision", "vocabulary", "option_tokens",
                             "max_pixels", "heads", "calibration", "outputs"}  # fmt: skip
    assert manifest["outputs"] == {k: v for k, v in member.files.items() if k != "omnijev_export.json"}


def test_the_4b_size_has_the_released_layout() -> None:
    size = synth.SIZES["4B"]
    config = synth.config(size)
    text, vision = config["text_config"], config["vision_config"]
    assert (text["vocab_size"], text["hidden_size"], text["intermediate_size"], text["num_hidden_layers"]) == (
        248079,
        2560,
        9216,
        32,
    )
    assert [i for i, kind in enumerate(text["layer_types"]) if kind == "full_attention"] == list(range(3, 32, 4))
    assert (text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]) == (16, 4, 256)
    assert (text["linear_num_key_heads"], text["linear_num_value_heads"], text["linear_key_head_dim"]) == (16, 32, 128)
    assert text["rope_parameters"]["mrope_section"] == [11, 11, 10] and text["tie_word_embeddings"]
    assert (vision["depth"], vision["hidden_size"], vision["intermediate_size"], vision["num_heads"]) == (
        24,
        1024,
        4096,
        16,
    )
    assert (vision["out_hidden_size"], vision["patch_size"], vision["spatial_merge_size"]) == (2560, 16, 2)
    assert (config["image_token_id"], config["vision_start_token_id"], config["vision_end_token_id"]) == (
        248056,
        248053,
        248054,
    )
    shapes = {name: shape for group in synth.tensor_shapes("4B").values() for name, shape in group}
    assert shapes["model.language_model.embed_tokens.weight"] == (248079, 2560)
    assert shapes["model.language_model.layers.3.self_attn.q_proj.weight"] == (
        2 * 16 * 256,
        2560,
    )  # with the output gate
    assert shapes["model.visual.patch_embed.proj.weight"] == (1024, 3, 2, 16, 16)
    assert shapes["model.visual.merger.linear_fc2.weight"] == (2560, 4 * 1024)  # after the 2x2 merge
    assert shapes["head.opt.0.weight"] == (1024, 2560) and shapes["ord.cut.0.weight"] == (512, 2560)
    assert not any(name.startswith(("lm_head", "mtp")) for name in shapes)  # tied embedding, no MTP layer
    tokenizer = Tokenizer.from_str(synth.tokenizer_json(size))
    assert tokenizer.get_vocab_size(with_added_tokens=True) == 248079
    expected = {"<|im_start|>": 248045, "<|im_end|>": 248046, "<|vision_start|>": 248053, "<|image_pad|>": 248056,
                "<think>": 248068, "<|opt|>": 248077, "<|/opt|>": 248078}  # fmt: skip
    assert {token: tokenizer.token_to_id(token) for token in expected} == expected


def test_s1omni_synth_and_verify(tmp_path: Path) -> None:
    registry = tmp_path / "registry.json"
    run = [sys.executable, "-m", "s1omni"]
    made = subprocess.run([*run, "synth", "omnijev", "--size", "tiny", "--out", str(tmp_path / "m"), "--seed", "3",
                           "--registry", str(registry)], capture_output=True, text=True, env=os.environ)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "omnijev-synth-tiny-s3" in made.stdout
    checked = subprocess.run(
        [*run, "verify", str(tmp_path / "m"), "--registry", str(registry)],
        capture_output=True,
        text=True,
        env=os.environ,
    )
    assert checked.returncode == 0, checked.stderr
    assert "ok omnijev-synth-tiny-s3@" in checked.stdout


# ----------------------------------------------------------------------------- answers


def test_load_model_gives_the_omnijev_model(omnijev_model: OmniJevModel) -> None:
    assert isinstance(omnijev_model, OmniJevModel)
    card = omnijev_model.card()
    assert card["id"] == omnijev_model.id == "synthetic/omnijev-synth-tiny-s0"
    assert (card["family"], card["engine"], card["device"], card["precision"]) == ("omnijev", "torch", "cpu", "fp32")
    assert card["question_types"] == ["noul", "choice", "score"]
    assert card["limits"]["max_pixels"] == 602112


def test_the_golden_request_is_the_workers_warm_up(omnijev_model: OmniJevModel) -> None:
    body = omnijev_model.golden_request()
    response = omnijev_model.answer(copy.deepcopy(body))
    assert response["model"] == omnijev_model.id
    answers = response["answers"]
    assert list(answers) == ["noul", "choice", "score"]
    assert list(answers["noul"]) == ["noul", "latency_s", "latency_total_s"]
    assert list(answers["choice"]) == [
        "choice",
        "probabilities",
        "abstain",
        "valid",
        "confidence",
        "latency_s",
        "latency_total_s",
    ]
    assert list(answers["score"]) == ["score", "probabilities", "confidence", "latency_s", "latency_total_s"]
    assert list(answers["choice"]["probabilities"]) == ["red", "green", "blue"]
    assert list(answers["score"]["probabilities"]) == ["dark", "medium", "bright"]
    for answer in answers.values():
        assert all(0.0 <= p <= 1.0 for p in probabilities(answer).values())
        assert answer["latency_total_s"] >= answer["latency_s"] > 0
    assert response["usage"]["output_tokens"] == 0
    plan = omnijev_model.plan(body)
    assert plan.pixels.grid == (1, 14, 20) and plan.pixels.tokens == 70  # 96 x 64 -> 224 x 320 px


def test_usage_counts_the_prefix_once_and_every_row(
    omnijev_model: OmniJevModel, omnijev_package: Path, request_body
) -> None:
    plan = omnijev_model.plan(request_body)
    tokenizer = Tokenizer.from_file(str(omnijev_package / "tokenizer.json"))
    sequences = []
    for question in plan.questions:
        sequences.append(
            tokenizer.encode(
                "<|im_start|>user\n<|vision_start|>"
                + "<|image_pad|>" * 70
                + f"<|vision_end|>{question.instructions}<|im_end|>\n"
                "<|im_start|>assistant\n<think>\n" + "".join(f"<|opt|>{o}<|/opt|>" for o in question.options),
                add_special_tokens=False,
            ).ids
        )
    opt, close = omnijev_model.token_ids.option_open, omnijev_model.token_ids.option_close
    common = 0
    while all(s[common] == sequences[0][common] for s in sequences):
        common += 1
    prefix = min([common] + [s.index(opt) - 1 for s in sequences])
    expected = prefix
    for s in sequences:
        head = s.index(opt) - prefix
        opens = [i for i, t in enumerate(s) if t == opt]
        closes = [i for i, t in enumerate(s) if t == close]
        expected += sum(head + c - o + 1 for o, c in zip(opens, closes, strict=True))
    response = omnijev_model.answer(copy.deepcopy(request_body))
    assert response["usage"]["input_tokens"] == plan.input_tokens == expected
    assert list(response["answers"]["pick"]["probabilities"]) == ["top", "the dialog", "option_3"]


def test_answers_do_not_depend_on_question_order(omnijev_model: OmniJevModel, request_body) -> None:
    forward = omnijev_model.answer(copy.deepcopy(request_body))
    reordered = copy.deepcopy(request_body)
    reordered["questions"] = dict(reversed(list(request_body["questions"].items())))
    backward = omnijev_model.answer(reordered)
    assert list(backward["answers"]) == list(reordered["questions"])  # the request's key order
    assert backward["usage"] == forward["usage"]
    for qid, answer in forward["answers"].items():
        assert without_latency(backward["answers"][qid]) == without_latency(answer)


def test_a_question_alone_gets_the_answer_it_gets_among_others(omnijev_model: OmniJevModel, request_body) -> None:
    together = omnijev_model.answer(copy.deepcopy(request_body))["answers"]
    for qid, question in request_body["questions"].items():
        alone = copy.deepcopy(request_body)
        alone["questions"] = {qid: question}
        answer = omnijev_model.answer(alone)["answers"][qid]
        assert decision(answer) == decision(together[qid])
        for name, p in probabilities(answer).items():
            assert p == pytest.approx(probabilities(together[qid])[name], abs=2e-4), (qid, name)


def test_prefix_reuse_equals_one_plain_forward_per_row(omnijev_model: OmniJevModel, request_body) -> None:
    plan = omnijev_model.plan(request_body)
    reused, plain = omnijev_model.execute([plan])[0], omnijev_model.execute([plan], prefix_reuse=False)[0]
    for ours, theirs in zip(reused.mu, plain.mu, strict=True):
        assert np.abs(ours - theirs).max() <= 1e-5
    a, b = omnijev_model.finish(plan, reused)["answers"], omnijev_model.finish(plan, plain)["answers"]
    for qid in a:
        assert decision(a[qid]) == decision(b[qid])
        diffs = [abs(p - probabilities(b[qid])[name]) for name, p in probabilities(a[qid]).items()]
        assert max(diffs) <= 1e-4 + 1e-9  # the answers are rounded to 4 decimals


def test_readouts_equal_transformers_multimodal_forward(
    omnijev_model: OmniJevModel, omnijev_package: Path, request_body
) -> None:
    """The vision tower, image-embedding injection and positions, against transformers' Qwen3_5Model."""
    from safetensors.torch import load_file
    from transformers import Qwen3_5Config
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model

    config = json.loads((omnijev_package / "config.json").read_text())
    hf_config = Qwen3_5Config(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    for sub in (hf_config, hf_config.text_config, hf_config.vision_config):
        sub._attn_implementation = "eager"
    model = Qwen3_5Model(hf_config).float().eval()
    state = {}
    for name in ("model-00001-of-00001.safetensors", "vision.safetensors"):
        state.update(
            {key.removeprefix("model."): value.float() for key, value in load_file(str(omnijev_package / name)).items()}
        )
    model.load_state_dict(state, strict=True)
    plan = omnijev_model.plan(request_body)
    readouts = omnijev_model._reused(plan, omnijev_model.vision(plan.pixels))
    lay = plan.layout
    for rows, question_readouts in zip(lay.rows, readouts, strict=True):
        for row, read in zip(rows, question_readouts, strict=True):
            ids = torch.as_tensor(np.concatenate([lay.prefix, row.tokens]))[None]
            with torch.no_grad():
                hidden = (
                    model(
                        input_ids=ids,
                        pixel_values=torch.from_numpy(plan.pixels.values),
                        image_grid_thw=torch.tensor([plan.pixels.grid]),
                        mm_token_type_ids=(ids == omnijev_model.token_ids.image).int(),
                    )
                    .last_hidden_state[0]
                    .numpy()
                )
            at = len(lay.prefix)
            np.testing.assert_allclose(read.zq, hidden[at + row.zq], rtol=0, atol=1e-4)
            np.testing.assert_allclose(read.u, hidden[at + row.u], rtol=0, atol=1e-4)


def test_answers_are_repeatable(omnijev_model: OmniJevModel, request_body) -> None:
    first = omnijev_model.answer(copy.deepcopy(request_body))
    second = omnijev_model.answer(copy.deepcopy(request_body))
    assert {q: without_latency(a) for q, a in first["answers"].items()} == {
        q: without_latency(a) for q, a in second["answers"].items()
    }


def test_latency_is_shared_over_the_questions(omnijev_model: OmniJevModel, request_body) -> None:
    plan = omnijev_model.plan(request_body)
    result = omnijev_model.execute([plan])[0]
    answers = omnijev_model.finish(plan, result)["answers"]
    total = plan.preparation_seconds + result.seconds
    for answer in answers.values():
        assert answer["latency_total_s"] == round(total, 4)
        assert answer["latency_s"] == round(total / len(answers), 4)


# ----------------------------------------------------------------------------- refusals


def test_plan_refuses_another_model(omnijev_model: OmniJevModel) -> None:
    body = omnijev_model.golden_request()
    body["model"] = "tinnel123/OmniJev"  # the released id is not the synthetic member
    with pytest.raises(ContractError) as error:
        omnijev_model.plan(body)
    assert (error.value.status, error.value.detail) == (422, "requested model is not loaded")
    body["model"] = "omnijev-synth-tiny-s0"
    assert omnijev_model.plan(body).question_count == 3


def test_plan_refuses_an_image_that_does_not_decode(omnijev_model: OmniJevModel) -> None:
    import base64

    from s1omni.runtime.omnijev.model import warmup_png

    body = omnijev_model.golden_request()
    raw = warmup_png()
    body["state"]["images"] = ["data:image/png;base64," + base64.b64encode(raw[: len(raw) - 40]).decode()]
    with pytest.raises(ContractError) as error:
        omnijev_model.plan(body)
    assert error.value.status == 422 and error.value.detail.startswith("invalid image")


def test_an_expired_plan_is_refused_as_busy(omnijev_model: OmniJevModel) -> None:
    plan = omnijev_model.plan(omnijev_model.golden_request())
    with pytest.raises(ContractError) as error:
        omnijev_model.expired(plan)
    assert (error.value.status, error.value.body(), error.value.headers()) == (
        503,
        {"detail": "the worker is busy"},
        {"Retry-After": "1"},
    )


# ----------------------------------------------------------------------------- precision


def test_the_cpu_reference_refuses_another_precision(omnijev_package: Path) -> None:
    """The precision a validation asks for is applied, not dropped: the CPU reference has only float32."""
    from s1omni.runtime.api import load_model

    assert load_model(omnijev_package, precision="fp32").runner.precision == "fp32"
    with pytest.raises(ValueError, match="the CPU reference runs in float32"):
        load_model(omnijev_package, precision="bf16")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the device)")
def test_the_gpu_reference_runs_backbone_and_vision_tower_at_the_precision_asked(
    omnijev_package: Path, omnijev_model: OmniJevModel, request_body
) -> None:
    """``s1omni validate`` on CUDA makes a float32 (TF32 off) and a BF16 reference record of an OmniJev member:
    both the backbone and the vision tower run on the GPU at that precision. float32 matches the CPU's features
    to float32 rounding; BF16 autocast moves them, as the reference worker's BF16 does (omnijev.md §12: about
    14% relative L2 on a real member), and still answers every question."""
    from s1omni.runtime.api import load_model

    plan = omnijev_model.plan(copy.deepcopy(request_body))
    cpu = omnijev_model.vision(plan.pixels)
    for precision in ("fp32", "bf16"):
        model = load_model(omnijev_package, device="cuda", precision=precision)
        assert (model.device, model.runner.precision, model.vision.precision) == ("cuda", precision, precision)
        features = model.vision(model.plan(copy.deepcopy(request_body)).pixels)
        moved = float(np.linalg.norm(features - cpu) / np.linalg.norm(cpu))
        if precision == "fp32":
            assert moved <= 1e-4, moved
        else:
            assert 1e-4 < moved <= 0.3, moved
        answers = model.answer(copy.deepcopy(request_body))["answers"]
        assert all("error" not in answer for answer in answers.values()), answers

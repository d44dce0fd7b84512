"""Validators for a schema of an OpenAPI document: this server's (3.1, JSON Schema 2020-12) and the
reference runtime's published one (3.0, read with its ``nullable``; tests/fixtures/semantic-router/)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.protocols import Validator
from openapi_schema_validator import OAS30Validator

REFERENCE = Path(__file__).parent / "fixtures" / "semantic-router" / "openapi.yaml"


def component(document: dict[str, Any], name: str, kind: type[Validator] = Draft202012Validator) -> Validator:
    """A validator of ``document``'s schema ``name``, its references resolved within the document."""
    return kind({"$ref": f"#/components/schemas/{name}", "components": document["components"]})


@cache
def reference() -> dict[str, Any]:
    return yaml.safe_load(REFERENCE.read_text(encoding="utf-8"))


def reference_component(name: str) -> Validator:
    return component(reference(), name, OAS30Validator)


def reference_response(path: str, method: str, status: int) -> str | None:
    """The schema name the reference gives ``status`` on ``method path``, or None where it has none."""
    responses = reference()["paths"].get(path, {}).get(method, {}).get("responses", {})
    response = responses.get(str(status))
    if response is None:
        return None
    if "$ref" in response:  # a shared response: components/responses/NAME
        response = reference()["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    content = response.get("content", {}).get("application/json")
    return None if content is None else content["schema"]["$ref"].rsplit("/", 1)[1]

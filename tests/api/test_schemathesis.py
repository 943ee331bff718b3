"""Property-based run of /openapi.json against a real server: no 5xx, no response outside the schema.

The tiny model has no tokenizer, so text endpoints end in their 400; request validation,
error shapes and every GET route are what this run exercises. (schemathesis' pytest plugin
does not load under pytest 9, so the operations are driven through hypothesis directly.)
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import positive_data_acceptance

from wicore.api.openapi import openapi_schema


def schema_at(url: str) -> schemathesis.BaseSchema:
    schema = schemathesis.openapi.from_dict(openapi_schema())
    schema.config.update(base_url=url)
    return schema


@pytest.fixture(scope="module")
def api_schema(tiny_server):
    return schema_at(tiny_server(max_body_bytes=65536).url)


@pytest.fixture(scope="module")
def gemma_schema(small_gemma_server):
    return schema_at(small_gemma_server.url)


# Over ~2 s each on the 2-core VM (the chat body's schema is the largest to draw from): the slow layer.
SLOW_OPERATIONS = {
    ("POST /v1/chat/completions", schemathesis.GenerationMode.POSITIVE),
    ("POST /v1/chat/completions", schemathesis.GenerationMode.NEGATIVE),
    ("POST /tokenize", schemathesis.GenerationMode.NEGATIVE),
    ("POST /v1/responses", schemathesis.GenerationMode.POSITIVE),
}


def operations() -> list[object]:
    """Every operation with schema-valid data; those with a body with schema-invalid data too."""
    schema = schemathesis.openapi.from_dict(openapi_schema())
    labels = [result.ok().label for result in schema.get_all_operations()]
    modes = [(label, schemathesis.GenerationMode.POSITIVE) for label in labels]
    modes += [(label, schemathesis.GenerationMode.NEGATIVE) for label in labels if label.startswith("POST")]
    return [pytest.param(*mode, marks=[pytest.mark.slow] if mode in SLOW_OPERATIONS else []) for mode in modes]


@pytest.mark.parametrize("label, mode", operations())
def test_operation_conforms_to_the_schema(api_schema, label, mode):
    check(api_schema, label, mode, max_examples=30)


@pytest.mark.slow
@pytest.mark.parametrize("label", ["POST /v1/chat/completions", "POST /v1/completions", "POST /v1/inference"])
def test_real_model_generation_conforms_to_the_schema(gemma_schema, label):
    check(gemma_schema, label, schemathesis.GenerationMode.POSITIVE, max_examples=8)


def check(api_schema: schemathesis.BaseSchema, label: str, mode: schemathesis.GenerationMode, max_examples: int) -> None:
    operation = next(r.ok() for r in api_schema.get_all_operations() if r.ok().label == label)

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=max_examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case) -> None:
        # Schema-valid text requests can still get a 400 (no tokenizer in the tiny model; a
        # prompt past the context), so only "no 5xx, responses match the schema" is checked.
        case.call_and_validate(excluded_checks=[positive_data_acceptance], timeout=300)

    run()

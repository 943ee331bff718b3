"""One definition of each sampling limit (wicore.types.limits): SamplingParams, the API's request
parser and the OpenAPI document all read it, so they agree at every edge."""

from __future__ import annotations

import pytest

from wicore.api.errors import APIError
from wicore.api.openapi import openapi_schema
from wicore.api.schemas import parse_completion
from wicore.errors import RequestError
from wicore.types.limits import RANGES, Range
from wicore.types.sampling import SamplingParams


def test_a_range_says_what_it_holds_and_its_json_schema():
    r = Range(0.0, 1.0, low_open=True)
    assert (0.0 in r, 1e-9 in r, 1.0 in r, 1.5 in r, float("nan") in r) == (False, True, True, False, False)
    assert str(r) == "(0, 1]" and str(Range(-2.0, 2.0)) == "[-2, 2]"
    assert r.json_schema() == {"minimum": 0.0, "maximum": 1.0, "exclusiveMinimum": True}


@pytest.mark.parametrize("name", sorted(RANGES))
def test_sampling_params_the_parser_and_the_openapi_document_share_each_range(name):
    allowed = RANGES[name]
    inside, outside = allowed.high, allowed.high + 1
    assert getattr(SamplingParams(**{name: inside}), name) == inside
    with pytest.raises(RequestError) as err:
        SamplingParams(**{name: outside})
    assert str(err.value) == f"{name} must be in {allowed}, got {outside}"
    assert getattr(parse_completion({"prompt": "a", name: inside}).options, name) == inside
    with pytest.raises(APIError, match="out of range"):
        parse_completion({"prompt": "a", name: outside})
    body = openapi_schema()["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    schema = body["properties"][name]
    assert (schema["minimum"], schema["maximum"]) == (allowed.low, allowed.high)
    assert schema.get("exclusiveMinimum", False) == allowed.low_open

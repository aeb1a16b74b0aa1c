"""SamplingParams' float fields, checked where the params are made: each range as vLLM and OpenAI give it, NaN and
the infinities refused."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from inferplug.errors import RequestError
from inferplug.types import SamplingParams

REFUSED = [("temperature", -0.1), ("temperature", 2.5), ("top_p", 0.0), ("top_p", 1.01), ("min_p", -0.1),
           ("min_p", 1.5), ("repetition_penalty", 0.0), ("repetition_penalty", math.inf),
           ("presence_penalty", -2.5), ("frequency_penalty", 2.5)]
ACCEPTED = [("temperature", 0), ("temperature", 2.0), ("top_p", 1), ("min_p", 0.0), ("min_p", 1.0),
            ("repetition_penalty", 0.01), ("repetition_penalty", 100.0), ("presence_penalty", -2),
            ("frequency_penalty", 2.0)]
FIELDS = sorted({name for name, _ in REFUSED})


@pytest.mark.parametrize("name,value", REFUSED + [(n, v) for n in FIELDS for v in (math.nan, -math.inf, "0.5")])
def test_a_value_out_of_range_or_not_a_finite_number_is_refused_naming_its_field(name, value):
    with pytest.raises(RequestError, match=f"^{name}=.* is invalid: use a value") as info:
        SamplingParams(**{name: value})
    assert info.value.param == name


@pytest.mark.parametrize("name,value", ACCEPTED)
def test_a_value_in_range_passes(name, value):
    SamplingParams(**{name: value})


def test_params_made_again_by_replace_are_checked_again():
    with pytest.raises(RequestError, match="^temperature=5 is invalid") as info:
        replace(SamplingParams(), temperature=5)
    assert info.value.param == "temperature"

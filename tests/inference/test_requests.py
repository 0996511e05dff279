"""A request or its sampling settings that cannot run stops with one ValueError naming the
field (roll/inference/base.py), before any engine sees it."""

from __future__ import annotations

import enum

import numpy as np
import pytest

from roll.inference import GenerationRequest, SamplingParams


class Token(enum.IntEnum):
    PAD = 3


@pytest.mark.parametrize("ids", [[], [1, -2, 3], [1, True, 3], [1, 2.0], [1, np.int64(2)],
                                 "abc", None])
def test_prompt_ids_that_are_not_ints_from_zero_are_refused(ids):
    with pytest.raises(ValueError, match="GenerationRequest.prompt_ids"):
        GenerationRequest(ids, None)


@pytest.mark.parametrize("ids", [[0], [5, 0, 7], (1, 2), [Token.PAD, 4]])
def test_plain_and_subclassed_int_ids_pass(ids):
    assert list(GenerationRequest(ids, "a").prompt_ids) == list(ids)


@pytest.mark.parametrize("allowed", [[[1, -1]], [[1], [False]], [[]], []])
def test_allowed_completions_are_checked_like_prompts(allowed):
    with pytest.raises(ValueError, match="GenerationRequest.allowed_completions"):
        GenerationRequest([1, 2], None, allowed_completions=allowed)


@pytest.mark.parametrize(("settings", "field"), [
    ({"temperature": -0.5}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"temperature": True}, "temperature"), ({"top_p": 0.0}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"stop": "END"}, "stop"), ({"seed": -3}, "seed"), ({"ignore_eos": 1}, "ignore_eos")])
def test_sampling_settings_that_cannot_run_are_refused(settings, field):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}="):
        SamplingParams(**settings)

"""rLLM's ``RLLM_ADV_ESTIMATOR_REGISTRY`` used as rLLM's code uses it: a dict from name to the
function rLLM calls (``REGISTRY[name](rewards, config)``), assignment registers, ``in`` and
``len`` and iteration see every registered name."""

from __future__ import annotations

import numpy as np
import pytest

from rllm_torch.rllm import RLLM_ADV_ESTIMATOR_REGISTRY, AlgorithmConfig, registered_estimator_names
from rllm_torch.rllm.arrays import calculate_grpo_advantages
from rllm_torch.rllm.config import rLLMAdvantageEstimator
from rllm_torch.rllm.dispatch import get_tensor_adv_estimator


def test_a_builtin_looked_up_by_name_is_rllms_arrays_function_and_gives_its_numbers():
    fn = RLLM_ADV_ESTIMATOR_REGISTRY["grpo"]
    assert fn is calculate_grpo_advantages
    adv, _ = fn([np.array([1.0, 0.0, 1.0])], AlgorithmConfig())
    # rLLM's np.std (population): mean 2/3, std sqrt(2/9) = 0.47140; (1/3) / 0.47140 = 0.70711
    np.testing.assert_allclose(adv[0], [0.70711, -1.41421, 0.70711], rtol=1e-4)
    assert RLLM_ADV_ESTIMATOR_REGISTRY[rLLMAdvantageEstimator.GRPO] is fn  # rLLM's enum as the key


def test_a_token_level_builtin_gives_its_tensor_function():
    assert RLLM_ADV_ESTIMATOR_REGISTRY["gae"].__name__ == get_tensor_adv_estimator("gae").__name__


def test_an_unknown_name_is_a_key_error_as_in_a_dict_and_not_in_it():
    with pytest.raises(KeyError):
        RLLM_ADV_ESTIMATOR_REGISTRY["no_such_estimator"]
    assert "no_such_estimator" not in RLLM_ADV_ESTIMATOR_REGISTRY


def test_assigning_a_name_registers_an_arrays_estimator_that_the_view_then_lists():
    def _halve(rewards, algorithm_config, **kwargs):
        out = [r / 2 for r in rewards]
        return out, out

    RLLM_ADV_ESTIMATOR_REGISTRY["view_halve"] = _halve
    assert RLLM_ADV_ESTIMATOR_REGISTRY["view_halve"] is _halve
    assert "view_halve" in RLLM_ADV_ESTIMATOR_REGISTRY
    assert sorted(RLLM_ADV_ESTIMATOR_REGISTRY) == registered_estimator_names()
    assert len(RLLM_ADV_ESTIMATOR_REGISTRY) == len(registered_estimator_names())


def test_a_name_cannot_be_deleted():
    with pytest.raises(TypeError, match="cannot be removed"):
        del RLLM_ADV_ESTIMATOR_REGISTRY["grpo"]

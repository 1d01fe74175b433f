"""The memory settings of real models, each on the real backend: bf16 compute, activation
checkpointing, LoRA adapters (training, the base as reference, checkpoints, merged export), the
start-up checks and the out-of-memory error."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch
import trainer_rank_tasks as tasks
from omegaconf import OmegaConf
from trainer_fakes import make_config
from transformers import AutoModelForCausalLM, GPTNeoXJapaneseConfig

from rllm_torch.backends.torch_backend import TorchBackend, token_log_probs
from rllm_torch.backends.torch_backend.model import build_policy, enable_gradient_checkpointing
from rllm_torch.cli.train_command import run
from rllm_torch.core.errors import ConfigError, OutOfMemoryError

GROUPS = tasks.fixed_groups(seed=7, num_groups=4, n=4, eos=tasks.eos_id())
LLAMA = ["model.arch=llama"]  # rotary positions, RMSNorm, SwiGLU: the Qwen2 / Llama family


def _step(*dotlist: str) -> tuple[TorchBackend, dict]:
    torch.manual_seed(0)
    backend, state = tasks.update_once(GROUPS, list(dotlist))
    return backend, state.metrics


def _grads(backend: TorchBackend) -> dict[str, torch.Tensor]:
    return {k: p.grad.clone() for k, p in backend.model.named_parameters() if p.grad is not None}


def _all_log_probs(backend: TorchBackend, model=None) -> torch.Tensor:
    batch = backend.transform_to_backend_batch(
        tasks.TrainerState(trajectory_groups=tasks._groups(GROUPS), total_steps=1)
    )
    with torch.no_grad():
        return token_log_probs(model if model is not None else backend.model, batch.input_ids, batch.attention_mask)


def test_the_optimizer_is_fused_adamw_and_a_step_frees_the_gradient():
    """The fused kernel has no full-size temporaries, and no gradient stays resident through the
    next sampling phase and checkpoint (together 2 of Qwen2.5-0.5B's 9.5 GB at its step peak)."""
    backend = TorchBackend(tasks.backend_config("backend.critic.enable=true", "rllm.algorithm.adv_estimator=gae"))
    for optimizer in (backend.actor.optimizer, backend.critic.optimizer):
        assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["fused"] is True
    backend.actor.train_model(torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.int64)).log_probs.sum().backward()
    assert all(p.grad is not None for p in backend.actor.parameters)
    before = [p.detach().clone() for p in backend.actor.parameters]
    backend.actor.step()
    assert all(p.grad is None for p in backend.actor.parameters)
    assert any(not torch.equal(p, b) for p, b in zip(backend.actor.parameters, before, strict=True))


@pytest.mark.parametrize("arch", [[], LLAMA], ids=["gpt2", "llama"])
def test_bf16_trains_in_bf16_with_float32_weights_and_optimizer_state(arch):
    bf16, metrics = _step(*arch, "backend.dtype=bfloat16")
    fp32, want = _step(*arch)
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    assert all(v.dtype == torch.float32 for s in bf16.optimizer.state.values() for v in s.values() if v.dim())
    # the same step to bf16's rounding: 8 mantissa bits, so about 1% of the loss and the gradient
    assert metrics["actor/loss"] == pytest.approx(want["actor/loss"], rel=0.03, abs=2e-3)
    assert metrics["actor/entropy"] == pytest.approx(want["actor/entropy"], rel=0.01)
    assert metrics["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=0.03)
    assert metrics["actor/entropy"] != want["actor/entropy"]  # bf16 did run (on-policy, the loss is -mean A)
    a, b = _grads(bf16), _grads(fp32)
    cosine = sum((a[k] * b[k]).sum() for k in b) / math.sqrt(
        sum(a[k].square().sum() for k in b) * sum(b[k].square().sum() for k in b)
    )
    assert cosine > 0.999


@pytest.mark.parametrize("arch", [[], LLAMA], ids=["gpt2", "llama"])
def test_activation_checkpointing_gives_the_same_gradient(arch):
    checkpointed, metrics = _step(*arch, "backend.gradient_checkpointing=true")
    plain, want = _step(*arch)
    assert checkpointed.model.is_activation_checkpointing and not plain.model.is_activation_checkpointing
    for key, grad in _grads(plain).items():
        torch.testing.assert_close(_grads(checkpointed)[key], grad, rtol=0, atol=1e-6, msg=key)
    assert metrics["actor/loss"] == pytest.approx(want["actor/loss"], abs=1e-7)


def test_activation_checkpointing_on_a_model_without_support_names_the_setting():
    config = GPTNeoXJapaneseConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(
        ConfigError, match=r"backend.gradient_checkpointing=true but GPTNeoXJapaneseForCausalLM does not"
    ):
        enable_gradient_checkpointing(model)


LORA = ["model.lora.r=4", "model.lora.alpha=8", "backend.lr=0.01"]
needs_peft = pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="LoRA needs peft (the lora extra)")


@needs_peft
@pytest.mark.parametrize("arch", [[], LLAMA], ids=["gpt2", "llama"])
def test_lora_trains_the_adapters_only_and_its_reference_is_the_base_model(arch):
    backend, metrics = _step(*arch, *LORA, "rllm.algorithm.use_kl_loss=true")
    initial = build_policy(backend.config.model, backend.tokenizer, seed=backend.settings.seed)
    trainable = {k for k, p in backend.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in k for k in trainable)
    base = dict(backend.model.get_base_model().named_parameters())
    for key, value in initial.named_parameters():  # peft names the frozen linear weights base_layer
        frozen = (
            base.get(key)
            if key in base
            else base[key.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")]
        )
        assert torch.equal(frozen, value), key
    assert backend.ref_model is None  # no second copy of the model
    assert metrics["ref/kl_k1"] == 0.0  # lora_B starts at 0: the first step's policy is the base
    trained = _all_log_probs(backend)
    scorer, context = backend.actor.reference()
    with context:
        reference = _all_log_probs(backend, backend.model)
    torch.testing.assert_close(reference, _all_log_probs(backend, initial), rtol=0, atol=1e-6)
    assert (trained - reference).abs().max() > 1e-4  # the adapters did learn
    assert scorer is backend.actor.scorer


@needs_peft
def test_lora_checkpoints_hold_the_adapters_and_the_export_is_the_merged_model(tmp_path):
    backend, _ = _step(*LLAMA, *LORA)
    state = backend.state_dict()
    assert state["model"] and all("lora_" in k for k in state["model"])
    resumed = TorchBackend(tasks.backend_config(*LLAMA, *LORA), alphabet=tasks.ALPHABET)
    resumed.load_state_dict(state)
    torch.testing.assert_close(_all_log_probs(resumed), _all_log_probs(backend), rtol=0, atol=0)
    backend.run_dir = tmp_path
    path = backend.save_checkpoint("final")
    merged = AutoModelForCausalLM.from_pretrained(path)
    assert not any("lora" in k for k in merged.state_dict())
    torch.testing.assert_close(_all_log_probs(backend, merged), _all_log_probs(backend), rtol=0, atol=1e-5)


@needs_peft
def test_lora_target_modules_that_match_nothing_list_the_models_linear_modules():
    with pytest.raises(ConfigError, match=r"model.lora.target_modules=\['qkv'\] matches no module.*'c_attn'"):
        TorchBackend(tasks.backend_config("model.lora.r=4", "model.lora.target_modules=[qkv]"))
    with pytest.raises(ConfigError, match="lm_head"):
        TorchBackend(tasks.backend_config(*LLAMA, "model.lora.r=4", "model.lora.target_modules=[q_proj,lm_head]"))


@needs_peft
def test_a_lora_run_trains_logs_its_memory_settings_and_exports_a_plain_model(tmp_path, capsys):
    config = make_config(
        tmp_path,
        *LLAMA,
        "model.lora.r=8",
        "model.lora.alpha=16",
        "backend.dtype=bfloat16",
        "backend.gradient_checkpointing=true",
        "backend.micro_batch_tokens=64",
        "task.train_size=16",
        "task.val_size=4",
        "data.train_batch_size=8",
        "rllm.rollout.n=4",
        "rllm.trainer.total_batches=2",
        "rllm.trainer.logger=[console,jsonl]",
    )
    run(config)
    out = capsys.readouterr().out
    assert "precision" in out and "bfloat16 compute" in out and "micro-batches of 64 tokens" in out
    assert "activation checkpointing on" in out and "LoRA r=8 alpha=16 on all-linear" in out
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "actor/loss" in r] == [1, 2]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "final")
    assert not any("lora" in k for k in model.state_dict())


def test_a_micro_batch_budget_below_the_longest_row_is_a_start_up_error(tmp_path):
    # the longest prompt "a+b=" is 4 tokens and max_new_tokens 2: a row may be 6 tokens
    config = make_config(tmp_path, "backend.micro_batch_tokens=5", "task.train_size=8", "task.val_size=0")
    with pytest.raises(ConfigError, match="backend.micro_batch_tokens=5 is smaller than the longest row.*to 6 or more"):
        run(config)


def test_running_out_of_memory_while_sampling_stops_the_run_with_one_message(tmp_path):
    """A real allocation failure: a static KV cache for 10^9 new tokens. It is not retried."""
    config = make_config(
        tmp_path,
        *LLAMA,
        "model.max_positions=2147483647",
        "rllm.rollout.max_new_tokens=1000000000",
        "backend.micro_batch_tokens=null",
        "task.train_size=8",
        "task.val_size=0",
        "rllm.workflow.retry_limit=3",
    )
    with pytest.raises(OutOfMemoryError, match=r"out of memory while sampling .*lower backend.rollout_batch_size"):
        run(config)


def test_the_memory_row_names_each_setting():
    backend = TorchBackend(OmegaConf.merge(tasks.backend_config(), {"backend": {"log_prob_chunk_tokens": 7}}))
    rows = dict(backend.summary_rows())
    assert rows["defaults"] == "backend.lr=0.001, backend.num_threads=1 (defaults for a model built from scratch)"
    assert rows["precision"] == "float32 (backend.dtype=auto: a model built from scratch)"
    assert rows["memory"] == (
        "micro-batches of 16384 tokens, log-probs in "
        "chunks of 7 tokens, sampling 1024 prompts per generate call, activation checkpointing off, prompts not "
        "shared, no LoRA"
    )
    backend.settings.rollout_batch_size = 64
    assert backend.init_rollout_engine().max_batch_size == 64


def _with_and_without_bonus(coef: float):
    """Two backends of the same initial weights, with and without ``backend.entropy_coeff=coef``,
    and a token batch of :data:`GROUPS` with random advantages."""
    with_bonus = TorchBackend(tasks.backend_config(*LLAMA, f"backend.entropy_coeff={coef}"))
    plain = TorchBackend(tasks.backend_config(*LLAMA))
    state = tasks.TrainerState(trajectory_groups=tasks._groups(GROUPS), total_steps=1)
    batch = plain.transform_to_backend_batch(state)
    batch.advantages = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(0))
    return with_bonus, plain, batch


def test_the_entropy_bonus_is_minus_its_coefficient_times_the_token_mean_entropy_and_has_its_gradient():
    coef = 0.1
    with_bonus, plain, batch = _with_and_without_bonus(coef)
    rows = torch.arange(batch.input_ids.shape[0])

    def loss_and_grads(backend):
        backend.model.zero_grad()
        loss, stats = backend.updater.micro_batch_loss(
            batch, rows, backend.updater.global_normaliser(batch.response_mask)
        )
        loss.backward()
        return loss.detach(), stats, {k: p.grad.clone() for k, p in backend.model.named_parameters()}

    loss_b, stats, grads_b = loss_and_grads(with_bonus)
    loss_p, _, grads_p = loss_and_grads(plain)
    mean_entropy = stats["entropy"] / stats["tokens"]
    assert loss_b.item() == pytest.approx(loss_p.item() - coef * mean_entropy.item(), abs=1e-6)
    # the bonus's gradient is that of -coef * token-mean entropy, from the full softmax
    plain.model.zero_grad()
    logits = plain.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    logp = logits.log_softmax(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    mask = batch.response_mask[:, 1:]
    (-coef * (entropy * mask).sum() / mask.sum()).backward()
    for key, param in plain.model.named_parameters():
        torch.testing.assert_close(grads_b[key] - grads_p[key], param.grad, rtol=1e-4, atol=1e-6, msg=key)


def test_a_micro_batchs_entropy_bonus_is_its_share_of_the_global_mini_batchs_token_mean():
    """The first row alone as the micro-batch, the whole mini-batch's token count as its
    normaliser (as under several micro-batches, or ranks): the bonus is -coef times that row's
    entropy sum over the global count, not over the row's own tokens."""
    coef = 0.1
    with_bonus, plain, batch = _with_and_without_bonus(coef)
    row, global_tokens = torch.tensor([0]), plain.updater.global_normaliser(batch.response_mask)
    assert global_tokens.item() > batch.response_mask[0].sum().item() > 0
    with torch.no_grad():
        loss_b, stats = with_bonus.updater.micro_batch_loss(batch, row, global_tokens)
        loss_p, _ = plain.updater.micro_batch_loss(batch, row, global_tokens)
    assert (loss_b - loss_p).item() == pytest.approx(-coef * (stats["entropy"] / global_tokens).item(), abs=1e-6)


@pytest.mark.parametrize(
    ("processes", "threads"),
    [(1, 8), (2, 4), (3, 2), (16, 1)],  # 8 cores shared: 8 // 1, 8 // 2, 8 // 3 = 2, 8 // 16 = 0 -> at least 1
)
def test_a_pretrained_models_default_thread_count_shares_the_cores_among_the_machines_processes(
    monkeypatch, processes, threads
):
    from rllm_torch.trainer import model_defaults

    monkeypatch.setattr(model_defaults.os, "sched_getaffinity", lambda pid: set(range(8)))  # this process: 8 cores
    before = torch.get_num_threads()
    try:
        config = tasks.backend_config("model.path=/a/pretrained/model")
        said = model_defaults.apply_model_defaults(config, processes_per_machine=processes)
        assert config.backend.num_threads == threads == torch.get_num_threads()
        assert f"backend.num_threads={threads}," in said and said.endswith("(defaults for a pretrained model.path)")
        scratch = tasks.backend_config()  # from scratch: 1 thread whatever the machine
        model_defaults.apply_model_defaults(scratch, processes_per_machine=processes)
        assert scratch.backend.num_threads == 1
    finally:
        torch.set_num_threads(before)

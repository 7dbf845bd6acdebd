"""attn_implementation="attncc" in transformers gives the logits of its own attention.

Tiny randomly initialised models of each family, built from configs (nothing is downloaded),
run once with attncc and once with transformers' "sdpa" (Gemma 2: "eager", as sdpa has no
soft-capping; gpt-oss: "eager", as transformers gives it no sdpa) on the same weights:
prefill with and without padding, and greedy decoding through the model's KV cache. The
weights are drawn wider than transformers' default (initializer_range 0.02) so attention is
peaked and a wrong mask moves the logits far past the tolerance
(test_tolerance_sees_a_wrong_mask pins that).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch
import torch._dynamo.testing
import transformers
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    GptOssConfig,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
)

from attncc.integrations import transformers as attncc_hf
from attncc.spec import load

SIZES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    max_position_embeddings=128,
    initializer_range=0.3,
    pad_token_id=0,
)
# fp32 logits of order 1-10 from models this small: the kernels' error is ~1e-6
TOL = dict(rtol=1e-4, atol=1e-4)

# the specs each family's layers run, unpadded (a padded batch runs the *_padded ones)
SPECS_RUN = {
    "llama": {"hf_causal"},
    "qwen2": {"hf_causal"},
    "mistral": {"hf_causal_window"},
    "gemma2": {"hf_causal_window_softcap", "hf_causal_softcap"},
    "gemma3": {"hf_causal_window", "hf_causal"},
    # transformers' Gemma 3 layers keep attn_logit_softcapping but never pass it to the
    # attention function (eager leaves it out too): the uncapped specs, as transformers runs
    "gemma3_softcap": {"hf_causal_window", "hf_causal"},
    "gpt_oss": {"hf_causal_window_sinks", "hf_causal_sinks"},
}

GEMMA3 = {
    "sliding_window": 4,
    "layer_types": ["sliding_attention", "full_attention"],
    "query_pre_attn_scalar": 16,
}
FAMILIES = {
    "llama": (LlamaConfig, {}, "sdpa"),
    "qwen2": (Qwen2Config, {}, "sdpa"),
    "mistral": (MistralConfig, {"sliding_window": 4}, "sdpa"),
    # layers alternate sliding (window 4) and full; scores soft-capped at 2
    "gemma2": (
        Gemma2Config,
        {
            "sliding_window": 4,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 30.0,
            "query_pre_attn_scalar": 16,
        },
        "eager",
    ),
    # a sliding layer (window 4) and a full one, as in Gemma 3's 5:1 pattern
    "gemma3": (Gemma3TextConfig, GEMMA3, "sdpa"),
    # a Gemma 3 config that sets soft-capping (see SPECS_RUN: transformers does not apply it)
    "gemma3_softcap": (
        Gemma3TextConfig,
        {**GEMMA3, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 30.0},
        "eager",
    ),
    # layers alternate sliding (window 4) and full, each with a learned sink logit per head
    "gpt_oss": (
        GptOssConfig,
        {"sliding_window": 4, "num_local_experts": 2, "num_experts_per_tok": 1},
        "eager",
    ),
}


@pytest.fixture(scope="module", autouse=True)
def registered() -> None:
    attncc_hf.register()


@pytest.fixture
def specs_run(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The names of the specs the attention calls ran."""
    names: set[str] = set()
    compiled = attncc_hf.kernel

    def spy(name: str) -> attncc_hf.Kernel:
        names.add(name)
        return compiled(name)

    monkeypatch.setattr(attncc_hf, "kernel", spy)
    return names


def pair(family: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(attncc model, reference model) of one family, with the same weights."""
    config_class, extra, reference = FAMILIES[family]
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(
        config_class(**SIZES, **extra), attn_implementation=reference
    ).eval()
    widen_sinks(ref)
    # from_config sets the implementation on the config it is given: one config each
    ours = AutoModelForCausalLM.from_config(
        config_class(**SIZES, **extra), attn_implementation="attncc"
    ).eval()
    ours.load_state_dict(ref.state_dict())
    assert ours.config._attn_implementation == "attncc"
    assert ref.config._attn_implementation == reference
    return ours, ref


def widen_sinks(model: torch.nn.Module) -> None:
    """Sink logits of the scores' size (std 2, where initializer_range gives ~0.3), so a
    row gives a real share of its attention to the sink and a kernel without it is far off
    (test_tolerance_sees_a_missing_sink pins that)."""
    generator = torch.Generator().manual_seed(3)
    for layer in getattr(getattr(model, "model", None), "layers", ()):
        sinks = getattr(layer.self_attn, "sinks", None)
        if sinks is not None:
            with torch.no_grad():
                sinks.copy_(2 * torch.randn(sinks.shape, generator=generator))


def batch(padded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Two sequences of 9 tokens; padded: the second has 3 pad tokens on the left."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, SIZES["vocab_size"], (2, 9), generator=generator)
    mask = torch.ones_like(ids)
    if padded:
        ids[1, :3] = 0
        mask[1, :3] = 0
    return ids, mask


def real(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The logits at real tokens (pad positions see no key; their values are anyone's)."""
    return logits[mask.bool()]


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_prefill_logits(family: str, padded: bool, specs_run: set[str]) -> None:
    ours, ref = pair(family)
    ids, mask = batch(padded)
    with torch.no_grad():
        got = ours(ids, attention_mask=mask).logits
        want = ref(ids, attention_mask=mask).logits
    torch.testing.assert_close(real(got, mask), real(want, mask), **TOL)
    assert specs_run == {name + ("_padded" if padded else "") for name in SPECS_RUN[family]}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_decode(family: str, specs_run: set[str]) -> None:
    """3 greedy steps through the model's cache, left-padded batch: the window (4) is
    passed while decoding, so the cache is read bottom-right aligned with an offset."""
    ours, ref = pair(family)
    ids, mask = batch(padded=True)
    args = dict(
        attention_mask=mask,
        max_new_tokens=3,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    got = ours.generate(ids, **args)
    want = ref.generate(ids, **args)
    assert torch.equal(got.sequences, want.sequences)
    for step_got, step_want in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(step_got, step_want, **TOL)
    # a sliding cache drops the pad tokens once they leave the window: unpadded specs then
    assert {name.removesuffix("_padded") for name in specs_run} == SPECS_RUN[family]
    assert any(name.endswith("_padded") for name in specs_run)


def test_tolerance_sees_a_wrong_mask() -> None:
    """The comparison can fail: Mistral's logits with and without its window differ by far
    more than the tolerance, and so do those with and without the padding mask."""
    _, ref = pair("mistral")
    ids, mask = batch(padded=True)
    config = MistralConfig(**{**SIZES, "sliding_window": None})
    unwindowed = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    unwindowed.load_state_dict(ref.state_dict())
    with torch.no_grad():
        windowed = ref(ids, attention_mask=mask).logits
        full = unwindowed(ids, attention_mask=mask).logits
        unpadded = ref(ids).logits
    assert (windowed - full).abs().max() > 1000 * TOL["atol"]
    assert (real(windowed, mask) - real(unpadded, mask)).abs().max() > 1000 * TOL["atol"]


def test_packed_sequences_run_on_a_dense_mask(specs_run: set[str]) -> None:
    """Packed sequences (position ids restarting, no cache) are a mask pattern no spec
    states: the mask function materialises it and hf_dense runs it. (gpt-oss builds its
    masks without the position ids, so it sees no packing, under sdpa or eager alike.)"""
    ours, ref = pair("llama")
    ids, _ = batch(padded=False)
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1]] * 2)
    with torch.no_grad():
        got = ours(ids, position_ids=positions, use_cache=False).logits
        want = ref(ids, position_ids=positions, use_cache=False).logits
    torch.testing.assert_close(got, want, **TOL)
    assert specs_run == {"hf_dense"}


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_gemma3_bidirectional_runs_on_a_dense_mask(padded: bool, specs_run: set[str]) -> None:
    """Gemma 3 with use_bidirectional_attention (EmbeddingGemma) builds its masks as causal
    OR an opaque function (always true; |q - k| inside the window for sliding layers): a
    pattern no spec states, materialised and run by hf_dense."""
    configs = [
        Gemma3TextConfig(**SIZES, **GEMMA3, use_bidirectional_attention=True) for _ in range(2)
    ]
    torch.manual_seed(0)
    ref = AutoModel.from_config(configs[0], attn_implementation="sdpa").eval()
    ours = AutoModel.from_config(configs[1], attn_implementation="attncc").eval()
    ours.load_state_dict(ref.state_dict())
    ids, mask = batch(padded)
    with torch.no_grad():
        got = ours(ids, attention_mask=mask).last_hidden_state
        want = ref(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(real(got, mask), real(want, mask), **TOL)
    assert specs_run == {"hf_dense"}


@pytest.mark.parametrize("family", ["llama", "gpt_oss"])
def test_4d_masks_from_the_caller(family: str, specs_run: set[str]) -> None:
    """A caller's own 4-D mask (boolean or additive) reaches the attention as it is: hf_dense
    and hf_bias run it (with sinks: hf_dense_sinks and hf_bias_sinks). The reference gets
    the additive mask: gpt-oss's eager attention adds a boolean mask to the scores as 0/1."""
    ours, ref = pair(family)
    ids, _ = batch(padded=False)
    allowed = torch.rand(2, 1, 9, 9, generator=torch.Generator().manual_seed(2)) < 0.6
    allowed |= torch.eye(9, dtype=torch.bool)  # every query sees a key
    additive = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
    with torch.no_grad():
        want = ref(ids, attention_mask=additive, use_cache=False).logits
        for mask in (allowed, additive):
            got = ours(ids, attention_mask=mask, use_cache=False).logits
            torch.testing.assert_close(got, want, **TOL)
    suffix = "_sinks" if family == "gpt_oss" else ""
    assert specs_run == {"hf_dense" + suffix, "hf_bias" + suffix}


def test_tolerance_sees_a_missing_sink() -> None:
    """gpt-oss's logits with and without its sinks (a sink of -inf takes no share) differ by
    far more than the tolerance."""
    _, ref = pair("gpt_oss")
    ids, mask = batch(padded=False)
    with torch.no_grad():
        with_sinks = ref(ids, attention_mask=mask).logits
        for layer in ref.model.layers:
            layer.self_attn.sinks.fill_(float("-inf"))
        without = ref(ids, attention_mask=mask).logits
    assert (with_sinks - without).abs().max() > 1000 * TOL["atol"]


def sink_definition(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, allowed: torch.Tensor
) -> torch.Tensor:
    """gpt-oss's eager attention in float64: the sink a column appended to the scores and
    dropped after the softmax; [B, H, M, D] in, [B, M, H, D] out."""
    q, k, v, sinks = (t.double() for t in (q, k, v, sinks))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(~allowed, float("-inf"))
    column = sinks[None, :, None, None].expand(*s.shape[:-1], 1)
    p = torch.softmax(torch.cat([s, column], -1), -1)[..., :-1]
    return (p @ v).transpose(1, 2)


@pytest.mark.parametrize("window", [None, 48], ids=["full", "window"])
def test_sink_decode_runs_fused_over_a_long_cache(window: int | None) -> None:
    """A decode call with sinks (one query, a cache of many key tiles, a padded batch) runs
    the fused schedule (split-KV has no sink term, so it is never dispatched to) and gives
    the definition's answer."""
    generator = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 1, 16, generator=generator)
    k, v = (torch.randn(2, 2, 300, 16, generator=generator) for _ in range(2))
    sinks = 2 * torch.randn(4, generator=generator)
    padding = torch.ones(2, 300, dtype=torch.bool)
    padding[1, :37] = False
    mask = attncc_hf.AttnccMask(True, window, 299, key_padding=padding)
    name = "hf_causal_window_sinks_padded" if window else "hf_causal_sinks_padded"
    kernel = attncc_hf.kernel(name)
    assert (kernel.ir.schedule, kernel.ir.split_max_queries) == ("fused", 0)
    out, _ = attncc_hf.attention_forward(
        torch.nn.Module(), q, k, v, mask, scaling=16**-0.5, sliding_window=window, s_aux=sinks
    )
    n = torch.arange(300)
    allowed = (n <= 299) & ((299 - n < window) if window else True)
    allowed = (allowed[None, :] & padding)[:, None, None, :]
    torch.testing.assert_close(out.double(), sink_definition(q, k, v, sinks, allowed), **TOL)


def test_sinks_with_soft_capping_are_refused_by_name() -> None:
    """No spec states soft-capping and sinks together: the call stops with an error naming
    both, never an answer without one of them."""
    q, k, v = (torch.randn(1, 2, 3, 16) for _ in range(3))
    mask = attncc_hf.AttnccMask(True, None, 0)
    with pytest.raises(NotImplementedError, match="soft-capping together with attention sinks"):
        attncc_hf.attention_forward(
            torch.nn.Module(), q, k, v, mask, softcap=2.0, s_aux=torch.zeros(2)
        )


def test_specs_compile_once_per_process() -> None:
    assert attncc_hf.kernel("hf_causal") is attncc_hf.kernel("hf_causal")
    for name in attncc_hf.SPEC_TABLE.values():
        assert (attncc_hf.SPECS / f"{name}.attn").is_file()


def test_every_spec_declares_q_k_v_first() -> None:
    """attention_forward passes query, key and value by position."""
    for name in attncc_hf.SPEC_TABLE.values():
        spec = load(attncc_hf.SPECS / f"{name}.attn")
        assert tuple(spec.inputs)[:3] == ("q", "k", "v"), name


def test_register_is_idempotent() -> None:
    attncc_hf.register()
    attncc_hf.register()
    assert transformers.AttentionInterface._global_mapping["attncc"] is attncc_hf.attention_forward


def test_import_attncc_leaves_transformers_out() -> None:
    code = "import sys, attncc; print('transformers' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2", "gemma3", "gpt_oss"])
def test_static_cache_decode(family: str) -> None:
    """A static cache hands attention all its slots, the unwritten ones too, with a query
    offset (a tensor) into them: the padding mask hides the unwritten slots. generate()
    builds these masks ahead of the forward and passes them back in as attention_mask."""
    ours, ref = pair(family)
    ids, mask = batch(padded=True)
    args = dict(
        attention_mask=mask,
        max_new_tokens=3,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        cache_implementation="static",
    )
    got = ours.generate(ids, **args)
    want = ref.generate(ids, **args)
    assert torch.equal(got.sequences, want.sequences)
    for step_got, step_want in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(step_got, step_want, **TOL)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_compiled_model_compiles_as_often_as_with_sdpa(cache: str) -> None:
    """torch.compile over an attncc model traces every layer's attention whole (a spec's
    first compile reads files: traced, it broke each layer's graph) and compiles as often as
    the sdpa model: the query offset a new cache length brings is traced as a symbolic int,
    not a constant that recompiles every decoding step (dynamo's recompile limit would then
    send the model back to eager)."""
    ids, mask = batch(padded=True)
    args: dict[str, Any] = dict(
        attention_mask=mask,
        max_new_tokens=5,
        do_sample=False,
        cache_implementation="static" if cache == "static" else None,
    )
    frames = {}
    tokens = {}
    for model in pair("llama"):
        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
        model.forward = torch.compile(model.forward, backend=counter)
        tokens[model.config._attn_implementation] = model.generate(ids, **args)
        frames[model.config._attn_implementation] = counter.frame_count
    assert torch.equal(tokens["attncc"], tokens["sdpa"])
    assert frames["attncc"] == frames["sdpa"], frames
    ours, _ = pair("llama")
    explained = torch._dynamo.explain(ours)(ids, attention_mask=mask, use_cache=False)
    assert explained.graph_break_count == 0, explained.break_reasons


def test_a_compiled_step_over_a_static_cache_keeps_its_graph_whole() -> None:
    """A decoding step of a compiled forward over a StaticCache (outside generate(), which
    builds the masks ahead): transformers passes the query offset as a tensor, which the
    mask function turns into a dense mask on the device rather than read it (a graph break),
    with the eager step's logits."""
    from transformers import StaticCache

    ours, _ = pair("llama")
    ids, _ = batch(padded=False)

    def step(model: Any, cache: Any, token: torch.Tensor) -> torch.Tensor:
        return model(token, cache=cache, use_cache=True).logits

    def prefilled() -> tuple[Any, torch.Tensor]:
        cache = StaticCache(config=ours.config, max_cache_len=16)
        return cache, ours(ids, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)

    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(step)(ours, *prefilled())
        assert explained.graph_break_count == 0, explained.break_reasons
        want = step(ours, *prefilled())
        got = torch.compile(step, backend="aot_eager")(ours, *prefilled())
    torch.testing.assert_close(got, want, **TOL)

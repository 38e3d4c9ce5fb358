"""Reference decoder: CoAttentionEngine inside a transformers Llama/Qwen3 model.

Hooks the model the way the SGLang adapter does: prompt K/V go to the engine at
prefill; each decode step sends one token per request through the model, whose
attention calls go to engine.attend; a forward pre-hook on layer i's q_proj sees
layer i's normalized input X_i and predicts layer i+1's query
(RoPE(q_norm(W_q^{i+1} X_i))) for engine.predict. It measures the
predicted-vs-real query cosine per layer along the way.

With prediction_cosine=c the prediction is instead layer i+1's real query
blended with random noise to cosine c (given to engine.predict just before
attend): what layer-ahead selection would do with a predictor of that quality.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from scout_sglang.config import ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape

ATTENTION_NAME = "scout_engine"


@dataclass
class Prefill:
    """One prompt's prefill, kept to decode the same prompt again without running it through the model: the K/V
    the engine was given for each layer ([N, Hkv, D] each, post-RoPE) and the logits of the last position (fp32).
    The prefill is dense attention in every mode, so it serves any engine configuration."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    logits: torch.Tensor


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # new tokens per request
    logits: list[torch.Tensor]  # per request [new_tokens, vocab] fp32
    telemetry: list = field(default_factory=list)  # StepTelemetry per decode step
    query_cosine: dict[int, list[float]] = field(default_factory=dict)  # layer -> cosines (predicted vs real)
    prefills: list[Prefill] = field(default_factory=list)  # per request, when generate kept them


def _engine_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """transformers attention function: query [B, Hq, T, D], key/value [B, Hkv, T, D] (post-RoPE)."""
    return module._scout_decoder._attention(module, query, key, value, scaling)


def blend_to_cosine(q: torch.Tensor, cosine: float, generator: torch.Generator) -> torch.Tensor:
    """q [rows, ...] with each row turned, at its own norm, to a random direction at exactly `cosine` from it."""
    if not -1.0 <= cosine <= 1.0:
        raise ValueError(f"cosine must be in [-1, 1], got {cosine}")
    flat = q.float().flatten(1)
    unit = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-30)
    noise = torch.randn(flat.shape, generator=generator, dtype=torch.float32).to(flat.device)
    noise = noise - (noise * unit).sum(1, keepdim=True) * unit
    noise = noise / noise.norm(dim=1, keepdim=True).clamp_min(1e-30)
    turned = (cosine * unit + (1 - cosine ** 2) ** 0.5 * noise) * flat.norm(dim=1, keepdim=True)
    return turned.view_as(q).to(q.dtype)


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, _engine_attention)


class ReferenceDecoder:
    """Greedy decoding of a batch of prompts through the engine.

    Parameters
    ----------
    model : a transformers LlamaForCausalLM or Qwen3ForCausalLM in eval mode
    config : ScoutConfig of the engine
    max_tokens_per_request : sizes the engine's stores
    engine : optional factory engine(config, shape) of another engine with CoAttentionEngine's driver
        protocol (add_request, prefill, begin_step, wants_prediction, predict, attend, end_step,
        release_request, close), for example a second implementation to compare with
    prediction_cosine : None (layer-ahead prediction) or the cosine to which each layer's real query is blended
        with noise (seeded by noise_seed) to stand in for the prediction
    """

    def __init__(self, model, config: ScoutConfig, *, max_requests: int = 8, max_tokens_per_request: int = 4096,
                 track_changes: bool = True, cpu_worker=None, engine=None,
                 prediction_cosine: float | None = None, noise_seed: int = 0):
        register_attention()
        self.prediction_cosine = prediction_cosine
        self._noise = torch.Generator().manual_seed(noise_seed)
        self.model = model
        text = model.config
        self.layers = model.model.layers
        shape = ModelShape(num_layers=text.num_hidden_layers, num_qo_heads=text.num_attention_heads,
                           num_kv_heads=text.num_key_value_heads,
                           head_dim=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
                           scale=self.layers[0].self_attn.scaling)
        dtype = next(model.parameters()).dtype
        if engine is not None:
            self.engine = engine(config, shape)
        else:
            self.engine = CoAttentionEngine(config, shape, device=next(model.parameters()).device, dtype=dtype,
                                            max_requests=max_requests, max_tokens_per_request=max_tokens_per_request,
                                            cpu_worker=cpu_worker, track_changes=track_changes)
        self.shape = shape
        self._rotary = importlib.import_module(type(model).__module__).apply_rotary_pos_emb
        self._phase: tuple = ()
        self._position_embeddings = None
        self._predicted: dict[int, torch.Tensor] = {}
        self._cosines: dict[int, list[float]] = {}
        self._hooks = []
        for index, layer in enumerate(self.layers):
            layer._scout_index = index
            layer.self_attn._scout_decoder = self
            self._hooks.append(layer.register_forward_pre_hook(self._capture_rotary, with_kwargs=True))
            self._hooks.append(layer.self_attn.q_proj.register_forward_pre_hook(self._make_predict_hook(index)))

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self.engine.close()

    # -- hooks -----------------------------------------------------------------
    def _capture_rotary(self, module, args, kwargs):
        self._position_embeddings = kwargs.get("position_embeddings")

    def _make_predict_hook(self, index):
        def hook(module, args):
            if (self.prediction_cosine is None and self._phase and self._phase[0] == "decode"
                    and self.engine.wants_prediction(index + 1)):
                q_pred = self.predict_query(index + 1, args[0])
                self._predicted[index + 1] = q_pred
                self.engine.predict(index + 1, q_pred)

        return hook

    def predict_query(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s query from the previous layer's normalized input x [B, 1, hidden] -> [B, Hq, D]."""
        attn = self.layers[layer].self_attn
        # F.linear, not attn.q_proj(x): calling the module would fire its own
        # pre-hook and predict layer + 2 from this (stale) input, and so on.
        q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(*x.shape[:-1], -1, self.shape.head_dim)
        if hasattr(attn, "q_norm"):
            q = attn.q_norm(q)
        q = q.transpose(1, 2)  # [B, Hq, 1, D]
        cos, sin = self._position_embeddings
        q, _ = self._rotary(q, q, cos, sin)
        return q[:, :, 0].contiguous()

    def _attention(self, module, query, key, value, scaling):
        layer = module.layer_idx
        if self._phase[0] == "prefill":
            rid, kept = self._phase[1], self._phase[2]
            k, v = key[0].transpose(0, 1).contiguous(), value[0].transpose(0, 1).contiguous()
            self.engine.prefill(rid, layer, k, v)
            if kept is not None:
                kept.keys.append(k)
                kept.values.append(v)
            out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=True)
            return out.transpose(1, 2).contiguous(), None
        q = query[:, :, 0].contiguous()
        if self.prediction_cosine is not None and self.engine.wants_prediction(layer):
            self._predicted[layer] = blend_to_cosine(q, self.prediction_cosine, self._noise)
            self.engine.predict(layer, self._predicted[layer])
        predicted = self._predicted.pop(layer, None)
        if predicted is not None:
            cosine = F.cosine_similarity(predicted.float().flatten(1), q.float().flatten(1), dim=-1)
            self._cosines.setdefault(layer, []).extend(cosine.tolist())
        o = self.engine.attend(layer, q, key[:, :, 0].contiguous(), value[:, :, 0].contiguous())
        return o.unsqueeze(1).to(query.dtype), None

    # -- generation --------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, *, first_rid: int = 0,
                 prefills: list[Prefill] | None = None, keep_prefills: bool = False) -> GenerationResult:
        """Greedy: prefill each prompt, then decode all requests together for max_new_tokens.

        prefills : the Prefill of each prompt from an earlier generate (keep_prefills=True): the engine is given
            the same K/V and the first token comes from the same logits, without running the prompts through the
            model (what a benchmark of many configurations on the same prompts spends most of its time on)
        keep_prefills : return each prompt's Prefill in result.prefills"""
        previous = self.model.config._attn_implementation
        self.model.config._attn_implementation = ATTENTION_NAME
        device = next(self.model.parameters()).device
        rids = list(range(first_rid, first_rid + len(prompts)))
        result = GenerationResult([[] for _ in prompts], [[] for _ in prompts])
        self._cosines = {}
        try:
            last_logits = []
            for index, (rid, prompt) in enumerate(zip(rids, prompts)):
                self.engine.add_request(rid)
                if prefills is not None:
                    kept = prefills[index]
                    for layer, (k, v) in enumerate(zip(kept.keys, kept.values)):
                        self.engine.prefill(rid, layer, k, v)
                    last_logits.append(kept.logits)
                    continue
                kept = Prefill([], [], torch.empty(0)) if keep_prefills else None
                self._phase = ("prefill", rid, kept)
                ids = torch.tensor([prompt], device=device)
                logits = self.model(input_ids=ids, position_ids=torch.arange(len(prompt), device=device)[None],
                                    use_cache=False).logits
                last_logits.append(logits[0, -1].float())
                if kept is not None:
                    kept.logits = last_logits[-1]
                    result.prefills.append(kept)
            lengths = [len(p) for p in prompts]
            for step in range(max_new_tokens):
                next_ids = [int(logits.argmax()) for logits in last_logits]
                for b, (token, logits) in enumerate(zip(next_ids, last_logits)):
                    result.tokens[b].append(token)
                    result.logits[b].append(logits)
                if step == max_new_tokens - 1:
                    break
                self._phase = ("decode",)
                self.engine.begin_step(rids)
                ids = torch.tensor(next_ids, device=device)[:, None]
                positions = torch.tensor([n + step for n in lengths], device=device)[:, None]
                logits = self.model(input_ids=ids, position_ids=positions, use_cache=False).logits
                result.telemetry.append(self.engine.end_step())
                last_logits = [logits[b, -1].float() for b in range(len(prompts))]
        finally:
            self._phase = ()
            self.model.config._attn_implementation = previous
            for rid in rids:
                self.engine.release_request(rid)
        result.logits = [torch.stack(per) for per in result.logits]
        result.query_cosine = self._cosines
        return result


@torch.no_grad()
def dense_generate(model, prompts: list[list[int]], max_new_tokens: int) -> GenerationResult:
    """The truth: greedy decoding with transformers' own KV cache and sdpa attention,
    one prompt at a time, no logits processors."""
    from transformers import DynamicCache

    previous = model.config._attn_implementation
    model.config._attn_implementation = "sdpa"
    device = next(model.parameters()).device
    result = GenerationResult([], [])
    try:
        for prompt in prompts:
            cache = DynamicCache(config=model.config)
            logits = model(input_ids=torch.tensor([prompt], device=device), past_key_values=cache, use_cache=True).logits
            tokens, per_step = [], []
            for _ in range(max_new_tokens):
                step_logits = logits[0, -1].float()
                per_step.append(step_logits)
                tokens.append(int(step_logits.argmax()))
                logits = model(input_ids=torch.tensor([[tokens[-1]]], device=device), past_key_values=cache,
                               use_cache=True).logits
            result.tokens.append(tokens)
            result.logits.append(torch.stack(per_step))
    finally:
        model.config._attn_implementation = previous
    return result

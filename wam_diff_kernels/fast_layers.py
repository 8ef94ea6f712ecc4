"""The Qwen3-VL text layers of the static decoder with fewer kernels per layer (same math).

Why: on an H200 (the ladder's `sdpa_graphs` rung, results/kernels/h200/) a captured B = 32 step of the 2B architecture took about
5.6 ms where its weights need 0.8 ms at the copy rate. A stock layer runs about 60 top-level ATen
operations (60.5 counted on nano; each RMSNorm is eight, rotary ten, three projections for q/k/v, two
for gate/up; this stack runs 32.5), and inside a CUDA
graph each kernel still costs a few microseconds. This layer stack computes the same thing with:
- one GEMM for q, k and v and one for gate and up (the weights concatenated once, at construction);
- RMSNorm as `F.rms_norm` in float32 (HF's order: normalise in float32, cast back, then scale);
- q_norm and k_norm as one RMSNorm over the q and k heads together (a per-head weight), and rotary
  over q and k together;
and optionally `torch.compile` of the two pure parts of a layer (norm + projection + rotary; output
projection + norm + MLP), which fuses their elementwise work. The compiled functions take the weights
as arguments, so one compiled graph serves every layer. The KV-cache write and attention
stay as they are (the registered backend, with the step's spec), so the static cache, the masks and
the FlashInfer plans work unchanged.

Built from the weights at construction: the merged projections are copies (the 2B architecture:
about 1.9 GB more in bfloat16), so weights changed afterwards are not seen.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .static_cache import StaticKVCache, StaticSpec


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's RMSNorm: normalise in float32, cast back to x's dtype, then scale."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def attention_inputs(h: torch.Tensor, ln_w: torch.Tensor, w_qkv: torch.Tensor, b_qkv: Optional[torch.Tensor],
                     qk_norm_w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h (batch, n, hidden) -> q (batch, heads, n, d), k and v (batch, kv_heads, n, d), rotary applied to q, k."""
    qkv = F.linear(rms_norm(h, ln_w, eps), w_qkv, b_qkv)
    qkv = qkv.unflatten(-1, (heads + 2 * kv_heads, -1))  # (batch, n, heads + 2 kv_heads, d)
    qk = rms_norm(qkv[:, :, : heads + kv_heads], qk_norm_w, eps)
    cos, sin = cos[:, :, None], sin[:, :, None]
    qk = qk * cos + rotate_half(qk) * sin
    return (qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2),
            qkv[:, :, heads + kv_heads:].transpose(1, 2))


def attention_output_and_mlp(h: torch.Tensor, attn: torch.Tensor, w_o: torch.Tensor, b_o: Optional[torch.Tensor],
                             ln_w: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                             eps: float) -> torch.Tensor:
    """The rest of the layer: residual + o_proj(attn), then residual + down(silu(gate) * up) of its RMSNorm."""
    h = h + F.linear(attn, w_o, b_o)
    gate, up = F.linear(rms_norm(h, ln_w, eps), w_gate_up).chunk(2, dim=-1)
    return h + F.linear(F.silu(gate) * up, w_down)


@dataclass
class LayerWeights:
    module: torch.nn.Module  # the attention module (passed to the attention backend, as HF does)
    layer_idx: int
    ln_in: torch.Tensor
    w_qkv: torch.Tensor
    b_qkv: Optional[torch.Tensor]
    qk_norm: torch.Tensor  # (heads + kv_heads, d): q_norm's weight per q head, k_norm's per kv head
    w_o: torch.Tensor
    b_o: Optional[torch.Tensor]
    ln_post: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor


def _bias(*linears) -> Optional[torch.Tensor]:
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else lin.weight.new_zeros(lin.out_features) for b, lin in zip(biases, linears)])


def _eps(norms) -> float:
    values = {float(n.variance_epsilon) for n in norms}
    if len(values) != 1:
        raise ValueError(f"the fast layers take one RMSNorm epsilon per model, found {sorted(values)}")
    return values.pop()


class FastTextLayers:
    """The text decoder layers of one model, for the static decoder's forwards (`forward_static`'s contract)."""

    def __init__(self, model, compile_layers: bool = False):
        text = model.model.language_model
        cfg = model.config.text_config
        act = getattr(cfg, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"the fast layers implement Qwen3's SiLU MLP; this model's hidden_act is {act!r}")
        self.config = cfg
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.embed, self.norm = text.embed_tokens, text.norm
        norms, self.layers = [], []
        with torch.no_grad():
            for layer in text.layers:
                a, m = layer.self_attn, layer.mlp
                norms += [layer.input_layernorm, layer.post_attention_layernorm, a.q_norm, a.k_norm]
                if m.gate_proj.bias is not None or m.up_proj.bias is not None or m.down_proj.bias is not None:
                    raise ValueError("the fast layers implement Qwen3's MLP without biases")
                qk_norm = torch.cat([a.q_norm.weight.expand(self.heads, -1), a.k_norm.weight.expand(self.kv_heads, -1)])
                self.layers.append(LayerWeights(
                    a, a.layer_idx, layer.input_layernorm.weight,
                    torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), _bias(a.q_proj, a.k_proj, a.v_proj),
                    qk_norm.contiguous(), a.o_proj.weight, a.o_proj.bias, layer.post_attention_layernorm.weight,
                    torch.cat([m.gate_proj.weight, m.up_proj.weight]), m.down_proj.weight))
        self.eps = _eps(norms)
        self.compiled = bool(compile_layers)
        # torch.compile's default dynamism: the first shape compiles static, a second shape (the fused step's 2B
        # queries, another batch) once more with dynamic sizes, which then serves every later bucket
        self._inputs: Callable = torch.compile(attention_inputs) if compile_layers else attention_inputs
        self._rest: Callable = torch.compile(attention_output_and_mlp) if compile_layers else attention_output_and_mlp

    def forward(self, tokens: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: StaticKVCache,
                spec: StaticSpec) -> torch.Tensor:
        """Final hidden states (batch, n, hidden) of `tokens` (batch, n) against the static cache."""
        attention = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        cos, sin = rope
        h = self.embed(tokens)
        b, n, _ = h.shape
        for w in self.layers:
            q, k, v = self._inputs(h, w.ln_in, w.w_qkv, w.b_qkv, w.qk_norm, cos, sin, self.heads, self.kv_heads,
                                   self.eps)
            k, v = cache.update(k, v, w.layer_idx)
            attn, _ = attention(w.module, q, k, v, None, dropout=0.0, scaling=w.module.scaling, block_spec=spec)
            h = self._rest(h, attn.reshape(b, n, -1), w.w_o, w.b_o, w.ln_post, w.w_gate_up, w.w_down, self.eps)
        return self.norm(h)

"""The decoder stack (TransformerDecoderLayer, TransformerDecoder) and the decoder language model
with its LM head (the Model Zoo's GPT2LMHeadModel, which every decoder family but GPT-J/NeoX and
Falcon uses under its own name).

A layer is pre-norm: ``x + dropout1(attn(norm1(x)))`` then ``x + ffn(norm3(x))``; with
``norm_first_sandwich`` (Gemma 2) the sub-block outputs are normed again (``norm1_post``,
``norm3_post``) before the residual add. A parallel layer (GPT-J, GPT-NeoX, Falcon:
GPTJDecoderLayer) is ``x + attn(norm1(x)) + ffn(norm3(x))``, with no ``norm3`` (the FFN reads
``norm1(x)`` too) when the norm is tied. Module names are the Model Zoo's, so its checkpoints load
key for key (``model.transformer_decoder.layers.0.self_attn.proj_q_dense_layer.weight``, ...).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from cs_run.errors import DataError
from cs_run.models.common.attention import MultiheadAttention
from cs_run.models.common.embeddings import EmbeddingLayer
from cs_run.models.common.kv_cache import KVCache
from cs_run.models.common.masks import causal_mask, position_mask, vsl_mask
from cs_run.models.common.norms import reset_norm

__all__ = ["TransformerDecoderLayer", "TransformerDecoder", "DecoderLM"]


class TransformerDecoderLayer(nn.Module):
    def __init__(self, hidden_size: int, norm: Callable[[int], nn.Module], attention: MultiheadAttention,
                 ffn: nn.Module, dropout: float, sandwich: bool = False, parallel: bool = False,
                 ffn_norm: bool = True) -> None:
        super().__init__()
        self.parallel = parallel
        self.self_attn = attention
        self.norm1 = norm(hidden_size)
        self.dropout1 = nn.Dropout(dropout)
        self.norm3 = norm(hidden_size) if ffn_norm else None  # parallel blocks with a tied norm: none
        self.norm1_post = norm(hidden_size) if sandwich else None
        self.norm3_post = norm(hidden_size) if sandwich else None
        self.ffn = ffn
        for n in (self.norm1, self.norm3, self.norm1_post, self.norm3_post):
            if n is not None:
                reset_norm(n)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rotary=None, position_bias=None,
                layer_idx: int = 0, causal: bool = False, cache: Optional[KVCache] = None
                ) -> tuple[torch.Tensor, Optional[tuple]]:
        normed = self.norm1(x)
        attn = self.dropout1(self.self_attn(normed, mask, rotary, position_bias, layer_idx, causal, cache=cache))
        if self.parallel:  # GPTJDecoderLayer: x + attn(norm1(x)) + ffn(norm3(x) or norm1(x))
            return x + self.ffn(self.norm3(x) if self.norm3 is not None else normed) + attn, None
        if self.norm1_post is not None:
            attn = self.norm1_post(attn)
        x = x + attn
        out = self.ffn(self.norm3(x))
        routing = None
        if isinstance(out, tuple):  # MoE: (output, routing weights, expert mask)
            out, routing = out[0], out[1:]
        if self.norm3_post is not None:
            out = self.norm3_post(out)
        return x + out, routing


class TransformerDecoder(nn.Module):
    def __init__(self, layers: list[nn.Module], norm: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm


class DecoderLM(nn.Module):
    """Embeddings (+ optional embedding norm, times ``embeddings_scale``), the layers, the final norm
    ``ln_f`` (also registered as ``transformer_decoder.norm``, as in the Model Zoo), the LM head (tied to
    the token embeddings by ``share_embedding_weights``), logits times ``output_logits_scale`` (muP),
    then optional ``final_logit_softcapping``. Returns logits, plus per-layer routing for MoE."""

    def __init__(self, *, embedding_layer: EmbeddingLayer, layers: list[nn.Module], norm: Callable[[int], nn.Module],
                 hidden_size: int, vocab_size: int, embedding_layer_norm: bool, embedding_dropout: float,
                 embeddings_scale: float, share_embedding_weights: bool, use_bias_in_output: bool,
                 lm_head_std: float, output_logits_scale: Optional[float], final_logit_softcapping: Optional[float],
                 sliding_window: Optional[int], sliding_window_every_other_layer: bool,
                 sliding_window_first: bool, sink_tokens: Optional[int]) -> None:
        super().__init__()
        self.embedding_layer = embedding_layer
        self.embedding_ln_f = norm(hidden_size) if embedding_layer_norm else None
        self.drop_embd = nn.Dropout(embedding_dropout)
        self.embeddings_scale = embeddings_scale
        self.ln_f = norm(hidden_size)
        reset_norm(self.ln_f)
        if self.embedding_ln_f is not None:
            reset_norm(self.embedding_ln_f)
        self.transformer_decoder = TransformerDecoder(layers, self.ln_f)
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=use_bias_in_output)
        self.share_embedding_weights = share_embedding_weights
        self.output_logits_scale = output_logits_scale
        self.final_logit_softcapping = final_logit_softcapping
        self.sliding_window = sliding_window
        self.sliding_window_every_other_layer = sliding_window_every_other_layer
        self.sliding_window_first = sliding_window_first
        self.sink_tokens = sink_tokens
        with torch.no_grad():
            if not share_embedding_weights:
                self.lm_head.weight.normal_(0.0, lm_head_std)
            if self.lm_head.bias is not None:
                self.lm_head.bias.zero_()
        self.tie_weights()
        self._register_load_state_dict_pre_hook(self._older_keys)

    @staticmethod
    def _older_keys(state_dict, prefix, *args) -> None:
        """Older Model Zoo checkpoints keep ALiBi slopes on the LM (``relative_pe_helper.slopes``)."""
        old, new = prefix + "relative_pe_helper.slopes", prefix + "embedding_layer.position_embed_helper.slopes"
        if old in state_dict and new not in state_dict:
            state_dict[new] = state_dict.pop(old)

    def tie_weights(self) -> None:
        if self.share_embedding_weights:
            self.lm_head.weight = self.embedding_layer.word_embeddings.weight

    def _masks(self, length: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(full, sliding) masks; without every-other-layer windows both are the one mask all layers use."""
        if not self.sliding_window_every_other_layer:
            mask = causal_mask(length, x.device, x.dtype, self.sliding_window, self.sink_tokens)
            return mask, mask
        return (causal_mask(length, x.device, x.dtype),
                causal_mask(length, x.device, x.dtype, self.sliding_window, self.sink_tokens))

    def _windowed(self, i: int) -> bool:
        """Whether layer ``i`` attends through the sliding window."""
        return self.sliding_window is not None and (
            not self.sliding_window_every_other_layer or (i % 2 == 0) == self.sliding_window_first)

    def _embedded(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding_ln_f is not None:
            x = self.embedding_ln_f(x)
        if self.embeddings_scale != 1.0:
            x = x * self.embeddings_scale
        return self.drop_embd(x)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.ln_f(x))
        if self.output_logits_scale:
            logits = logits * self.output_logits_scale
        if self.final_logit_softcapping:
            logits = torch.tanh(logits / self.final_logit_softcapping) * self.final_logit_softcapping
        return logits

    def input_embeddings(self, input_ids: torch.Tensor, position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The hidden states the first layer reads for ``input_ids`` (the Model Zoo's
        ``compute_input_embeddings``): a multimodal model splices other features into them and passes them
        back as :meth:`forward`'s ``input_embeddings``. ``position_ids`` read a learned / fixed position table
        at them (Release 2.2's llava samples carry them; a rotary or ALiBi model has no table to read)."""
        x = self.embedding_layer(input_ids) if position_ids is None else self._embedded_at(input_ids, position_ids)
        return self._embedded(x)

    def forward(self, input_ids: Optional[torch.Tensor], attention_span: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None, *, input_embeddings: Optional[torch.Tensor] = None,
                key_padding_mask: Optional[torch.Tensor] = None):
        """Logits of ``input_ids`` [batch, seq]. A packed (VSL) batch also carries ``attention_span`` (each
        key attends within its own document only: :func:`~cs_run.models.common.masks.vsl_mask`) and
        ``position_ids`` (positions restart at each document: learned / fixed tables, rotary angles and
        ALiBi distances are read at them), as the Model Zoo's GPT2LMHeadModel takes them. A multimodal
        model gives ``input_embeddings`` (:meth:`input_embeddings`, spliced) instead of ``input_ids``, and
        ``key_padding_mask`` [batch, seq], added to every query's scores of those keys (the Model Zoo's
        additive ``tgt_key_padding_mask``: 0 attends, the dtype's minimum does not), over the causal mask or,
        with ``attention_span`` (Release 2.2's llava samples), the VSL one."""
        if input_embeddings is not None:
            x = input_embeddings
        else:
            x = self.embedding_layer(input_ids) if position_ids is None \
                else self._embedded_at(input_ids, position_ids)
            x = self._embedded(x)
        length = x.shape[1]
        if attention_span is None:
            full, sliding = self._masks(length, x)
        else:
            full = vsl_mask(attention_span, x.dtype, None if self.sliding_window_every_other_layer
                            else self.sliding_window, self.sink_tokens)
            sliding = vsl_mask(attention_span, x.dtype, self.sliding_window, self.sink_tokens) \
                if self.sliding_window_every_other_layer else full
        if key_padding_mask is not None:  # the multimodal models' inputs: the causal (or VSL) mask plus the padded keys
            padded = key_padding_mask[:, None, None, :].to(x.dtype)
            if attention_span is not None:  # a trailing pad query's only VSL key is its own: left seen, so no row is
                # all masked (-inf and NaN in bfloat16); a padded position's output reaches no other (no one sees it)
                padded = padded * (1 - torch.eye(length, dtype=x.dtype, device=x.device))
            low = torch.finfo(x.dtype).min  # two minima add to -inf: clamped, so no row is all -inf
            full, sliding = ((m + padded).clamp(min=low) for m in (full, sliding))
        rotary = self.embedding_layer.rotary
        if position_ids is None:
            bias = self.embedding_layer.position_bias(length)
        else:
            if rotary is not None and len(self.transformer_decoder.layers):
                rotary = rotary.at(position_ids, self.transformer_decoder.layers[0].self_attn.head_dim)
            bias = self.embedding_layer.position_bias_at(position_ids, position_ids)
        routing = []
        for i, layer in enumerate(self.transformer_decoder.layers):
            windowed = self._windowed(i)
            # a VSL mask is not the plain causal one: a fused kernel must read it
            x, r = layer(x, sliding if windowed else full, rotary, bias, i,
                         causal=not windowed and attention_span is None and key_padding_mask is None)
            if r is not None:
                routing.append(r)
        logits = self._logits(x)
        return (logits, routing) if routing else logits

    def _embedded_at(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """The token embeddings at ``position_ids``, after :meth:`EmbeddingLayer.forward`'s length check."""
        if position_ids.shape != input_ids.shape:
            raise DataError(f"position_ids: shape {list(position_ids.shape)} but input_ids {list(input_ids.shape)}; "
                            "a VSL batch carries one position per token")
        limit = self.embedding_layer.max_position_embeddings
        if input_ids.shape[1] > limit:
            raise DataError(f"the batch's sequence length {input_ids.shape[1]} exceeds model.max_position_embeddings "
                            f"({limit}); raise it, or write shorter sequences")
        return self.embedding_layer.embed_at(input_ids, position_ids)

    def decode(self, input_ids: torch.Tensor, cache: KVCache, attention_mask: Optional[torch.Tensor] = None,
               last_only: bool = False) -> torch.Tensor:
        """Incremental decoding: the logits [batch, seq, vocab] of ``input_ids`` [batch, seq] following the
        tokens ``cache`` holds, which then holds these too (a prompt's prefill, then one token at a time).
        ``attention_mask`` [batch, seq] marks left padding with 0. Each token's logits equal :meth:`forward`'s
        at its position of the whole sequence (up to float rounding); MoE routing is not returned.
        ``last_only``: the last column's logits only, [batch, 1, vocab] (a prefill skips the LM head elsewhere)."""
        positions = cache.advance(attention_mask, input_ids.shape[1])
        last = int(cache.next_position.max()) - 1  # host sync: once per decoding step
        limit = self.embedding_layer.max_position_embeddings
        if last >= limit:
            raise DataError(f"position {last} is past model.max_position_embeddings ({limit}); generate fewer "
                            "tokens or give a shorter prompt")
        x = self._embedded(self.embedding_layer.embed_at(input_ids, positions))
        k_positions, k_valid = cache.keys_positions()
        window, sinks = self.sliding_window, self.sink_tokens
        full = position_mask(positions, k_positions, k_valid, x.dtype,
                             None if self.sliding_window_every_other_layer else window, sinks)
        sliding = position_mask(positions, k_positions, k_valid, x.dtype, window, sinks) \
            if self.sliding_window_every_other_layer else full
        rotary = self.embedding_layer.rotary
        if rotary is not None and len(self.transformer_decoder.layers):  # no layers: nothing rotates
            rotary = rotary.at(positions, self.transformer_decoder.layers[0].self_attn.head_dim)
        bias = self.embedding_layer.position_bias_at(positions, k_positions)
        for i, layer in enumerate(self.transformer_decoder.layers):
            x, _ = layer(x, sliding if self._windowed(i) else full, rotary, bias, i, causal=False, cache=cache)
        return self._logits(x[:, -1:] if last_only else x)

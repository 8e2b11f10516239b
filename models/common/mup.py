"""muP's learning-rate groups (gpt2_model.py create_default_lr_adjustment_groups): glob patterns over
the LM's parameter names (as ``named_parameters()`` of the model the runner trains) and a scale. The
model sets the scales (1/width multiplier for attention and input-FFN kernels, 1/filter multiplier
for output-FFN kernels); the optimizer's ``adjust_learning_rate`` may override them by group name.
"""

from __future__ import annotations

import fnmatch

__all__ = ["default_lr_adjustment_groups", "group_of"]


def default_lr_adjustment_groups() -> dict[str, tuple[list[str], float]]:
    return {
        "embedding": (["*embedding*weight"], 1.0),
        "decoder_kernel": (["*decoder*dense*weight", "*decoder*linear*weight", "*decoder*linear*expert_weights"], 1.0),
        "decoder_attention": (["*decoder*attn*dense*weight"], 1.0),
        "decoder_input_ffn": (["*decoder*ffn.ffn.[!1]*weight", "*decoder*ffn.ffn.[!1]*expert_weights"], 1.0),
        "decoder_output_ffn": (["*decoder*ffn.ffn.[1]*weight", "*decoder*ffn.ffn.[1]*expert_weights"], 1.0),
    }


def group_of(name: str, patterns: list[str]) -> bool:
    """Whether parameter ``name`` is in a group (fnmatch globs, as the Model Zoo's make_param_filter)."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)

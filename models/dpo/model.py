"""The Model Zoo's dpo model (Release 2.10 ``models/nlp/dpo/model.py``): Direct Preference Optimization of a
decoder LM against a frozen reference copy of it.

``model.policy_model`` is any registered decoder family's ``model`` section (its ``name`` picks the family),
built through the registry with that family's schema. ``model.dpo`` holds the vendor's DPOParameters:
``beta``, ``reference_free``, ``loss_type`` (:mod:`cs_run.models.dpo.loss`), ``disable_dropout`` and
``dpop_penalty_weight``. The older flat form (the policy's keys beside ``dpo``, its family in
``model_name``) is nested as the vendor's config validator nests it.

The reference is a copy of the policy made when the model is built, so it starts from the same weights
(a checkpoint sets both: the vendor's DPO checkpoints hold ``policy_model.*`` and ``ref_model.*``, and so
do cs-run's, so a resumed run keeps its first reference). It is frozen (no gradients, not in the
optimizer) and always in eval mode. A sequence's log-probability is the sum, under the loss mask
(``attention_mask``), of its label tokens' log-probabilities (for ``ipo`` their mean over the mask).

Logged as the vendor logs them: on every train log step ``chosen_rewards``, ``rejected_rewards``,
``reward_accuracies``, ``reward_margins`` (rewards are ``beta * (policy - reference)`` log-probs; not when
``reference_free``), ``policy_chosen_logps`` and ``policy_rejected_logps``, the batch means; in evaluation
the means over the eval batches as ``eval/rewards_chosen``, ``eval/rewards_rejected``,
``eval/rewards_accuracies``, ``eval/rewards_margins``, ``eval/logps_chosen`` and ``eval/logps_rejected``.
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from cs_run.errors import ParamsError
from cs_run.metrics import MeanMetric
from cs_run.models.common.family import LM_DATA_PROCESSORS
from cs_run.models.common.lm import DecoderLMModel
from cs_run.models.dpo.loss import DPOLoss, DPOLossType
from cs_run.registry import check_config_keys, check_function_keys, get_model_spec, registered_models, resolve_object
from cs_run.utils.tensorboard import summarize_scalar

__all__ = ["DPOModel", "build_model", "dpo_parameters", "model_defaults", "sequence_logps", "POLICY_PREFIX",
           "decoder_of"]

logger = logging.getLogger(__name__)

_OWN_KEYS = ("name", "dpo", "compute_eval_metrics", "mixed_precision", "use_bfloat16", "fp16_type")
"""The keys of a flat (Release 2.2-2.4) dpo model section that stay in it: the DPO model's own and the run's
precision (model.mixed_precision, use_bfloat16, fp16_type); the rest is the policy's."""

POLICY_PREFIX = "policy_model."
"""The policy's weights' key prefix in a DPO checkpoint's model state (the reference's is ``ref_model.``)."""


def dpo_parameters(beta: float = 0.1, reference_free: bool = False, loss_type: DPOLossType = "sigmoid",
                   disable_dropout: bool = True, dpop_penalty_weight: float = 5.0) -> dict:
    """The ``model.dpo`` keys (the vendor's DPOParameters, its defaults); its signature is their schema."""
    if beta <= 0:
        raise ValueError(f"dpo.beta: must be > 0, got {beta}")
    return dict(beta=float(beta), reference_free=reference_free, loss_type=loss_type,
                disable_dropout=disable_dropout, dpop_penalty_weight=float(dpop_penalty_weight))


def model_defaults(model: dict) -> None:
    """Before validation: the flat (pre-``policy_model``) form nested as the vendor's ``make_submodel`` does."""
    if "policy_model" in model:
        return
    warnings.warn("model: the DPO policy's keys are not under model.policy_model; this form is deprecated in the "
                  "Model Zoo (nest them, with the family as policy_model.name)", UserWarning, stacklevel=2)
    policy = {k: model.pop(k) for k in list(model) if k not in _OWN_KEYS}
    if "model_name" in policy:
        policy["name"] = policy.pop("model_name")
    model["policy_model"] = policy


def decoder_of(model_keys: dict, where: str) -> tuple[dict, str]:
    """The decoder a checkpoint of ``model_keys``' model exports (``--to hf``) and evaluates (``lm-eval``,
    ``generate``) and its weights' key prefix: a dpo model's trained policy (``policy_model``'s keys, its
    family's own ``model`` section), any other model itself with no prefix.

    Raises:
        ParamsError: a dpo model's policy_model is missing or names no family; ``where`` is the params file.
    """
    if model_keys.get("name") != "dpo":
        return model_keys, ""
    policy = model_keys.get("policy_model")
    if not isinstance(policy, dict) or not isinstance(policy.get("name"), str):
        raise ParamsError(f"{where}: model.policy_model: missing or without a name; a dpo model's policy is the "
                          "decoder it exports (give its family's model keys, e.g. name: llama)")
    policy = dict(policy)
    spec = get_model_spec(policy["name"])
    if spec.defaults_fn:  # its family's defaults, as the policy is built with them
        resolve_object(spec.defaults_fn, key="model.policy_model.name")(policy)
    return policy, POLICY_PREFIX


def _build_policy(keys: dict) -> DecoderLMModel:
    """The policy, built by its family's registered model function after that family's key checks."""
    keys = dict(keys)
    name = keys.pop("name", None)
    if not isinstance(name, str):
        raise ValueError("policy_model.name: missing; name the decoder family to train (gpt2, llama, mistral, ...)")
    if name == "dpo":
        raise ValueError("policy_model.name: 'dpo' cannot be its own policy; name a decoder family")
    spec = get_model_spec(name)
    if not set(spec.data_processors) & set(LM_DATA_PROCESSORS):
        decoders = [n for n in registered_models() if set(get_model_spec(n).data_processors) & set(LM_DATA_PROCESSORS)]
        raise ValueError(f"policy_model.name: {name!r} is not a decoder language model; DPO trains one of "
                         f"{', '.join(decoders)}")
    fn = resolve_object(spec.model_fn, key="model.policy_model.name")
    if spec.defaults_fn:
        resolve_object(spec.defaults_fn, key="model.policy_model.name")(keys)
    if spec.config_class:  # the family's typed config declares its keys
        check_config_keys(resolve_object(spec.config_class, key="model.policy_model.name"), keys, "model.policy_model",
                          lambda key: "")
    else:
        check_function_keys(fn, keys, "model.policy_model", set(), lambda key: "")
    keys["compute_eval_metrics"] = False  # the vendor turns the policy's LM metrics off: the DPO model reports
    try:
        policy = fn(**keys)
    except (TypeError, ValueError) as e:
        raise ValueError(f"policy_model.{e}") from None
    if not isinstance(policy, DecoderLMModel):
        raise ValueError(f"policy_model.name: {name!r} built a {type(policy).__name__}, not a decoder language model")
    return policy


def _disable_dropout(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0


def sequence_logps(lm: DecoderLMModel, input_ids: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
                   average: bool = False) -> torch.Tensor:
    """Each row's log-probability of its labels under the loss mask: the sum (``average``: the mean over the
    mask) of the label tokens' log-softmax, as the vendor's GPTLMHeadModelLoss with ``reduce_batch=False``."""
    out = lm.model(input_ids)
    logits = out[0] if isinstance(out, tuple) else out
    nll = F.cross_entropy(logits.float().reshape(-1, lm.vocab_size), labels.reshape(-1).long(), reduction="none")
    weights = mask.to(torch.float32)
    summed = torch.sum(nll.view(mask.shape) * weights, dim=-1)
    if average:
        summed = summed / torch.sum(weights, dim=-1)
    return -summed


class DPOModel(nn.Module):
    """``forward(batch) -> loss`` over a batch of the six DPO rows (:mod:`cs_run.data.processors.dpo`)."""

    def __init__(self, policy: DecoderLMModel, *, beta: float, reference_free: bool, loss_type: str,
                 disable_dropout: bool, dpop_penalty_weight: float, compute_eval_metrics: bool) -> None:
        super().__init__()
        self.beta, self.reference_free, self.loss_type = beta, reference_free, loss_type
        self.loss_fn = DPOLoss(beta, loss_type, reference_free, dpop_penalty_weight)
        if disable_dropout:
            _disable_dropout(policy)
        self.policy_model = policy
        self.ref_model: Optional[DecoderLMModel] = None
        if not reference_free:
            self.ref_model = copy.deepcopy(policy).requires_grad_(False).eval()
        self.metrics: dict[str, MeanMetric] = {}
        if compute_eval_metrics:
            names = ([] if reference_free else ["rewards_chosen", "rewards_rejected", "rewards_accuracies",
                                                "rewards_margins"]) + ["logps_rejected", "logps_chosen"]
            self.metrics = {name: MeanMetric(f"eval/{name}") for name in names}

    def train(self, mode: bool = True) -> DPOModel:
        """The policy follows ``mode``; the reference stays in eval mode (a fixed reference, no dropout)."""
        super().train(mode)
        if self.ref_model is not None:
            self.ref_model.eval()
        return self

    def forward(self, batch: dict) -> torch.Tensor:
        b, s = batch["chosen_input_ids"].shape
        # chosen and rejected interleaved into one batch of 2b rows (c0, r0, c1, r1, ...), as the vendor stacks them
        rows = {key: torch.stack([batch[f"chosen_{key}"], batch[f"rejected_{key}"]], dim=1).view(2 * b, s)
                for key in ("input_ids", "attention_mask", "labels")}
        average = self.loss_type == "ipo"
        args = (rows["input_ids"], rows["labels"], rows["attention_mask"], average)
        policy = sequence_logps(self.policy_model, *args).view(b, 2)
        policy_chosen, policy_rejected = policy[:, 0:1], policy[:, 1:2]
        ref_chosen = ref_rejected = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref = sequence_logps(self.ref_model, *args).view(b, 2)
            ref_chosen, ref_rejected = ref[:, 0:1], ref[:, 1:2]
        loss = self.loss_fn(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
        values = {"logps_chosen": policy_chosen.detach(), "logps_rejected": policy_rejected.detach()}
        if self.ref_model is not None:
            chosen_rewards = self.beta * (policy_chosen - ref_chosen).detach()
            rejected_rewards = self.beta * (policy_rejected - ref_rejected).detach()
            values.update(rewards_chosen=chosen_rewards, rewards_rejected=rejected_rewards,
                          rewards_accuracies=(chosen_rewards > rejected_rewards).float(),
                          rewards_margins=chosen_rewards - rejected_rewards)
        self._report({name: value.mean() for name, value in values.items()})
        return loss

    def _report(self, means: dict[str, torch.Tensor]) -> None:
        """Training: the vendor's summaries of the step; evaluation: its eval metrics."""
        if self.training:
            for name, train_name in _TRAIN_SUMMARIES.items():
                if name in means:
                    summarize_scalar(train_name, means[name])
        else:
            for name, metric in self.metrics.items():
                metric(means[name].clone())


_TRAIN_SUMMARIES = {"rewards_chosen": "chosen_rewards", "rewards_rejected": "rejected_rewards",
                    "rewards_accuracies": "reward_accuracies", "rewards_margins": "reward_margins",
                    "logps_rejected": "policy_rejected_logps", "logps_chosen": "policy_chosen_logps"}
"""The eval metrics' names and the train summaries' names (the vendor's summarize_scalar calls) of each mean."""


def build_model(policy_model: dict, dpo: dict, compute_eval_metrics: bool = True) -> DPOModel:
    """Model function of ``model.name: dpo``: ``policy_model`` is the decoder family's own ``model`` section,
    ``dpo`` the DPO parameters (:func:`dpo_parameters`; required, as the vendor's, ``{}`` takes the defaults).
    Raises ValueError naming the key."""
    check_function_keys(dpo_parameters, dpo, "model.dpo", set(), lambda key: "")
    settings = dpo_parameters(**dpo)
    return DPOModel(_build_policy(policy_model), compute_eval_metrics=compute_eval_metrics, **settings)

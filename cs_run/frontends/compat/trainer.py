"""``cerebras.modelzoo.trainer`` (2.x): the Trainer, as cs-run implements it."""

from cs_run.frontends.trainer import Trainer, trainers_from_config

__all__ = ["Trainer", "trainers_from_config"]

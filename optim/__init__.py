"""Cerebras-compliant optimizers and closed-form LR schedulers (``cs_run.optim``, docs/architecture.md#layers).

Every optimizer creates its whole state in ``preinitialize()`` and keeps ``param_group['lr']`` as a
tensor; every scheduler computes the lr as a tensor function of its step. Build them from params with
:func:`configure_optimizer` and :func:`configure_lr_scheduler`.
"""

from . import lr_scheduler as lr_scheduler
from . import scheduler as scheduler
from . import weight_decay_scheduler as weight_decay_scheduler
from .adadelta import Adadelta as Adadelta
from .adafactor import Adafactor as Adafactor
from .adagrad import Adagrad as Adagrad
from .adam import Adam as Adam
from .adam import AdamW as AdamW
from .adamax import Adamax as Adamax
from .asgd import ASGD as ASGD
from .factory import OptimizerBlock as OptimizerBlock
from .factory import configure_from_params as configure_from_params
from .factory import configure_lr_scheduler as configure_lr_scheduler
from .factory import configure_optimizer as configure_optimizer
from .factory import configure_schedulers as configure_schedulers
from .factory import split_optimizer_block as split_optimizer_block
from .lamb import Lamb as Lamb
from .lion import Lion as Lion
from .muon import Muon as Muon
from .nadam import NAdam as NAdam
from .optimizer import Optimizer as Optimizer
from .parallel_schedulers import ParallelSchedulers as ParallelSchedulers
from .param_groups import configure_param_groups as configure_param_groups
from .param_groups import lr_adjustment_scales as lr_adjustment_scales
from .radam import RAdam as RAdam
from .rmsprop import RMSprop as RMSprop
from .rprop import Rprop as Rprop
from .sgd import SGD as SGD

__all__ = [
    "ASGD",
    "SGD",
    "Adadelta",
    "Adafactor",
    "Adagrad",
    "Adam",
    "AdamW",
    "Adamax",
    "Lamb",
    "Lion",
    "Muon",
    "NAdam",
    "Optimizer",
    "ParallelSchedulers",
    "RAdam",
    "RMSprop",
    "Rprop",
    "OptimizerBlock",
    "configure_from_params",
    "configure_lr_scheduler",
    "split_optimizer_block",
    "configure_optimizer",
    "configure_schedulers",
    "configure_param_groups",
    "lr_adjustment_scales",
    "lr_scheduler",
    "scheduler",
    "weight_decay_scheduler",
]

"""How the params ask the replicas to hold the model: ``runconfig.sharding`` and ``runconfig.offload``, their
choices spelled once here (the params' and the flags' choices read them), checked once by :func:`resolve_layout`
when a run is resolved and carried as a :class:`Layout`, from which :func:`cs_run.parallel.build_strategy` builds
the run's :class:`~cs_run.parallel.Strategy` (docs/architecture.md#parallelism).

Torch-free, so ``cs_run.params`` and ``cs-run --help`` can read the choices without importing torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cs_run.errors import ParamsError

__all__ = ["CLI_WORDS", "DATA_PARALLEL", "Layout", "Offload", "Sharding", "Words", "resolve_layout"]


class Sharding(enum.StrEnum):
    """The values of ``runconfig.sharding`` (the ``--sharding`` flag, the Trainer's ``sharding=``)."""

    NONE = "none"
    """Data parallel: every replica holds the whole model and optimizer state."""
    FSDP = "fsdp"
    """torch FSDP2: parameters, gradients and optimizer state sharded 1/N per replica (CPU and GPU)."""


class Offload(enum.StrEnum):
    """The values of ``runconfig.offload`` (the ``--offload`` flag, the Trainer's ``offload=``)."""

    NONE = "none"
    CPU = "cpu"
    """The (sharded) state lives in host memory; each block is copied to the device for its compute."""


@dataclass(frozen=True)
class Words:
    """How a front door names the keys and the device in the one check's messages: the params' and flags'
    (:data:`CLI_WORDS`) or the Trainer's arguments."""

    head: str = ""
    """Put before every message (the Trainer's ``Trainer: ``)."""
    key: str = "runconfig."
    """Put before ``sharding`` / ``offload`` where a message names the key."""
    device: str = "--device"
    """How the device is set."""
    set_fsdp: str = " (--sharding fsdp)"
    """The flag that sets sharding fsdp, said after the key's advice (empty where there is none)."""


CLI_WORDS = Words()


@dataclass(frozen=True)
class Layout:
    """A run's sharding and offload, checked (:func:`resolve_layout`): what the strategy is built from and
    what the runners ask (memory estimate, sparsity) instead of the runconfig strings."""

    sharding: Sharding = Sharding.NONE
    offload: Offload = Offload.NONE

    @property
    def sharded(self) -> bool:
        """Whether FSDP2 holds the model: sharding fsdp, or offload (which runs through FSDP2, also alone)."""
        return self.sharding is Sharding.FSDP or self.offload is not Offload.NONE


DATA_PARALLEL = Layout()
"""sharding none, offload none: every replica holds the whole model (the default)."""


def _parse(kind: type[enum.StrEnum], value: object, key: str, words: Words) -> enum.StrEnum:
    try:
        return kind(value)
    except ValueError:
        raise ParamsError(f"{words.head}{words.key}{key}: {value!r} is not one of {', '.join(kind)}") from None


def resolve_layout(sharding: object, offload: object, num_replicas: int, device: str,
                   words: Words = CLI_WORDS) -> Layout:
    """The run's :class:`Layout`, refusing the combinations that do not work before anything is built;
    ``words`` says how the caller names the keys and the device in the message.

    Raises:
        ParamsError: an unknown value; sharding or offload on CSX (the engine traces whole-model,
            data-parallel steps only); offload with several data-parallel replicas (each holds the whole
            model on its device, FSDP2's offload needs the sharded form).
    """
    k, dev = words.head + words.key, words.device
    layout = Layout(_parse(Sharding, sharding, "sharding", words), _parse(Offload, offload, "offload", words))
    sharding, offload = layout.sharding, layout.offload
    if device.upper() == "CSX" and layout.sharded:
        key, value = ("sharding", sharding) if sharding is not Sharding.NONE else ("offload", offload)
        raise ParamsError(f"{k}{key}: {value} with {dev} CSX: the CSX engine traces data-parallel steps only "
                          f"(sharding: fsdp and offload: cpu run on {dev} CPU and GPU; {dev} CSX runs sharding: none); "
                          f"use {dev} CPU or GPU, or sharding: none and offload: none")
    if offload is not Offload.NONE and sharding is Sharding.NONE and num_replicas > 1:
        raise ParamsError(f"{k}offload: {offload} with {num_replicas} data-parallel replicas (sharding: none): "
                          f"offload keeps FSDP2's sharded state in host memory; set {words.key}sharding: fsdp{words.set_fsdp} "
                          "or num_csx: 1")
    return layout

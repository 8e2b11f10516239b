"""The custom training loop of the cstorch docs (the vendor's custom training loop guide) on fc_mnist, runnable on CPU, GPU and CSX.

    python -m cs_run.examples.fc_mnist.custom_loop --backend CSX --steps 300 --model_dir model_dir/loop
    python -m cs_run.examples.fc_mnist.custom_loop --num_csx 2     # 2 data-parallel replicas (CPU)

Configure a backend, compile the model, use a compliant optimizer, wrap a DataLoader factory, trace
the training step, read the loss in a step closure and save weights in a checkpoint closure.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Optional

import torch

import cs_run as cstorch
from cs_run.data.processors.mnist import build_dataloader
from cs_run.models.fc_mnist.model import MNIST

logger = logging.getLogger(__name__)


def input_fn(batch_size: int = 64) -> torch.utils.data.DataLoader:
    """Each streaming worker calls this to build its own loader."""
    return build_dataloader("train", batch_size=batch_size, shuffle=True)


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="CPU", type=str.upper, choices=("CPU", "GPU", "CSX"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--checkpoint_steps", type=int, default=100)
    parser.add_argument("--model_dir", default="model_dir/custom_loop")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--num_csx", type=int, default=1, help="data-parallel replicas (one process each)")
    args = parser.parse_args(argv)

    backend = cstorch.backend(args.backend, artifact_dir=args.model_dir,
                              cluster_config=cstorch.distributed.ClusterConfig(num_csx=args.num_csx))
    cstorch.manual_seed(args.seed)
    model = MNIST(depth=2, hidden_size=128, dropout=0.0, activation_fn="relu")
    compiled_model = cstorch.compile(model, backend)  # with num_csx > 1: the replicas start here
    optimizer = cstorch.optim.SGD(compiled_model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()  # MNIST returns logits: NLL of their log-softmax
    dataloader = cstorch.utils.data.DataLoader(input_fn, batch_size=64)

    @cstorch.trace
    def training_step(inputs, targets):
        loss = loss_fn(compiled_model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    losses: list[float] = []

    @cstorch.step_closure
    def record_loss(loss, step):
        losses.append(loss.item())
        if step % 50 == 0:
            logger.info("step %d, loss %.5f", step, losses[-1])

    @cstorch.checkpoint_closure
    def save_checkpoint(step):
        os.makedirs(args.model_dir, exist_ok=True)
        cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "global_step": step},
                     os.path.join(args.model_dir, f"checkpoint_{step}.mdl"))

    executor = cstorch.utils.data.DataExecutor(dataloader, num_steps=args.steps,
                                               checkpoint_steps=args.checkpoint_steps)
    for step, (inputs, targets) in enumerate(executor, start=1):
        loss = training_step(inputs, targets)
        record_loss(loss, step)
        save_checkpoint(step)
    return {"losses": losses, "model": model}


if __name__ == "__main__":  # pragma: no cover
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s: %(message)s")
    main()

"""fc_mnist: the Model Zoo's fully connected MNIST classifier, trainable offline on bundled digits."""

from cs_run.registry import register_model

register_model("fc_mnist", "cs_run.models.fc_mnist.model:build_model", "cs_run.models.fc_mnist.data:build_dataloader")

"""fc_mnist: the Model Zoo's fully connected MNIST classifier, trainable offline on bundled digits."""

from cs_run.registry import register_model

# its data: the Model Zoo's MNISTDataProcessor (cs_run.data.processors.mnist), named as the model's one data
# function (not as data_processors): an input's data_processor key stays recorded with no effect, as before
register_model("fc_mnist", "cs_run.models.fc_mnist.model:build_model", "MNISTDataProcessor")

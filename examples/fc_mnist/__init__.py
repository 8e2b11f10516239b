"""fc_mnist: the Model Zoo's fully connected MNIST classifier, trainable offline on bundled digits."""

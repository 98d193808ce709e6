EXTRA_DIST += examples/fashion_mnist_mlp.ini

"""dpf-ssa-mnist: an MNIST CNN trained with top-k uploads through two-server secure aggregation."""

"""secagg-mnist: a Flower app training an MNIST CNN with Bonawitz secure aggregation."""

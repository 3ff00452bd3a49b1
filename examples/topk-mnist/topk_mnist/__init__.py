"""topk-mnist: a Flower app training an MNIST CNN with top-k submodel updates."""

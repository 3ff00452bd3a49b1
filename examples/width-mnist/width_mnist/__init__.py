"""width-mnist: heterogeneous clients (FedRolex, HeteroFL, random, SESA) in a Flower app."""

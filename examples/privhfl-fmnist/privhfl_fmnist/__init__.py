"""privhfl-fmnist: PrivHFL (heterogeneous models learning through queries) in a Flower app."""

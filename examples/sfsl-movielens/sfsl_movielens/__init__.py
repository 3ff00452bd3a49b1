"""sfsl-movielens: FedAvg, FedSubAvg, Niu et al.'s SFSL (5 CPPs), SSA/PSR and SecAgg compared."""

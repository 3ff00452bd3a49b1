"""flwr_fsl: private federated submodel learning for Flower.

Clients train and upload only part of a large model (their top-k weight changes, the embedding
rows their data touches, a narrower copy of the network); the strategies and client mods here
aggregate such partial updates correctly (count-weighted) and, in the secure protocols, without
the servers learning which part a client used.
"""

__version__ = "0.1.0"

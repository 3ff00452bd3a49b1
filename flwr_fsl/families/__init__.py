"""One folder per protocol family: its messages, Flower-free protocol, strategy and client mod.

Each family's ``protocol.py`` (and the other Flower-free modules beside it) runs with any number of
parties in one process; ``strategy.py`` (server) and ``mod.py`` (client) are the thin Flower ends,
and both read the family's record keys and messages from its Flower-free modules or its
``records.py``, never from each other. Users import the strategies and mods from
:mod:`flwr_fsl.strategies` and :mod:`flwr_fsl.mods`.
"""

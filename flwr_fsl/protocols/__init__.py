"""Protocols as pure numpy code (no Flower import): testable with any number of parties."""

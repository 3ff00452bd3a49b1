"""Tests of the width family (FedRolex / HeteroFL / random)."""

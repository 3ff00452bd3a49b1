"""Tests of the example apps and notebooks (examples/), with real Flower processes."""

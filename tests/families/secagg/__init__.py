"""Tests of the SecAgg family."""

"""Tests of the SESA family."""

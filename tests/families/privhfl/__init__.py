"""Tests of the PrivHFL family."""

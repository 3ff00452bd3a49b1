"""Tests of the research reproductions."""

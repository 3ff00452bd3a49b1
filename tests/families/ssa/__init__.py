"""Tests of the two-server SSA / PSR family."""

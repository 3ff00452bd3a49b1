"""Tests of the SFSL family (Niu et al.)."""

"""Tests of the plaintext top-k family."""

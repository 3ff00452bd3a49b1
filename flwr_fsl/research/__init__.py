"""Reproductions of the papers' attacks and experiments: nothing in the library imports them."""

"""A quickstart app in the shape `flwr new` generates; the README's diffs are applied to it."""

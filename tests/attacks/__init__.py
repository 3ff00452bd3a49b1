"""Attack tests: a curious party drives the real protocol and tries to learn what it must not."""

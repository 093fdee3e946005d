"""Hypothesis without deadlines: these machines are shared and noisy (speed lives in benchmarks)."""

from hypothesis import settings

settings.register_profile("vrammath", deadline=None, max_examples=60)
settings.load_profile("vrammath")

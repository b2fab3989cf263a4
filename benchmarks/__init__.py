"""Benchmarks of langchain-starcoder on checkpoints built offline: ``python -m benchmarks``.

Each comparison runs its variants interleaved (A, B, A, B, ...) in one run and reports medians,
their spread and the ratio of the medians, as a markdown table and as JSON. See ``RESULTS.md``.
Importing this package imports nothing heavy (no MLX): a benchmark child process must be able
to load an optimized BLAS first.
"""

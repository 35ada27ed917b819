"""Datasets: ``launcher data prepare`` (inputs, tokenizers, shards) and the launch-time checks of ``data.path``.

Composition calls its checks.

Imports: core, errors.
"""

"""Datasets: ``launcher data prepare`` (inputs, tokenizers, shards) and the launch-time checks of ``data.path``.

Imports core/ and errors only; composition calls its checks.
"""

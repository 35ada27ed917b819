"""The training side: what runs on every GPU of a job (see docs/design-contract.md).

Imports: core.
"""

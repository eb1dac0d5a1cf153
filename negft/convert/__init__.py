"""Converters from released dataset files to negft's shards: one module per released format.

Each module reads its format exactly as released (the repository and file its layout was taken from is
recorded in the output's ``manifest.json``), writes shards with ``negft.data.shards.ShardWriter``, and
counts every row it skips by reason; it also writes a small example of its format with world images,
which the tests and benches convert.
"""

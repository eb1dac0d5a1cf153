"""Converters from released dataset files to negft's shards: one module per released format.

Each module reads its format exactly as released (the repository and file its layout was taken from is
recorded in the output's ``manifest.json``), writes shards with ``negft.data.shards.ShardWriter``, and
counts every row it skips by reason. The small examples of each format that the tests and benches convert
(world images in the released layout, bad rows planted) are written by ``negft.world.formats`` (``coco``,
``img2dataset``, ``negbench_csv``, ``visual_genome``): the world may import the converters, never the reverse.
"""

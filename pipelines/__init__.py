"""Runnable pipelines built on `keras_attention`: train, compare, variance, export.

Floor 3 of the house. Here live the settings (`settings`: declaration,
task defaults, resolving, checks; `flags`, from them), what a training run is
built from (`devices`, `builders`, `steps`), what it writes (`run_dir`,
`tensorboard`), the pipelines themselves (`train`, `export`, `variance`,
`compare`) and what they share (`common`). These modules may import
`keras_attention` and each other (without a cycle), never `pipelines.cli`
or `pipelines.__main__` (floor 4, the command line), which import them.
"""

"""Runnable pipelines built on `keras_attention` (floor 3): the settings,
what a training run is built from and writes, the pipelines (`train`,
`compare`, `sweep`, `variance`, `export`) and what they share. None imports
`pipelines.cli` or `pipelines.__main__` (floor 4, the command line).
"""

"""Runnable pipelines built on `keras_attention`: train, compare, variance, export."""

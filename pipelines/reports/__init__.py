"""The toolkit under the `compare` and `sweep` reports: numbers over seeds
(`numbers`), the one plotting style (`plotting`), the self-contained HTML
page (`page`) and the probe diagnostics of a run's weights (`probes`). It
knows no claim, sweep or grid."""

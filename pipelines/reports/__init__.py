"""The toolkit under the `compare` and `sweep` reports.

    numbers    mean ± sd over seeds (the one sd convention) and the one way
               a number, a missing value and steps to target are written
    plotting   the one plotting style, one line (± band) per arm over an
               axis (`series_panel`), figures saved as PNG and SVG
    page       a report's self-contained HTML page from its Markdown
    probes     the probe diagnostics of a run's initial or trained weights

Nothing here knows a claim, a sweep or a grid; the reports import it, it
imports neither.
"""

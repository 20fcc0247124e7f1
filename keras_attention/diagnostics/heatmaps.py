"""Attention weights as images: colour mapping and heat-map tiles (their
PNG bytes come from the event writer's `keras_attention.events.encode_png`).
"""

import math

import matplotlib
import numpy as np

from keras_attention.validation import check_int

# Matplotlib's perceptually uniform map (dark purple -> blue -> teal ->
# green -> yellow, lightness increasing throughout), so heat maps stay
# readable in greyscale and for colour-blind readers.
COLORMAP = "viridis"
_COLORMAP = matplotlib.colormaps[COLORMAP]


def colorize(values, vmin=0.0, vmax=1.0):
    """Maps values to RGB colours of matplotlib's `"viridis"` colour map.

    The map runs from dark purple (`vmin`) through blue, teal and green to
    yellow (`vmax`) with monotonically increasing lightness.

    Args:
        values: array of any shape.
        vmin: value mapped to the darkest colour; smaller values are clipped.
        vmax: value mapped to the lightest colour; larger values are clipped.

    Returns:
        uint8 array of shape `values.shape + (3,)`. NaN maps like `vmin`.

    Raises:
        ValueError: unless `vmin < vmax`, both finite.

    Example:

    >>> colorize(np.array([0.0, 1.0]))
    array([[ 68,   1,  84],
           [253, 231,  36]], dtype=uint8)
    """
    if not (math.isfinite(vmin) and math.isfinite(vmax) and vmin < vmax):
        raise ValueError(
            f"`vmin` and `vmax` must be finite with vmin < vmax; received "
            f"vmin={vmin!r}, vmax={vmax!r}."
        )
    values = np.asarray(values, dtype=np.float64)
    unit = np.clip(np.nan_to_num((values - vmin) / (vmax - vmin)), 0.0, 1.0)
    # Flattened, because a colormap called on a scalar returns a tuple.
    rgba = _COLORMAP(unit.ravel(), bytes=True)
    return rgba[:, :3].reshape(unit.shape + (3,))


def attention_heatmaps(weights, num_examples=3, cell_pixels=8):
    """Renders attention weights as one RGB image per (example, head).

    Layout: image `e * H + h` shows example `e`, head `h` (example-major).
    Query positions run top to bottom and key positions left to right; each
    weight is a `cell_pixels` square coloured by `colorize` on the fixed
    range [0, 1], so images from different steps and heads are comparable.

    Args:
        weights: attention probabilities `(B, H, T, S)`.
        num_examples: number of leading examples to render (fewer if
            `B < num_examples`).
        cell_pixels: side of each cell in pixels.

    Returns:
        uint8 array `(min(B, num_examples) * H, T * cell_pixels,
        S * cell_pixels, 3)`.

    Example:

    >>> attention_heatmaps(np.full((2, 4, 3, 5), 0.2), cell_pixels=2).shape
    (8, 6, 10, 3)
    """
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 4:
        raise ValueError(
            f"`weights` must have shape (B, H, T, S); received shape "
            f"{weights.shape}."
        )
    num_examples = check_int(num_examples, "num_examples")
    cell_pixels = check_int(cell_pixels, "cell_pixels")
    queries, keys = weights.shape[2:]
    cells = colorize(weights[:num_examples].reshape(-1, queries, keys))
    # Colour first, enlarge after: repeating uint8 pixels is far cheaper
    # than colouring every pixel.
    return np.repeat(np.repeat(cells, cell_pixels, axis=1), cell_pixels,
                     axis=2)

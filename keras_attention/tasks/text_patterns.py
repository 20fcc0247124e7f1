"""Where a character-level model's attention would look, by pattern.

For a window of text `chars` (one string, position `i` the query that
predicts `chars[i + 1]`), `pattern_cells(chars)` gives, for each pattern,
the queries it applies to and the key positions it points at:

- `previous_character`: query `i` -> key `i - 1`;
- `line_start`: query `i` -> the first character of its line, when that
  line started inside the window at least two characters back;
- `newline`: query `i` -> the line break that ended the previous line, at
  least two characters back;
- `bracket`: the query before a closing `)`, `]` or `}` -> its opening
  bracket (matched with a stack over the window; a mismatch empties the
  stack), when that is at least two characters back;
- `quote`: the query before a closing `'` or `"` -> the opening quote on
  the same line (triple quotes and escaped quotes are skipped), at least
  two characters back;
- `copy`: a query whose last three characters are identifier characters
  (letters, digits, `_`) -> every key just after an earlier occurrence of
  those three characters (what came next last time), at least two back.

"At least two back" keeps the patterns apart from the query itself and
its previous character, which every other pattern would otherwise share.
`pattern_scores` measures a head by the mean weight it puts on a
pattern's keys over the pattern's queries, beside the same mean for
uniform causal attention (the chance level, `keys / (i + 1)`).
"""

import numpy as np

PATTERNS = ("previous_character", "line_start", "newline", "bracket",
            "quote", "copy")
CLOSING = {")": "(", "]": "[", "}": "{"}
QUOTES = ("'", '"')
# The smallest distance back of every pattern but `previous_character`.
_MIN_BACK = 2
_CONTEXT = 3


def _identifier(char):
    return char.isalnum() or char == "_"


def _previous(chars):
    return [(i, [i - 1]) for i in range(1, len(chars))]


def _line_starts(chars):
    cells, start = [], None
    for i, char in enumerate(chars):
        if i > 0 and chars[i - 1] == "\n":
            start = i
        if start is not None and start <= i - _MIN_BACK:
            cells.append((i, [start]))
    return cells


def _newlines(chars):
    cells, newline = [], None
    for i, char in enumerate(chars):
        if newline is not None and newline <= i - _MIN_BACK:
            cells.append((i, [newline]))
        if char == "\n":
            newline = i
    return cells


def _brackets(chars):
    cells, stack = [], []
    for k, char in enumerate(chars):
        if char in CLOSING.values():
            stack.append((char, k))
        elif char in CLOSING:
            if stack and stack[-1][0] == CLOSING[char]:
                _, opening = stack.pop()
                if opening <= k - 1 - _MIN_BACK:
                    cells.append((k - 1, [opening]))
            else:
                stack = []
    return cells


def _quotes(chars):
    cells, opening, k = [], None, 0
    while k < len(chars):
        char = chars[k]
        if char == "\n":
            opening = None
        elif char in QUOTES and chars[k:k + 3] == char * 3:
            opening, k = None, k + 3
            continue
        elif char in QUOTES and (k == 0 or chars[k - 1] != "\\"):
            if opening is None:
                opening = k
            elif chars[opening] == char:
                if opening <= k - 1 - _MIN_BACK:
                    cells.append((k - 1, [opening]))
                opening = None
        k += 1
    return cells


def _copies(chars):
    cells, seen = [], {}
    for i in range(_CONTEXT - 1, len(chars)):
        context = chars[i - _CONTEXT + 1:i + 1]
        if not all(map(_identifier, context)):
            continue
        keys = [j + 1 for j in seen.get(context, ()) if j + 1 <= i - _MIN_BACK]
        if keys:
            cells.append((i, keys))
        seen.setdefault(context, []).append(i)
    return cells


_FINDERS = {
    "previous_character": _previous,
    "line_start": _line_starts,
    "newline": _newlines,
    "bracket": _brackets,
    "quote": _quotes,
    "copy": _copies,
}


def pattern_cells(chars):
    """`{pattern: [(query, [keys])]}` of one window of text (see the
    module's patterns), queries in increasing order."""
    if not isinstance(chars, str):
        raise ValueError(
            f"`chars` must be a string; received {type(chars).__name__}."
        )
    return {name: _FINDERS[name](chars) for name in PATTERNS}


def flatten_cells(cells_per_example):
    """The cells of a pattern over a batch as index arrays: `(example,
    query, key, group)`, `group` numbering the `(example, query)` pairs."""
    examples, queries, keys, groups = [], [], [], []
    group = 0
    for example, cells in enumerate(cells_per_example):
        for query, query_keys in cells:
            for key in query_keys:
                examples.append(example)
                queries.append(query)
                keys.append(key)
                groups.append(group)
            group += 1
    return tuple(np.asarray(values, np.int64)
                 for values in (examples, queries, keys, groups))


def pattern_scores(weights, cells):
    """Per head, the mean weight on a pattern's keys over its queries.

    Args:
        weights: attention weights `(examples, heads, T, S)`.
        cells: `flatten_cells` of the pattern over the same examples.

    Returns:
        `(scores, chance)`: float64 `(heads,)` mean summed weight on the
        keys of each query, and that mean under uniform causal attention;
        `(None, None)` when the pattern has no query.
    """
    weights = np.asarray(weights)
    examples, queries, keys, groups = cells
    if len(groups) == 0:
        return None, None
    count = int(groups[-1]) + 1
    # (cells, heads), cast after the gather: the maps can be large.
    picked = weights[examples, :, queries, keys].astype(np.float64)
    per_query = np.zeros((count, weights.shape[1]))
    np.add.at(per_query, groups, picked)
    # Uniform causal attention puts 1 / (query + 1) on each key.
    query_of_group = np.zeros(count)
    query_of_group[groups] = queries
    chance = np.bincount(groups, minlength=count) / (query_of_group + 1.0)
    return per_query.mean(axis=0), float(chance.mean())

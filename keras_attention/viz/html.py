"""Attention maps as one self-contained, interactive HTML page.

`attention_html(weights, labels)` returns an `AttentionHTML`: a `str` that
holds a whole HTML document, which Jupyter shows inline (`_repr_html_`) and
`.save(path)` writes. Everything is inline (style, script, data, colours):
no CDN, no font or script fetched, no `http(s)` reference, so it works
offline and in a file sent by mail. Each head is drawn on a canvas, the
labels are HTML text, hovering a cell shows its query label, key label and
weight, and a check box per head shows or hides it.
"""

import hashlib
import html
import itertools
import json
import math

import matplotlib
import numpy as np

from keras_attention.diagnostics.drawing import prepare_maps
from keras_attention.files import atomic_path

# A map is drawn at most this many CSS pixels a side; cells are whole pixels
# between 1 and MAX_CELL (an 18-pixel cell fits an 11 px label beside it).
MAX_SIDE = 480
MAX_CELL = 18
# Labels closer than this many pixels overlap at 11 px: beyond that only
# every k-th is written.
LABEL_SPACING = 12
# Weights are embedded with 4 decimals, the precision the tooltip shows.
DIGITS = 4
_ids = itertools.count()

_STYLE = """
.ka-attention{font:12px system-ui,sans-serif;color:#222}
.ka-attention .ka-title{font-weight:600;margin:4px 0}
.ka-attention .ka-toggles label{margin-right:10px;cursor:pointer}
.ka-attention .ka-heads{display:flex;flex-wrap:wrap;gap:18px;
  align-items:flex-start}
.ka-attention figure{margin:0}
.ka-attention figcaption{text-align:center;margin-bottom:2px}
.ka-attention .ka-map{position:relative}
.ka-attention canvas{position:absolute;image-rendering:pixelated;
  cursor:crosshair}
.ka-attention .ka-q,.ka-attention .ka-k{position:absolute;font-size:11px;
  line-height:12px;white-space:nowrap}
.ka-attention .ka-q{text-align:right;transform:translateY(-6px)}
.ka-attention .ka-k{transform-origin:0 0;
  transform:rotate(90deg) translateY(-6px)}
.ka-attention .ka-bar{display:flex;align-items:center;gap:6px;margin-top:6px}
.ka-attention .ka-gradient{width:200px;height:12px;border:1px solid #999}
.ka-attention .ka-tooltip{position:fixed;display:none;pointer-events:none;
  background:#fff;border:1px solid #666;padding:2px 5px;z-index:10;
  white-space:nowrap}
"""

# Reads the data block, draws each head's canvas, wires hover and toggles.
_SCRIPT = """
(function(){
var root=document.currentScript?document.currentScript.parentElement
  :document.getElementById(%(id)s);
var data=JSON.parse(root.querySelector("script.ka-data").textContent);
var tip=root.querySelector(".ka-tooltip");
function colour(w){
  var u=Math.min(1,Math.max(0,w/data.vmax));
  return data.lut[Math.round(u*255)];
}
root.querySelectorAll("canvas").forEach(function(canvas){
  var index=+canvas.dataset.index,map=data.maps[index];
  var ctx=canvas.getContext("2d");
  var rows=map.length,cols=map[0].length;
  canvas.width=cols;canvas.height=rows;
  for(var i=0;i<rows;i++){
    for(var j=0;j<cols;j++){
      ctx.fillStyle=colour(map[i][j]);ctx.fillRect(j,i,1,1);
    }
  }
  canvas.addEventListener("mousemove",function(e){
    var r=canvas.getBoundingClientRect();
    var j=Math.min(cols-1,Math.floor((e.clientX-r.left)/r.width*cols));
    var i=Math.min(rows-1,Math.floor((e.clientY-r.top)/r.height*rows));
    if(i<0||j<0){return;}
    tip.textContent="query "+data.query[i]+" \\u00b7 key "+data.key[j]
      +" \\u00b7 weight "+map[i][j].toFixed(%(digits)d);
    tip.dataset.head=data.heads[index];tip.dataset.query=i;tip.dataset.key=j;
    tip.style.left=(e.clientX+14)+"px";tip.style.top=(e.clientY+14)+"px";
    tip.style.display="block";
  });
  canvas.addEventListener("mouseleave",function(){tip.style.display="none";});
});
root.querySelectorAll(".ka-toggles input").forEach(function(box){
  box.addEventListener("change",function(){
    var figure=root.querySelector(
      "figure[data-head='"+box.dataset.head+"']");
    figure.style.display=box.checked?"":"none";
  });
});
})();
"""


class AttentionHTML(str):
    """A self-contained HTML document of attention maps (a `str`).

    Attributes:
        fragment: the embeddable part (a `<div>` with its style and script),
            what Jupyter shows inline.
    """

    def __new__(cls, document, fragment):
        page = super().__new__(cls, document)
        page.fragment = fragment
        return page

    def _repr_html_(self):
        return self.fragment

    def save(self, path):
        """Writes the document to `path` (UTF-8), atomically: an interrupted
        save leaves no half-written file. Returns `path`."""
        with atomic_path(str(path)) as temporary:
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.write(str(self))
        return path


def _colour_table(cmap):
    rgba = matplotlib.colormaps[cmap](np.linspace(0.0, 1.0, 256))
    return ["#%02x%02x%02x" % tuple(int(round(255 * c)) for c in row[:3])
            for row in rgba]


def _gradient(lut):
    stops = ",".join(lut[i] for i in range(0, 256, 32)) + "," + lut[255]
    return f"linear-gradient(to right,{stops})"


def _json_block(value):
    """JSON that cannot end its `<script>` element early."""
    return json.dumps(value, separators=(",", ":")).replace("<", "\\u003c")


def _axis_html(labels, cell, kind, offset):
    """Absolutely placed label elements, every k-th when cells are small."""
    stride = max(1, math.ceil(LABEL_SPACING / cell))
    parts = []
    for index in range(0, len(labels), stride):
        centre = index * cell + cell / 2
        position = (f"right:calc(100% - {offset - 4}px);top:{centre:g}px"
                    if kind == "q" else
                    f"left:{offset + centre:g}px;top:calc(100% - {offset}px)")
        parts.append(f'<div class="ka-{kind}" style="{position}">'
                     f"{html.escape(labels[index])}</div>")
    return "".join(parts)


def _head_html(index, head, queries, keys, cell, margin, query_labels,
               key_labels):
    width, height = keys * cell, queries * cell
    # The left margin holds the query labels, the bottom one the key labels.
    box = f"width:{margin + width}px;height:{height + margin}px"
    return (
        f'<figure data-head="{head}"><figcaption>head {head}</figcaption>'
        f'<div class="ka-map" style="{box}">'
        f"{_axis_html(query_labels, cell, 'q', margin)}"
        f'<canvas data-index="{index}" aria-label="head {head}" '
        f'style="left:{margin}px;top:0;width:{width}px;height:{height}px">'
        f"</canvas>{_axis_html(key_labels, cell, 'k', margin)}</div>"
        "</figure>"
    )


def attention_html(weights, query_labels=None, key_labels=None, heads=None,
                   vmax=None, title=None, cmap="viridis"):
    """Interactive attention maps as a self-contained HTML document.

    One canvas per head, query labels down the side and key labels along
    the bottom (thinned when cells are small), one shared colour scale with
    its bar, a tooltip with the query label, key label and weight of the
    cell under the pointer, and a check box per head to hide or show it.
    Weights are embedded to 4 decimals.

    Args:
        weights: attention weights of one example: `(T, S)`, `(heads, T, S)`
            or `(1, heads, T, S)`, finite.
        query_labels: `T` labels (e.g. `task.token_labels(tokens[0])`);
            `None` numbers the positions.
        key_labels: `S` labels; by default the query labels.
        heads: the heads to include: `None` (all), an index or a sequence.
        vmax: the top of the colour scale (bottom 0); default the largest
            weight included.
        title: a heading above the maps.
        cmap: a matplotlib colour map name (its colours are embedded).

    Returns:
        An `AttentionHTML`: the document as a `str`, shown inline by Jupyter,
        written by `.save(path)`.

    Raises:
        ValueError: naming the argument, for weights of another shape or
            with NaN/inf, labels of the wrong length, unknown heads or a bad
            `vmax`.

    Example:

    ```python
    page = attention_html(weights[0], task.token_labels(tokens[0]))
    page              # in a notebook: the interactive maps
    page.save("attention.html")
    ```
    """
    maps, query_labels, key_labels, chosen, top = prepare_maps(
        weights, query_labels, key_labels, heads, vmax)
    queries, keys = maps.shape[1:]
    lut = _colour_table(cmap)
    data = {
        "heads": chosen,
        "maps": np.round(maps[chosen], DIGITS).tolist(),
        "query": query_labels,
        "key": key_labels,
        "vmax": float(top),
        "lut": lut,
    }
    payload = _json_block(data)
    element_id = (f"ka-{hashlib.sha1(payload.encode()).hexdigest()[:10]}"
                  f"-{next(_ids)}")
    cell = max(1, min(MAX_CELL, MAX_SIDE // max(queries, keys)))
    margin = 8 + 7 * max(len(label) for label in query_labels + key_labels)
    heading = (f'<div class="ka-title">{html.escape(title)}</div>'
               if title else "")
    toggles = "".join(
        f'<label><input type="checkbox" checked data-head="{h}"> head {h}'
        "</label>" for h in chosen
    )
    panels = "".join(
        _head_html(i, h, queries, keys, cell, margin, query_labels,
                   key_labels)
        for i, h in enumerate(chosen)
    )
    fragment = (
        f'<div class="ka-attention" id="{element_id}">'
        f"<style>{_STYLE}</style>{heading}"
        f'<div class="ka-toggles">{toggles}</div>'
        f'<div class="ka-heads">{panels}</div>'
        f'<div class="ka-bar"><span>0</span><div class="ka-gradient" '
        f'style="background:{_gradient(lut)}"></div>'
        f"<span>{top:.3g}</span><span>attention weight</span></div>"
        '<div class="ka-tooltip" role="tooltip"></div>'
        f'<script type="application/json" class="ka-data">{payload}</script>'
        f"<script>{_SCRIPT % {'id': json.dumps(element_id), 'digits': DIGITS}}"
        "</script></div>"
    )
    document = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title or 'Attention')}</title></head>"
        f"<body>{fragment}</body></html>\n"
    )
    return AttentionHTML(document, fragment)

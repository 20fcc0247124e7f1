"""The Attention dashboard's backend: a `TBPlugin` reading the attention
summaries through TensorBoard's data provider, and its `TBLoader`.

Routes, under `/data/plugin/attention/`:

* the frontend's static files (`index.js`, the modules it imports and
  `style.css`), from the package's `static/` folder;
* `tags`: `{run: {tag: {"layer": name, "steps": [...]}}}`;
* `meta?run=&tag=&step=`: the summary's JSON at that step (labels, target
  cells, statistics, shape, dtype) plus its `"step"`;
* `weights?run=&tag=&step=&example=`: one example's `(H, T, S)` weights as
  the logged little-endian bytes (float16 or uint8), read as one blob of
  that step only.
"""

import importlib.resources
import json

from tensorboard import errors
from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from tensorboard.plugins.core.core_plugin import _parse_samples_per_plugin
from werkzeug import wrappers

from keras_attention.viz.summary import PLUGIN_NAME

# `downsample` of read_blob_sequences: everything the loader kept (it only
# trims what was kept; TensorBoard requires a number).
_ALL = 10**9
_STATIC = importlib.resources.files(__package__).joinpath("static")
_MIMETYPES = {".js": "text/javascript", ".css": "text/css"}
_ITEMSIZE = {"float16": 2, "uint8": 1}


def static_files():
    """`{name: mimetype}` of the frontend's files."""
    return {
        entry.name: _MIMETYPES[suffix]
        for entry in _STATIC.iterdir()
        for suffix in _MIMETYPES
        if entry.name.endswith(suffix)
    }


class AttentionPlugin(base_plugin.TBPlugin):
    """The ATTENTION tab: attention maps of probe examples over the steps.

    Args:
        context: TensorBoard's `TBContext`; only its data provider is used.
    """

    plugin_name = PLUGIN_NAME

    def __init__(self, context):
        self._data = context.data_provider

    def get_plugin_apps(self):
        apps = {f"/{name}": self._static_app(name, mimetype)
                for name, mimetype in static_files().items()}
        apps.update({
            "/tags": self._serve_tags,
            "/meta": self._serve_meta,
            "/weights": self._serve_weights,
        })
        return apps

    def is_active(self):
        # TensorBoard enables the tab when a run holds data of this plugin;
        # nothing else needs checking.
        return False

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(
            es_module_path="/index.js", tab_name="Attention"
        )

    # ------------------------------------------------------------ routes
    def _static_app(self, name, mimetype):
        body = _STATIC.joinpath(name).read_bytes()

        @wrappers.Request.application
        def app(request):
            return http_util.Respond(request, body, mimetype)

        return app

    @wrappers.Request.application
    def _serve_tags(self, request):
        ctx, experiment = _context(request)
        series = self._data.read_blob_sequences(
            ctx, experiment_id=experiment, plugin_name=PLUGIN_NAME,
            downsample=_ALL,
        )
        listing = self._data.list_blob_sequences(
            ctx, experiment_id=experiment, plugin_name=PLUGIN_NAME
        )
        tags = {}
        for run, by_tag in series.items():
            for tag, data in by_tag.items():
                content = listing.get(run, {}).get(tag)
                layer = _layer(content, tag)
                tags.setdefault(run, {})[tag] = {
                    "layer": layer, "steps": [datum.step for datum in data]
                }
        return http_util.Respond(request, tags, "application/json")

    @wrappers.Request.application
    def _serve_meta(self, request):
        try:
            ctx, step, blobs = self._blobs(request)
            meta = json.loads(self._data.read_blob(
                ctx, blob_key=blobs[0].blob_key).decode("utf-8"))
        except (errors.PublicError, ValueError) as error:
            return _error(request, error)
        meta["step"] = step
        return http_util.Respond(request, meta, "application/json")

    @wrappers.Request.application
    def _serve_weights(self, request):
        try:
            example = int(request.args.get("example", "0"))
            ctx, _, blobs = self._blobs(request)
            meta = json.loads(self._data.read_blob(
                ctx, blob_key=blobs[0].blob_key).decode("utf-8"))
            num_examples, heads, queries, keys = meta["shape"]
            if not 0 <= example < num_examples:
                raise ValueError(
                    f"example must be in [0, {num_examples}); received "
                    f"{example}")
            size = heads * queries * keys * _ITEMSIZE[meta["dtype"]]
            data = self._data.read_blob(ctx, blob_key=blobs[1].blob_key)
        except (errors.PublicError, ValueError) as error:
            return _error(request, error)
        body = bytes(data[example * size:(example + 1) * size])
        return http_util.Respond(
            request, body, "application/octet-stream",
            headers=[("X-Attention-Shape", f"{heads},{queries},{keys}"),
                     ("X-Attention-Dtype", meta["dtype"])],
        )

    def _blobs(self, request):
        """`(ctx, step, blob references)` of the request's run, tag and step
        (the last step when none is given)."""
        ctx, experiment = _context(request)
        run, tag = request.args.get("run"), request.args.get("tag")
        if not run or not tag:
            raise ValueError("run and tag are required")
        series = self._data.read_blob_sequences(
            ctx, experiment_id=experiment, plugin_name=PLUGIN_NAME,
            downsample=_ALL,
            run_tag_filter=provider.RunTagFilter(runs=[run], tags=[tag]),
        ).get(run, {}).get(tag)
        if not series:
            raise errors.NotFoundError(f"no attention maps for {run} {tag}")
        wanted = request.args.get("step")
        if wanted is None:
            datum = series[-1]
        else:
            step = int(wanted)
            datum = next((d for d in series if d.step == step), None)
            if datum is None:
                raise errors.NotFoundError(f"no step {step} in {run} {tag}")
        if len(datum.values) != 2:
            raise ValueError(f"{run} {tag} step {datum.step} is not an "
                             f"attention summary")
        return ctx, datum.step, datum.values


class AttentionLoader(base_plugin.TBLoader):
    """Loads `AttentionPlugin`; by default TensorBoard keeps every logged
    step of its summaries (the step slider covers all of them)."""

    def fix_flags(self, flags):
        # Called after the flags are parsed and before the data loader is
        # built. Without it TensorBoard keeps a sample of 10 steps a tag (100
        # with its Rust data server); an explicit
        # `--samples_per_plugin attention=N` still wins.
        samples = flags.samples_per_plugin
        if isinstance(samples, str):
            samples = flags.samples_per_plugin = _parse_samples_per_plugin(
                samples)
        samples.setdefault(PLUGIN_NAME, 0)

    def load(self, context):
        return AttentionPlugin(context)


def _context(request):
    return (plugin_util.context(request.environ),
            plugin_util.experiment_id(request.environ))


def _layer(series, tag):
    """The layer name from the summary's metadata, else from the tag."""
    try:
        return json.loads(series.plugin_content or b"{}")["layer"]
    except (AttributeError, KeyError, ValueError):
        return tag.rsplit("/", 1)[-1]


def _error(request, error):
    code = 404 if isinstance(error, errors.NotFoundError) else 400
    return http_util.Respond(request, {"error": str(error)},
                             "application/json", code=code)

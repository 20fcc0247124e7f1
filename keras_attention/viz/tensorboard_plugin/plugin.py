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

TensorBoard imports this module at start-up (the package's
`tensorboard_plugins` entry point), so it imports no Keras and no backend
(`keras_attention.viz.summary_format` reads the summaries), and nothing it
does may stop TensorBoard: when the dashboard cannot load, the loader gives
TensorBoard an `UnavailablePlugin`, whose tab says why.
"""

import importlib.resources
import json
import logging

from tensorboard import errors
from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from tensorboard.plugins.core import core_plugin
from werkzeug import wrappers

from keras_attention.viz.summary_format import PLUGIN_NAME
from keras_attention.viz.summary_format import decode_meta
from keras_attention.viz.summary_format import example_nbytes

# `downsample` of read_blob_sequences: everything the loader kept (it only
# trims what was kept; TensorBoard requires a number).
_ALL = 10**9
_STATIC = importlib.resources.files(__package__).joinpath("static")
_MIMETYPES = {".js": "text/javascript", ".css": "text/css"}
_FRONTEND = base_plugin.FrontendMetadata(es_module_path="/index.js",
                                         tab_name="Attention")
# The whole frontend of `UnavailablePlugin`: the reason, in the tab.
_UNAVAILABLE_JS = """\
// The Attention dashboard could not load; its tab says why.
export function render() {
  const line = document.createElement("p");
  line.id = "unavailable";
  line.style.cssText = "font: 14px sans-serif; margin: 16px; color: #b71c1c";
  line.textContent = %s;
  document.body.replaceChildren(line);
}
"""
_LOG = logging.getLogger(__name__)


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
        # The static files are read here, so that a broken install fails
        # in `AttentionLoader.load`, which reports it in the tab.
        self._apps = {
            f"/{name}": _respond_with(_STATIC.joinpath(name).read_bytes(),
                                      mimetype)
            for name, mimetype in static_files().items()
        }
        self._apps.update({
            "/tags": self._serve_tags,
            "/meta": self._serve_meta,
            "/weights": self._serve_weights,
        })

    def get_plugin_apps(self):
        return dict(self._apps)

    def is_active(self):
        # TensorBoard enables the tab when a run holds data of this plugin;
        # nothing else needs checking.
        return False

    def frontend_metadata(self):
        return _FRONTEND

    # ------------------------------------------------------------ routes
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
            meta = decode_meta(self._data.read_blob(
                ctx, blob_key=blobs[0].blob_key))
        except (errors.PublicError, ValueError) as error:
            return _error(request, error)
        meta["step"] = step
        return http_util.Respond(request, meta, "application/json")

    @wrappers.Request.application
    def _serve_weights(self, request):
        try:
            example = int(request.args.get("example", "0"))
            ctx, _, blobs = self._blobs(request)
            meta = decode_meta(self._data.read_blob(
                ctx, blob_key=blobs[0].blob_key))
            num_examples, heads, queries, keys = meta["shape"]
            if not 0 <= example < num_examples:
                raise ValueError(
                    f"example must be in [0, {num_examples}); received "
                    f"{example}")
            size = example_nbytes(meta)
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


class UnavailablePlugin(base_plugin.TBPlugin):
    """The ATTENTION tab when the dashboard could not load: its page says
    why, and TensorBoard serves every other tab as usual.

    Args:
        reason: what went wrong, on one line.
    """

    plugin_name = PLUGIN_NAME

    def __init__(self, reason):
        self.reason = reason
        text = f"The Attention dashboard could not load: {reason}"
        # JSON is a JavaScript string literal, quotes and newlines escaped.
        self._script = (_UNAVAILABLE_JS % json.dumps(text)).encode()

    def get_plugin_apps(self):
        return {"/index.js": _respond_with(self._script, "text/javascript")}

    def is_active(self):
        return False

    def frontend_metadata(self):
        return _FRONTEND


class AttentionLoader(base_plugin.TBLoader):
    """Loads `AttentionPlugin`; by default TensorBoard keeps every logged
    step of its summaries (the step slider covers all of them).

    Neither method raises: TensorBoard does not survive an exception from
    `fix_flags`, and drops the tab without a word on one from `load`.
    """

    def fix_flags(self, flags):
        # Called after the flags are parsed and before the data loader is
        # built. Without it TensorBoard keeps a sample of 10 steps a tag (100
        # with its Rust data server); an explicit
        # `--samples_per_plugin attention=N` still wins.
        try:
            samples = flags.samples_per_plugin
            if isinstance(samples, str):
                # TensorBoard's own parser (private: guarded like the rest).
                samples = flags.samples_per_plugin = (
                    core_plugin._parse_samples_per_plugin(samples))
            samples.setdefault(PLUGIN_NAME, 0)
        except Exception as error:  # noqa: BLE001  TensorBoard must start.
            _LOG.warning("The Attention dashboard keeps TensorBoard's "
                         "default sample of steps: %s", _one_line(error))

    def load(self, context):
        try:
            return AttentionPlugin(context)
        except Exception as error:  # noqa: BLE001  TensorBoard must start.
            _LOG.warning("The Attention dashboard could not load: %s",
                         _one_line(error))
            return UnavailablePlugin(_one_line(error))


def _respond_with(body, mimetype):
    """A WSGI app answering every request with `body`."""

    @wrappers.Request.application
    def app(request):
        return http_util.Respond(request, body, mimetype)

    return app


def _one_line(error, limit=300):
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


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

"""`python -m keras_attention.viz.tensorboard_plugin --logdir DIR [flags]`:
TensorBoard with the Attention dashboard, whether or not the package's
`tensorboard_plugins` entry point is installed (a source checkout); every
TensorBoard flag works as with `tensorboard`."""

import sys

from absl import app
from tensorboard import default
from tensorboard import main_lib
from tensorboard import program
from tensorboard.plugins import base_plugin

from keras_attention.viz.tensorboard_plugin.plugin import AttentionLoader


def plugins():
    """TensorBoard's plugins, with `AttentionLoader` once."""
    loaded = default.get_plugins()
    if AttentionLoader not in loaded:
        loaded.append(AttentionLoader)
    return loaded


def main():
    main_lib.global_init()
    server = program.TensorBoard(plugins=plugins())
    try:
        app.run(server.main, flags_parser=server.configure)
    except base_plugin.FlagsError as error:
        print(f"Error: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Initializers that give every weight its own random draw.

A Keras 3 random initializer fixes an integer seed when it is created, so
one instance used for several weights of the same shape returns the same
values each time (W_Q would equal W_K). Both helpers here recreate the
initializer from its config, which takes a new seed from the global random
state that `keras.utils.set_random_seed` controls: builds stay reproducible
under a global seed and every weight gets independent values.
"""

import keras


def fresh(initializer):
    """A new instance of `initializer`, with a seed of its own.

    Args:
        initializer: a Keras initializer instance.

    Returns:
        An initializer of the same class and config.
    """
    return initializer.__class__.from_config(initializer.get_config())


@keras.saving.register_keras_serializable(package="keras_attention")
class PerCallInitializer(keras.initializers.Initializer):
    """Wraps an unseeded initializer so that every call draws new values.

    Where `fresh` serves a layer that knows how many weights it makes, this
    wrapper serves an initializer handed to layers that call it once per
    weight: each call uses a `fresh` copy of the wrapped initializer.

    Args:
        initializer: a Keras initializer (name, config or instance) without
            an explicit seed.

    Example:

    ```python
    init = PerCallInitializer(keras.initializers.RandomNormal(0.0, 0.1))
    a, b = init((4, 4)), init((4, 4))  # different values
    ```
    """

    def __init__(self, initializer):
        self.initializer = keras.initializers.get(initializer)

    def __call__(self, shape, dtype=None):
        return fresh(self.initializer)(shape, dtype=dtype)

    def get_config(self):
        return {"initializer": keras.initializers.serialize(self.initializer)}

    @classmethod
    def from_config(cls, config):
        return cls(keras.initializers.deserialize(config["initializer"]))

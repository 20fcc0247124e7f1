"""What the reliability workers share (not a test module): a hook on the
trainer's checkpoint saves.

`pipelines` is imported inside the function, after the worker has imported
`pipelines.cli`: the command line chooses the Keras backend from
`--backend` before Keras loads.
"""


def after_save(save_number, action):
    """Wraps `Checkpoints.save` so that `action(step)` runs once save number
    `save_number` (1: the first) is complete."""
    from pipelines.checkpoints import Checkpoints

    save = Checkpoints.save
    count = []

    def hooked_save(self, step, writers):
        save(self, step, writers)
        count.append(step)
        if len(count) == save_number:
            action(step)

    Checkpoints.save = hooked_save

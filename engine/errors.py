"""Errors the engine raises on purpose, with messages meant for the person running it."""


class ModelLoadError(Exception):
    """A model file or folder that cannot be used.

    The message names the file, the tensor (when there is one) and the reason.
    """

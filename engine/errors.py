"""Errors the engine raises on purpose, with messages meant for the person running it."""


class ModelLoadError(Exception):
    """A model file or folder that cannot be used.

    The message names the file, the tensor (when there is one) and the reason.
    """


class RequestsFailed(RuntimeError):
    """Some requests failed inside an engine step (a state the admission checks cannot see, a kernel error).

    They were aborted and their KV blocks freed; the step's other requests went on.

    Args:
        failures: request id -> the exception that failed it.
        outputs: the step's RequestOutputs of the requests that did not fail.
    """

    def __init__(self, failures: dict, outputs: list):
        super().__init__(f"{len(failures)} request(s) failed in an engine step: {', '.join(map(str, failures))}")
        self.failures = failures
        self.outputs = outputs

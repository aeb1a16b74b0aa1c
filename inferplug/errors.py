"""The one place our exception types live.

Every message names the problem and the fix. The CLI maps InferPlugError to
exit code 2; the server maps RequestError to an OpenAI-style 4xx JSON body.
"""


class InferPlugError(Exception):
    """Base of every error inferplug raises on purpose."""


class ProfileError(InferPlugError):
    """A profile cannot be found, parsed or validated."""


class ResolveError(InferPlugError):
    """No backend can run the profile on this hardware (the message says why)."""


class BackendUnavailable(InferPlugError):
    """A backend's package or device is missing here, or the backend is closed."""


CLOSED = "the backend is closed; create a new backend"  # what a request sent to a closed backend ends with


class ModelSourceError(InferPlugError):
    """A model file or repository cannot be found, fetched or read."""


class ServeError(InferPlugError):
    """`inferplug serve` cannot listen where it was asked to (the port is taken, the address is not this machine's)."""


class GenerationError(InferPlugError):
    """The backend failed while generating a valid request (not the caller's input)."""


class RequestError(InferPlugError):
    """One request is invalid. It fails alone; the engine keeps serving others.

    `param` names the offending field (OpenAI's error.param); `status` is the
    HTTP status the server answers with.
    """

    def __init__(self, message: str, *, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param = param
        self.status = status


class LimitExceeded(RequestError):
    """A request is over one of the server's limits; `limit` is its key in the profile's [server] table (OpenAI's
    error.code), and `retry_after` the seconds a client should wait before trying again (a 429's Retry-After)."""

    def __init__(self, message: str, *, limit: str, param: str | None = None, status: int = 400,
                 retry_after: int | None = None):
        super().__init__(message, param=param, status=status)
        self.limit = limit
        self.retry_after = retry_after


class InferPlugDeprecationWarning(FutureWarning):
    """An old name (a profile value, a public type) that still works for one release, or a value whose meaning
    changed (attention = "torch"); the message names the new one. A FutureWarning, so that a user running a command sees it, not only a test run."""

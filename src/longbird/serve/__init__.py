"""`longbird serve`: the HTTP server over one `longbird.Reader` (app.py: routes, limits, errors, metrics;
schemas.py: the pydantic requests and responses; settings.py: the server's options, read without torch)."""

from .settings import ServeSettings

__all__ = ["ServeSettings", "create_app"]


def __getattr__(name: str):
    if name == "create_app":  # the application imports torch and the model code: only when a server is built
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""`longbird serve`: the HTTP server over one `longbird.Reader` (app.py: routes, limits, errors, metrics;
schemas.py: the pydantic requests and responses)."""

from .app import ServeSettings, create_app

__all__ = ["ServeSettings", "create_app"]

"""`python -m longbird ...`: the command line, as `python -m longbird.cli ...`."""

from .cli import app

app(prog_name="longbird")

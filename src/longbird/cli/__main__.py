"""`python -m longbird.cli ...` (and `torchrun` / `accelerate launch -m longbird.cli ...`)."""

from . import app

app()

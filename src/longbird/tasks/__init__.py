"""The tasks a command runs: question answering (`qa`), document classification (`classification`), and
long-input pretraining (`pretraining`: distillation, continued RSS training, RSS accuracy)."""

"""Training-time transforms and trainer glue."""

from .padding_insertion import PaddingInsertion, PaddingInsertionCollator, sentence_end_token_ids

__all__ = ["PaddingInsertion", "PaddingInsertionCollator", "sentence_end_token_ids"]

"""Readers, preprocessing and features for long-document QA and classification."""

"""Official QA metrics (KorQuAD 1.0/2.0, SQuAD 1.1) and classification scores."""

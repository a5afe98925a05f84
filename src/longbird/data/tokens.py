"""Special tokens added to a source's vocabulary (HTML tag tokens, `[QUESTION]`) and their embedding rows."""

from __future__ import annotations


def add_special_tokens(tokenizer, model, tokens: list[str]) -> dict[str, int]:
    """Add those of `tokens` the tokenizer lacks as special tokens and make sure `model` (if given) has an embedding
    row for each. Returns {token: id} of the tokens newly added (the caller initialises their rows).

    The table only ever grows: a source's table can hold rows past its tokenizer (multilingual-e5-small: 250,037
    rows for 250,002 pieces), and resizing it down to the tokenizer would change the model's shape against its base
    (a PEFT checkpoint could then not be put back on it)."""
    new = [token for token in dict.fromkeys(tokens) if token not in tokenizer.get_vocab()]
    if not new:
        return {}
    tokenizer.add_tokens(new, special_tokens=True)
    added = dict(zip(new, tokenizer.convert_tokens_to_ids(new)))
    if model is not None and max(added.values()) >= model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(max(added.values()) + 1, mean_resizing=False)
    return added

"""The limits and access of one server (`longbird serve`'s options), checked without loading torch: a bad
--api-key is refused in a second, before the model loads."""

import re
from dataclasses import dataclass, field


@dataclass
class ServeSettings:
    """Limits and access of one server (the `longbird serve` options)."""

    max_document_chars: int = 1_000_000
    max_question_chars: int = 1_000
    max_queue: int = 32  # requests admitted at once; beyond: 503 with Retry-After
    # padded tokens per model pass over the windows of concurrent requests (reader.FORWARD_TOKENS, which imports torch)
    max_batch_tokens: int = 16_384
    # windows one request may make (its document at its doc_stride/stride); beyond: 413 before any window is built.
    # A document of max_document_chars at the default stride (half a window) makes about 2,500 windows of 512 tokens.
    max_request_windows: int = 4_096
    retry_after_seconds: int = 1
    api_key: str | None = None  # Bearer token required on every route but /health when set
    cors_origins: list[str] = field(default_factory=list)  # CORS is off unless origins are given

    def __post_init__(self):
        # an empty key let no one in; a non-ASCII one failed every request with a 500 (HTTP headers are bytes)
        if self.api_key is not None and not re.fullmatch(r"[!-~]+", self.api_key):
            raise ValueError("--api-key (or LONGBIRD_API_KEY) must be a non-empty string of printable ASCII without "
                             "spaces: clients send it in an HTTP header; leave both unset to serve without a key")

    @property
    def max_body_bytes(self) -> int:
        """No admissible request is larger: a character takes at most 16 bytes of JSON (an emoji escaped as a
        surrogate pair is 12; as a one-character text of /embed's list, "\\ud83d\\ude00", 15), and /embed's texts
        share --max-document-chars."""
        return 16 * (self.max_document_chars + self.max_question_chars) + 65_536

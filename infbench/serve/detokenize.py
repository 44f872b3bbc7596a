"""Incremental detokenization of one sample, with stop strings cut out of the text.

Decoding the whole output after every token costs O(length) per token.  Instead the
text grows by the difference between decoding a short window with and without the new
tokens: a window that ends in the middle of a multi-byte character decodes to U+FFFD,
so the new text is taken only once the window decodes cleanly, and the window then
moves up.  Text that might be the beginning of a stop string is held back from the
stream until it is known not to be one; when a stop string appears the text is cut
before it and the sample is finished.
"""

from __future__ import annotations

from infbench.model.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class SampleText:
    """Tokens in, stream-safe text out; `add` one token at a time (see the module doc)."""

    def __init__(self, tokenizer: Tokenizer | None, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.token_ids: list[int] = []
        self.text = ""  # decoded so far (cut before a stop string once one matched)
        self.stopped = False  # a stop string matched
        self._prefix = 0  # window start: tokens before it are in `text` for good
        self._read = 0  # tokens [_prefix, _read) are decoded into `text` already
        self._sent = 0  # characters of `text` handed out by `take`
        self._max_stop = max((len(s) for s in stop), default=0)

    def add(self, token_id: int) -> bool:
        """Append one token; True when a stop string completed (the sample is done)."""
        if self.stopped:
            raise ValueError("add after a stop string matched")
        self.token_ids.append(token_id)
        tok = self.tokenizer
        if tok is None:
            return False
        before = tok.decode(self.token_ids[self._prefix:self._read], skip_special_tokens=True)
        after = tok.decode(self.token_ids[self._prefix:], skip_special_tokens=True)
        if len(after) <= len(before) or after.endswith(_REPLACEMENT):
            return False  # an incomplete character: wait for the next token
        start = max(0, len(self.text) - self._max_stop + 1)
        self.text += after[len(before):]
        self._prefix, self._read = self._read, len(self.token_ids)
        return self._find_stop(start)

    def _find_stop(self, start: int) -> bool:
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if not hits:
            return False
        self.text = self.text[:min(hits)]
        self.stopped = True
        return True

    def finish(self) -> None:
        """The sample ended without a stop string: decode what is still pending."""
        tok = self.tokenizer
        if tok is None or self.stopped or self._read == len(self.token_ids):
            return
        before = tok.decode(self.token_ids[self._prefix:self._read], skip_special_tokens=True)
        after = tok.decode(self.token_ids[self._prefix:], skip_special_tokens=True)
        start = max(0, len(self.text) - self._max_stop + 1)
        self.text += after[len(before):]
        self._read = len(self.token_ids)
        self._find_stop(start)

    def take(self, final: bool = False) -> str:
        """Text not handed out yet, minus a tail that could still begin a stop string."""
        end = len(self.text)
        if not final and not self.stopped:
            end -= self._held_back()
        delta = self.text[self._sent:end]
        self._sent = max(self._sent, end)
        return delta

    def _held_back(self) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string."""
        longest = 0
        tail = self.text[self._sent:]
        for s in self.stop:
            for k in range(min(len(s) - 1, len(tail)), longest, -1):
                if tail.endswith(s[:k]):
                    longest = k
                    break
        return longest

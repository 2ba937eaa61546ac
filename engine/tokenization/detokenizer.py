"""Incremental detokenizer with stop strings, one per completion.

Decoding token by token cannot be done by decoding each token alone: a UTF-8 character may be split
over several byte tokens, and SentencePiece decoders drop the space of a leading '▁'. As vLLM's
detokenize_incrementally does, we decode a small window of ids twice: [prefix_offset, read_offset),
text already emitted, and [prefix_offset, end); the difference is the new text. It is emitted only
when it does not end in U+FFFD (an incomplete character); then the window slides. The last few
prompt tokens seed the window so the first generated token gets its leading space right.

Works with any tokenizer that has decode(ids, skip_special_tokens=...).
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

from engine.outputs import Logprob
from engine.sample.sampling import SamplingParams

# Prompt tokens decoded along with the output (vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET).
_PROMPT_CONTEXT = 5


class IncrementalDetokenizer:
    """Text of one completion, built token by token, cut at the first stop string.

    Args:
        tokenizer: has decode(ids, skip_special_tokens=...).
        params: the request's SamplingParams (stop, include_stop_str_in_output, min_tokens,
            skip_special_tokens, detokenize).
        prompt_token_ids: the prompt; its last tokens give the first output token its context.

    Attributes:
        token_ids: the output token ids seen so far (including a skipped stop token).
        output_text: the text so far, already cut at a matched stop string.
        stop_string: the stop string that ended the completion, or None.
    """

    def __init__(self, tokenizer, params: SamplingParams, prompt_token_ids: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self.detokenize = params.detokenize
        self.stop: list[str] = list(params.stop or [])
        self.include_stop_str_in_output = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens
        self.token_ids: list[int] = []
        self.output_text = ""
        self.stop_string: Optional[str] = None
        # Window over context + output ids; _prefix_text caches decode(_ids[prefix:read]).
        self._ids: list[int] = [int(t) for t in list(prompt_token_ids)[-_PROMPT_CONTEXT:]]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text: Optional[str] = None
        self._last_output_text_offset = 0

    # -- decoding ----------------------------------------------------------------------------

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _decode_window(self, force: bool) -> str:
        """New text since read_offset; '' while it ends in an incomplete character (unless force)."""
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        prefix_text = self._prefix_text
        new_text = self._decode(self._ids[self._prefix_offset:])
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not force):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._prefix_text = None
        return new_text[len(prefix_text):]

    # -- public ------------------------------------------------------------------------------

    def update(self, new_token_ids: Iterable[int], stop_terminated: bool = False,
               finished: bool = False) -> Optional[str]:
        """Add generated tokens; return the stop string if one now ends the completion.

        Args:
            new_token_ids: tokens sampled this step (usually one).
            stop_terminated: the last token is EOS or a stop token id; it is then kept out of the
                text unless include_stop_str_in_output (vLLM's rule).
            finished: the completion ends this step for whatever reason; text held back for an
                incomplete character is then emitted (as the full decode would show it).
        """
        new_token_ids = [int(t) for t in new_token_ids]
        if self.stop_string is not None or not new_token_ids:
            return None
        skipped = None
        if stop_terminated and not self.include_stop_str_in_output:
            skipped = new_token_ids.pop()
        stop_check_offset = len(self.output_text)
        for token_id in new_token_ids:
            self.token_ids.append(token_id)
            if self.detokenize:
                self._ids.append(token_id)
                self.output_text += self._decode_window(force=False)
            if self.min_tokens and len(self.token_ids) <= self.min_tokens:
                stop_check_offset = len(self.output_text)  # no stop strings inside min_tokens
        if skipped is not None:
            self.token_ids.append(skipped)
        if finished and self.detokenize:
            self.output_text += self._flush_text()
        if self.stop and len(self.token_ids) > self.min_tokens:
            return self._check_stop_strings(len(self.output_text) - stop_check_offset)
        return None

    def flush(self) -> Optional[str]:
        """Emit text held for an incomplete character (the request ends); returns a matched stop string."""
        if self.stop_string is not None or not self.detokenize:
            return None
        before = len(self.output_text)
        self.output_text += self._flush_text()
        if self.stop and len(self.token_ids) > self.min_tokens:
            return self._check_stop_strings(len(self.output_text) - before)
        return None

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text to send now: all of it, or (delta) only what was not sent before.

        While running, a tail of the text that could be the start of a stop string is held back,
        so a stream never shows part of a stop string that is then cut.
        """
        length = len(self.output_text) - (0 if finished else self._held_back())
        if not delta:
            return self.output_text[:length]
        last = self._last_output_text_offset
        if last < length:
            self._last_output_text_offset = length
            return self.output_text[last:length]
        return ""

    # -- internals ---------------------------------------------------------------------------

    def _flush_text(self) -> str:
        if self._read_offset >= len(self._ids):
            return ""
        return self._decode_window(force=True)

    def _check_stop_strings(self, new_char_count: int) -> Optional[str]:
        """Find the earliest stop string that ends in the last new_char_count characters; cut there."""
        if new_char_count <= 0:
            return None
        text = self.output_text
        best: Optional[tuple[int, str]] = None
        for stop in self.stop:
            # Only matches that end in the new text: anything older was checked before.
            i = text.find(stop, max(0, len(text) - new_char_count - len(stop) + 1))
            if i != -1 and (best is None or i < best[0]):
                best = (i, stop)
        if best is None:
            return None
        i, stop = best
        self.output_text = text[:i + len(stop)] if self.include_stop_str_in_output else text[:i]
        self.stop_string = stop
        return stop

    def _held_back(self) -> int:
        """Length of the longest tail of output_text that is a proper prefix of a stop string."""
        if not self.stop or self.include_stop_str_in_output or self.stop_string is not None:
            return 0
        text = self.output_text
        held = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:n]):
                    held = n
                    break
        return held


def fill_decoded_tokens(tokenizer, logprobs: Iterable[Optional[dict[int, Logprob]]]) -> None:
    """Set decoded_token (each id decoded alone, specials kept, as vLLM does) on Logprob entries."""
    cache: dict[int, str] = {}
    for entry in logprobs:
        if not entry:
            continue
        for token_id, lp in entry.items():
            if lp.decoded_token is None:
                if token_id not in cache:
                    cache[token_id] = tokenizer.decode([token_id], skip_special_tokens=False)
                lp.decoded_token = cache[token_id]

"""What every proposer offers the Speculator: observe a request's new tokens, propose drafts for a step's requests,
forget a finished one, warm its kernels up."""
from __future__ import annotations


class Proposer:
    def needs_hidden(self) -> bool:
        """Whether observe_hidden wants the main model's hidden rows of every position (MTP)."""
        return False

    def observe_hidden(self, rid, start: int, rows, req) -> None:
        """The main model's hidden rows (pre final norm) of request rid's (Request req) positions start.., this
        step."""

    def observe(self, rid, req) -> None:
        """Request rid (its Request req) has new tokens; proposers that learn from them take them now."""

    def propose(self, rid, req, limit: int) -> list[int]:
        raise NotImplementedError

    def propose_many(self, items) -> list[list[int]]:
        """items: (request id, Request, limit) -> each request's drafts (up to min(k, limit) tokens)."""
        return [self.propose(rid, req, limit) for rid, req, limit in items]

    def forget(self, rid) -> None:
        """Request rid finished."""

    def warm_up(self) -> None:
        """Compiles (or loads from the JIT cache) what the first proposal runs."""

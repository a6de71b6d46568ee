"""The errors of ``arch`` (the vocabulary), all under the project's one root
(``common.errors.TransformerAllocError``): each message is one line naming the field, the value
and the rule."""

from __future__ import annotations

from common.errors import TransformerAllocError


class ConfigError(TransformerAllocError):
    """An invalid architecture description; ``problems`` lists every rule broken."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class KernelError(TransformerAllocError):
    """A kernel spec or kernel file that cannot be used; the message names the rule."""

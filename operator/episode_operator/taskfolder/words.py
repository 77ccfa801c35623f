"""Dockerfile word processing: quotes, escapes and ``$VAR`` / ``${VAR:-word}`` substitution.

BuildKit runs the arguments of ``FROM``, ``ARG``, ``ENV``, ``WORKDIR``, ``USER``, ``COPY``,
``ADD`` and ``VOLUME`` through its shell lexer (``frontend/dockerfile/shell/lex.go``) before
it uses them; ``RUN``, ``CMD`` and ``ENTRYPOINT`` are left to the shell at run time. This is
a port of the lexer's ``ProcessWord`` for replay, so a replayed Dockerfile means what a
build of it means: single quotes keep everything, double quotes keep all but ``$`` and
escapes, the escape token (``\\`` or the ``# escape=`` directive's) escapes one character,
and ``${NAME}`` supports the modifiers ``:-  -  :+  +  :?  ?  #  ##  %  %%  /  //``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

SPECIAL_PARAMETERS = frozenset("@*#?-$!0")


class WordError(ValueError):
    """A word the lexer cannot process (unterminated quote, bad substitution…)."""


def process_word(
    text: str,
    env: Mapping[str, str],
    *,
    escape: str = "\\",
    quotes: bool = True,
) -> str:
    """``text`` with quotes removed and variables substituted from ``env`` (unset reads as empty).

    ``quotes=False`` keeps quote characters and escapes as written and only substitutes
    variables (BuildKit's treatment of an unquoted ``COPY`` heredoc and of JSON-form words).
    """
    return _Lexer(text, env, escape, quotes).run()


class _Lexer:
    def __init__(self, text: str, env: Mapping[str, str], escape: str, quotes: bool) -> None:
        self.text = text
        self.env = env
        self.escape = escape
        self.quotes = quotes
        self.raw_escapes = not quotes
        self.position = 0

    def peek(self) -> str:
        return self.text[self.position] if self.position < len(self.text) else ""

    def next(self) -> str:
        character = self.peek()
        self.position += 1 if character else 0
        return character

    def run(self) -> str:
        return self.until("", raw_escapes=self.raw_escapes)

    def until(self, stop: str, *, raw_escapes: bool) -> str:
        """Process up to (and past) ``stop``; the end of the text when ``stop`` is empty."""
        result: list[str] = []
        while self.peek():
            character = self.peek()
            if stop and character == stop:
                self.next()
                return "".join(result)
            if character == "$":
                result.append(self.dollar())
            elif self.quotes and character == "'":
                result.append(self.single_quoted())
            elif self.quotes and character == '"':
                result.append(self.double_quoted())
            else:
                self.next()
                if character == self.escape:
                    if raw_escapes:
                        result.append(character)
                    character = self.next()
                    if not character:
                        break
                result.append(character)
        if stop:
            raise WordError(f"unexpected end of statement while looking for matching {stop}")
        return "".join(result)

    def single_quoted(self) -> str:
        self.next()
        result: list[str] = []
        while True:
            character = self.next()
            if not character:
                raise WordError("unexpected end of statement while looking for matching single-quote")
            if character == "'":
                return "".join(result)
            result.append(character)

    def double_quoted(self) -> str:
        self.next()
        result: list[str] = []
        while True:
            character = self.peek()
            if not character:
                raise WordError("unexpected end of statement while looking for matching double-quote")
            if character == '"':
                self.next()
                return "".join(result)
            if character == "$":
                result.append(self.dollar())
                continue
            character = self.next()
            if character == self.escape and self.peek() and self.peek() in ('"', "$", self.escape):
                character = self.next()
            result.append(character)

    def name(self) -> str:
        """A variable name: letters, digits and ``_``; or all digits; or one special parameter."""
        start = self.position
        first = self.peek()
        if first.isdigit():
            while self.peek().isdigit():
                self.next()
            return self.text[start : self.position]
        if first and first in SPECIAL_PARAMETERS:
            return self.next()
        while self.peek() and (self.peek().isalnum() or self.peek() == "_"):
            self.next()
        return self.text[start : self.position]

    def dollar(self) -> str:
        self.next()
        if self.peek() != "{":
            name = self.name()
            return self.env.get(name, "") if name else "$"
        self.next()
        if not self.peek():
            raise WordError("syntax error: missing '}'")
        if self.peek() in "{}:":
            raise WordError("syntax error: bad substitution")
        name = self.name()
        modifier = self.next()
        if modifier == "}":
            return self.env.get(name, "")
        if not modifier:
            raise WordError("syntax error: missing '}'")
        null_is_unset = modifier == ":"
        if null_is_unset:
            modifier = self.next()
        if modifier in ("-", "+", "?", "#", "%") and modifier:
            word = self.braced_word(raw_escapes=modifier in "#%")
            return self.modified(name, modifier, word, null_is_unset=null_is_unset)
        if modifier == "/" and not null_is_unset:
            return self.replaced(name)
        raise WordError(f"unsupported modifier ({':' if null_is_unset else ''}{modifier}) in substitution")

    def braced_word(self, *, raw_escapes: bool) -> str:
        try:
            return self.until("}", raw_escapes=raw_escapes)
        except WordError:
            if not self.peek():
                raise WordError("syntax error: missing '}'") from None
            raise

    def modified(self, name: str, modifier: str, word: str, *, null_is_unset: bool) -> str:
        value = self.env.get(name)
        absent = value is None or (null_is_unset and value == "")
        if modifier == "-":
            return word if absent else str(value)
        if modifier == "+":
            return "" if absent else word
        if modifier == "?":
            if value is None:
                raise WordError(f"{name}: {word or 'is not allowed to be unset'}")
            if null_is_unset and value == "":
                raise WordError(f"{name}: {word or 'is not allowed to be empty'}")
            return value
        greedy = word.startswith(modifier)
        pattern = _shell_pattern(word[1:] if greedy else word, greedy=greedy)
        text = value or ""
        if modifier == "#":
            match = re.match(pattern, text, re.DOTALL)
            return text[match.end() :] if match else text
        # %: the shortest (or, doubled, the longest) matching suffix, found from the right.
        candidates = range(len(text), -1, -1) if not greedy else range(len(text) + 1)
        for start in candidates:
            if re.fullmatch(pattern, text[start:], re.DOTALL):
                return text[:start]
        return text

    def replaced(self, name: str) -> str:
        replace_all = self.peek() == "/"
        if replace_all:
            self.next()
        try:
            pattern = self.until("/", raw_escapes=True)
        except WordError:
            raise WordError("syntax error: missing '/' in ${}") from None
        replacement = self.braced_word(raw_escapes=True)
        expression = _shell_pattern(pattern, greedy=True)
        value = self.env.get(name, "")
        return re.sub(expression, lambda _: replacement, value, count=0 if replace_all else 1, flags=re.DOTALL)


def _shell_pattern(pattern: str, *, greedy: bool) -> str:
    """A shell wildcard pattern (``*``, ``?``, backslash escapes; no brackets) as a regular expression."""
    parts: list[str] = []
    index = 0
    while index < len(pattern):
        character = pattern[index]
        index += 1
        if character == "*":
            parts.append(".*" if greedy else ".*?")
        elif character == "?":
            parts.append(".")
        elif character == "\\":
            if index < len(pattern) and pattern[index] in "}/":
                continue
            if index >= len(pattern) or pattern[index] not in "*?\\":
                shown = pattern[index] if index < len(pattern) else ""
                raise WordError(f"invalid pattern ({pattern}) in substitution: invalid escape '\\{shown}'")
            parts.append(re.escape(pattern[index]))
            index += 1
        else:
            parts.append(re.escape(character))
    return "".join(parts)

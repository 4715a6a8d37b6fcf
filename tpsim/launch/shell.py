"""Reading a launch command pasted into a file: a bash script or just the arguments.

Handles what Megatron launch scripts use: line continuations, comments, ``export VAR=...`` and ``VAR=...``
assignments, bash arrays (``GPT_ARGS=( --num-layers 96 ... )`` expanded by ``${GPT_ARGS[@]}``), ``$VAR``,
``${VAR}``, ``${VAR:-default}`` and integer ``$(( ... ))``. The training command is the one with the most
``--flags`` (after its ``*.py`` script, if any); the launcher's ``--nproc_per_node``/``--nnodes`` (torchrun) or
``--num_gpus``/``--num_nodes`` (deepspeed) give the GPU count. Nothing is executed.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from ..errors import InputError
from ..limits import ascii_int

_ASSIGN = re.compile(r"^(?:export\s+|declare\s+(?:-\w+\s+)*|local\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_ARRAY_OPEN = re.compile(r"^\s*(?:export\s+|declare\s+(?:-\w+\s+)*)?([A-Za-z_][A-Za-z0-9_]*)=\((.*)$", re.S)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(\[@\]|\[\*\])?(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_ARITH = re.compile(r"\$\(\(([^()]*)\)\)")
LAUNCHER_GPUS = {"--nproc_per_node": "per_node", "--nproc-per-node": "per_node", "--num_gpus": "per_node",
                 "--num-gpus": "per_node", "--nnodes": "nodes", "--num_nodes": "nodes", "--num-nodes": "nodes"}
MAX_TEXT = 1 << 20
"""bytes of launch text read (a pasted command is a few kB)."""


@dataclass(frozen=True, kw_only=True)
class Command:
    """The training command found in the text."""

    args: tuple[str, ...]
    """arguments after the training script (or every token, for a bare argument list)."""
    script: str
    gpus_per_node: int | None
    nodes: int | None
    env: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def parse_command(text: str, where: str) -> Command:
    """The training command of a shell script or pasted argument list (see the module docstring)."""
    if len(text) > MAX_TEXT:
        raise InputError(f"{where}: {len(text)} bytes is more than a launch script ({MAX_TEXT} at most)")
    env: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    notes: list[str] = []
    commands: list[list[str]] = []
    for statement in _statements(text, where):
        array = _ARRAY_OPEN.match(statement)
        if array and statement.rstrip().endswith(")"):
            body = array.group(2).rstrip()[:-1]
            arrays[array.group(1)] = _expand_words(_split(body, where), env, arrays, notes)
            continue
        words = _split(statement, where)
        if not words:
            continue
        if words[0] == "export":
            words = words[1:]
        while words and _ASSIGN.match(words[0]) and not words[0].startswith("-"):
            name, value = _ASSIGN.match(words[0]).groups()  # type: ignore[union-attr]
            env[name] = _expand(value, env, arrays, notes)
            words = words[1:]
        if words:
            commands.append(_expand_words(words, env, arrays, notes))
    return _pick(commands, env, notes, where)


def _statements(text: str, where: str) -> list[str]:
    """Logical lines: continuations joined, multi-line arrays gathered, comment-only lines dropped."""
    text = re.sub(r"\\\r?\n", " ", text)
    out: list[str] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if pending:
            pending += " " + _strip_comment(stripped)
            if ")" in _strip_comment(stripped):
                out.append(pending)
                pending = ""
            continue
        if not stripped or stripped.startswith("#"):
            continue
        if _ARRAY_OPEN.match(stripped) and ")" not in _strip_comment(stripped):
            pending = _strip_comment(stripped)
            continue
        out.extend(part for part in re.split(r"\s*(?:&&|;)\s*", stripped) if part)
    if pending:
        raise InputError(f"{where}: an array assignment is not closed: {pending[:60]}...")
    return out


def _strip_comment(line: str) -> str:
    try:
        return " ".join(shlex.split(line, comments=True))
    except ValueError:
        return line


def _split(statement: str, where: str) -> list[str]:
    try:
        return shlex.split(statement, comments=True)
    except ValueError as exc:
        raise InputError(f"{where}: cannot split {statement[:60]!r} ({exc})") from None


def _expand(word: str, env: dict[str, str], arrays: dict[str, list[str]], notes: list[str]) -> str:
    def var(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(4)
        if m.group(2):
            return " ".join(arrays.get(name, []))
        if name in env:
            return env[name]
        if m.group(3) is not None:
            return m.group(3)
        if name in arrays:
            return arrays[name][0] if arrays[name] else ""
        notes.append(f"unresolved variable ${name}")
        return m.group(0)

    word = _VAR.sub(var, word)
    return _ARITH.sub(lambda m: _arith(m.group(1), m.group(0)), word)


def _arith(expr: str, original: str) -> str:
    """Integer ``$(( a * b ))`` with digits and + - * / only; anything else stays as written."""
    if len(expr) > 1000 or not re.fullmatch(r"[0-9\s+\-*/()]+", expr):  # ASCII digits: \d takes ١ and ²
        return original
    tokens = re.findall(r"[0-9]+|[+\-*/()]", expr)
    try:
        value = _Arith(tokens).parse()
    except (ValueError, ZeroDivisionError, IndexError, RecursionError):
        return original
    return str(value)


class _Arith:
    """Recursive-descent integer arithmetic (no eval)."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.i = tokens, 0

    def parse(self) -> int:
        value = self.expr()
        if self.i != len(self.tokens):
            raise ValueError("trailing tokens")
        return value

    def expr(self) -> int:
        value = self.term()
        while self.i < len(self.tokens) and self.tokens[self.i] in "+-":
            op = self.tokens[self.i]
            self.i += 1
            value = value + self.term() if op == "+" else value - self.term()
        return value

    def term(self) -> int:
        value = self.atom()
        while self.i < len(self.tokens) and self.tokens[self.i] in "*/":
            op = self.tokens[self.i]
            self.i += 1
            value = value * self.atom() if op == "*" else value // self.atom()
            if abs(value) >= 1 << 63:  # bash arithmetic is int64; beyond it, leave the text as written
                raise ValueError("overflow")
        return value

    def atom(self) -> int:
        tok = self.tokens[self.i]
        self.i += 1
        if tok == "(":
            value = self.expr()
            if self.tokens[self.i] != ")":
                raise ValueError("unbalanced")
            self.i += 1
            return value
        if len(tok) > 19:  # more digits than an int64 holds
            raise ValueError("overflow")
        return int(tok)


def _expand_words(words: list[str], env: dict[str, str], arrays: dict[str, list[str]],
                  notes: list[str]) -> list[str]:
    """Expand variables; a word that is only a variable (or an array) splits into several (bash word
    splitting)."""
    out: list[str] = []
    for word in words:
        if word in ('$@', '$*', '${@}', '${*}'):   # the script's own arguments: passed through, not ours
            continue
        value = _expand(word, env, arrays, notes)
        if _VAR.fullmatch(word):
            out.extend(value.split())
        else:
            out.append(value)
    return out


def _pick(commands: list[list[str]], env: dict[str, str], notes: list[str], where: str) -> Command:
    best: tuple[int, list[str]] | None = None
    for words in commands:
        flags = sum(1 for w in words if w.startswith("--"))
        if flags and (best is None or flags > best[0]):
            best = (flags, words)
    if best is None:
        raise InputError(f"{where}: no command with --flags found (expected a launch command or arguments)")
    words = best[1]
    script_at = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    launcher, args = (words[:script_at], words[script_at + 1:]) if script_at is not None else ([], words)
    found = {"per_node": None, "nodes": None}
    for i, word in enumerate(launcher):
        key, value = (word.split("=", 1) + [None])[:2] if "=" in word else (word, None)
        if key in LAUNCHER_GPUS:
            value = value if value is not None else (launcher[i + 1] if i + 1 < len(launcher) else "")
            number = value.split(":")[0]
            if ascii_int(number) is not None:
                found[LAUNCHER_GPUS[key]] = ascii_int(number)
            else:
                notes.append(f"launcher {key} {value!r} is not a number")
    return Command(args=tuple(args), script=words[script_at] if script_at is not None else "",
                   gpus_per_node=found["per_node"], nodes=found["nodes"], env=env,
                   notes=tuple(dict.fromkeys(notes)))


def flag_values(args: tuple[str, ...]) -> tuple[dict[str, list[str]], list[str]]:
    """``{--flag: [values]}`` in order (``--flag=value`` split; a flag's values run to the next ``--flag``;
    a repeated flag keeps the last), and the positional words before the first flag."""
    flags: dict[str, list[str]] = {}
    loose: list[str] = []
    current: str | None = None
    for word in args:
        if word.startswith("--") and len(word) > 2:
            name, _, value = word.partition("=")
            current = name
            flags[name] = [value] if value else []
        elif current is None:
            loose.append(word)
        else:
            flags[current].append(word)
    return flags, loose

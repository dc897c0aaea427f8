"""``hparams.yaml`` as Lightning writes it: what ``yaml.dump`` (PyYAML 6, block style, sorted keys, ASCII)
produces for plain values, without depending on PyYAML; or, where omegaconf is installed, what ``OmegaConf.save``
writes (Lightning's ``save_hparams_to_yaml`` in ``lightning/pytorch/core/saving.py`` prefers it)."""

from __future__ import annotations

import copy
import io
import re
import warnings
from enum import Enum
from typing import Any

_WIDTH = 80
_BREAKS = "\n\x85\u2028\u2029"
# Strings PyYAML's resolver would read back as bool, float, int, merge, null, timestamp, value or yaml: quoted.
_IMPLICIT = re.compile(
    r"""^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF
    |[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)
    |[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+
    |<<|~|null|Null|NULL||=|!|&|\*
    |[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]
    |[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?(?:[Tt]|[ \t]+)[0-9][0-9]?:[0-9][0-9]:[0-9][0-9](?:\.[0-9]*)?
     (?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?)$""",
    re.X,
)
# Indicators that forbid a plain scalar in block context (PyYAML's analyze_scalar), for printable one-line text.
_INDICATORS = re.compile(r"""^(?:---|\.\.\.)|^[#,\[\]{}&*!|>'"%@`]|^[?:-](?:\ |$)|.:(?:\ |$)|\ \#|^\ |\ $""", re.X)
_ESCAPES = {"\0": "0", "\a": "a", "\b": "b", "\t": "t", "\n": "n", "\v": "v", "\f": "f", "\r": "r", "\x1b": "e"}
_ESCAPES |= {'"': '"', "\\": "\\", "\x85": "N", "\xa0": "_", "\u2028": "L", "\u2029": "P"}


def hparams_document(hparams: dict[str, Any]) -> str:
    """Lightning's ``hparams.yaml``: ``OmegaConf.save`` of the hyperparameters (their configs resolved) where omegaconf
    is installed and can hold them all, else ``yaml_document``. Where Lightning 2.6 raises instead of falling back (a
    key OmegaConf refuses, such as None, or a value ``deepcopy`` cannot copy), GPUlayer falls back too."""
    try:
        from omegaconf import DictConfig, OmegaConf
        from omegaconf.errors import KeyValidationError, UnsupportedValueType, ValidationError
    except ImportError:
        return yaml_document(hparams)

    def resolved(value: Any) -> Any:
        if isinstance(value, DictConfig):
            return OmegaConf.to_container(value, resolve=True)
        if isinstance(value, dict):
            return type(value)({key: resolved(item) for key, item in value.items()})
        if isinstance(value, (list, tuple)):
            items = [resolved(item) for item in value]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        return value

    text = io.StringIO()
    try:
        plain = resolved(copy.deepcopy(hparams))
    except TypeError:
        return yaml_document(hparams)
    try:
        OmegaConf.save(plain, text)
    except (UnsupportedValueType, ValidationError, KeyValidationError):
        return yaml_document(plain)
    return text.getvalue()


def yaml_document(hparams: dict[str, Any]) -> str:
    """``yaml.dump(hparams)``; a value we cannot write is skipped with Lightning's warning (an Enum becomes its name)."""
    entries = []
    for key, value in hparams.items():
        try:
            entries.append((key, _mapping_entry(key, value.name if isinstance(value, Enum) else value, 0)))
        except TypeError:
            warnings.warn(
                f"Skipping '{key}' parameter because it is not possible to safely dump to YAML.", stacklevel=3
            )
    return "\n".join(text for _, text in _sorted(entries)) + "\n" if entries else "{}\n"


def _sorted(items: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """PyYAML sorts mapping items, and keeps their order when the keys do not compare."""
    try:
        return sorted(items)
    except TypeError:
        return items


def _mapping_entry(key: Any, value: Any, indent: int) -> str:
    key_text = _scalar(key, indent, indent + 2, split=False)
    raw_key = key if isinstance(key, str) else key_text
    # PyYAML's simple keys are one line and under 128 characters with their "!!str" tag; others are "? key\n: value".
    if not raw_key or len(raw_key) > 122 or any(ch in _BREAKS for ch in raw_key):
        value_text = _node(value, indent, indent + 1, in_mapping=True, indention=True)
        return f"?{_node(key, indent, indent + 1, True, True)}\n{' ' * indent}:{value_text}"
    return f"{key_text}:{_node(value, indent, indent + len(key_text) + 1, in_mapping=True, indention=False)}"


def _node(value: Any, indent: int, column: int, in_mapping: bool, indention: bool) -> str:
    """A value written after an indicator ending at ``column`` (``key:``, ``-``, ...) in a collection at ``indent``.

    ``indention`` (PyYAML's flag): only indicators so far on this line, so a collection may start on it.
    """
    tag = ""
    if type(value) is tuple:
        tag, value, indention = " !!python/tuple", list(value), False
    if type(value) not in (dict, list):
        return " " + _scalar(value, column + 1, indent + 2)
    if not value:
        return f"{tag} {'{}' if type(value) is dict else '[]'}"
    if type(value) is dict:
        inner, entries = indent + 2, [_mapping_entry(k, v, indent + 2) for k, v in _sorted(list(value.items()))]
    else:  # a list right after "key:" is not indented further: "key:\n- item"
        inner = indent if in_mapping and not indention else indent + 2
        entries = ["-" + _node(item, inner, inner + 1, in_mapping=False, indention=True) for item in value]
    return tag + (" " if indention else "\n" + " " * inner) + ("\n" + " " * inner).join(entries)


def _scalar(value: Any, column: int, indent: int, split: bool = True) -> str:
    if value is None:
        return "null"
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    if type(value) is float:
        if value != value or value in (float("inf"), float("-inf")):
            return {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"}[str(value)]
        text = repr(value).lower()
        return text.replace("e", ".0e", 1) if "." not in text and "e" in text else text
    if type(value) is not str:
        raise TypeError(f"{type(value).__name__} is not a plain YAML value")
    special = any(not (ch == "\n" or " " <= ch <= "~") for ch in value)
    multiline = any(ch in _BREAKS for ch in value)
    if not (special or multiline or _IMPLICIT.match(value) or _INDICATORS.search(value)):
        return _words(value, column, indent, split, quote="")
    if not (special or " \n" in value or "\n " in value):
        return _words(value, column, indent, split, quote="'")
    return _double_quoted(value, column, indent, split)


def _words(text: str, column: int, indent: int, split: bool, quote: str) -> str:
    """A plain or single-quoted scalar: a lone inner space past column 80 becomes a line break."""
    pieces, column = [quote], column + len(quote)
    for match in re.finditer(r" +|\n+|[^ \n]+", text):
        token = match.group()
        if token == " " and split and column > _WIDTH and match.start() > 0 and match.end() < len(text):
            piece, column = "\n" + " " * indent, indent
        elif token[0] == "\n":  # n line breaks are written as n + 1
            piece, column = "\n" * (len(token) + 1) + " " * indent, indent
        else:
            piece = token.replace("'", "''") if quote else token
            column += len(piece)
        pieces.append(piece)
    return "".join(pieces) + quote


def _double_quoted(text: str, column: int, indent: int, split: bool) -> str:
    """PyYAML's ``write_double_quoted`` with ``allow_unicode=False``: escapes, and lines folded with a backslash."""
    pieces, column, start = ['"'], column + 1, 0
    for end in range(len(text) + 1):
        ch = text[end] if end < len(text) else None
        if ch is None or ch in '"\\' or not " " <= ch <= "~":
            if start < end:
                pieces.append(text[start:end])
                column, start = column + end - start, end
            if ch is not None:
                code = ord(ch)
                escape = "\\" + _ESCAPES.get(
                    ch, f"x{code:02X}" if code <= 0xFF else f"u{code:04X}" if code <= 0xFFFF else f"U{code:08X}"
                )
                pieces.append(escape)
                column, start = column + len(escape), end + 1
        if split and 0 < end < len(text) - 1 and (ch == " " or start >= end) and column + end - start > _WIDTH:
            pieces.append(text[start:end] + "\\\n" + " " * indent)
            start, column = max(start, end), indent
            if text[start] == " ":
                pieces.append("\\")
                column += 1
    return "".join(pieces) + '"'

"""YAML text for Kubernetes manifests, without a YAML library (the core install has none).

Block style, as people write manifests. A string is bare when it is a plain word or path (letters, digits,
``_./-``, starting with a letter, ``_`` or ``/``, and not a word YAML reads as a boolean or null); any other is
a double-quoted scalar written by ``json.dumps`` (a JSON string is a valid YAML double-quoted scalar), so no
value is read back as a number, a boolean or null ("1", "true", "on", "*" stay strings). Multi-line strings
(the spec in a ConfigMap) are literal blocks. tests/test_deploy.py reads every file back with PyYAML and compares.
"""

from __future__ import annotations

import json
import re
from typing import Any

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")  # keys and strings written bare (the rest: double-quoted)
# YAML 1.1 readers (PyYAML) take these plain words as booleans or null
_SPECIAL_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def dump_all(docs: list[dict[str, Any]]) -> str:
    """Several documents, each starting with ``---``."""
    return "".join("---\n" + dump(doc) for doc in docs)


def dump(doc: dict[str, Any]) -> str:
    return "\n".join(_mapping(doc, 0)) + "\n"


def _string(text: str) -> str:
    plain = _PLAIN.fullmatch(text) and text.lower() not in _SPECIAL_WORDS
    return text if plain else json.dumps(text)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as YAML")


def _literal(text: str) -> bool:
    """Whether ``text`` reads back exactly as a literal block (``|`` keeps one final newline)."""
    lines = text[:-1].split("\n") if text.endswith("\n") else []
    return (
        len(lines) > 1
        and not text.endswith("\n\n")
        and not lines[0].startswith(" ")
        and all(line == line.rstrip() and "\t" not in line and line.isprintable() for line in lines)
    )


def _value(key: str, value: Any, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, dict) and value:
        return [f"{pad}{key}:", *_mapping(value, indent + 2)]
    if isinstance(value, list) and value:
        return [f"{pad}{key}:", *_sequence(value, indent + 2)]
    if isinstance(value, (dict, list)):
        return [f"{pad}{key}: {_empty(value)}"]
    if isinstance(value, str) and _literal(value):
        inner = " " * (indent + 2)
        return [f"{pad}{key}: |", *(f"{inner}{line}" if line else "" for line in value[:-1].split("\n"))]
    return [f"{pad}{key}: {_scalar(value)}"]


def _mapping(doc: dict[str, Any], indent: int) -> list[str]:
    out: list[str] = []
    for key, value in doc.items():
        out += _value(_string(str(key)), value, indent)
    return out


def _sequence(items: list[Any], indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    for item in items:
        if isinstance(item, (dict, list)) and item:
            lines = _mapping(item, indent + 2) if isinstance(item, dict) else _sequence(item, indent + 2)
            out += [f"{pad}- {lines[0].lstrip()}", *lines[1:]]
        else:
            out.append(f"{pad}- {_empty(item) if isinstance(item, (dict, list)) else _scalar(item)}")
    return out


def _empty(value: dict | list) -> str:
    return "{}" if isinstance(value, dict) else "[]"

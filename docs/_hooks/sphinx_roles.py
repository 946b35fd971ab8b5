"""Griffe extension for the API reference: the package's docstrings are numpy style with a few
reStructuredText habits, which Markdown would show raw. At load time (the source files are not
changed) this rewrites, in every docstring of the package:

- ``:class:`~a.b.C` `` (also ``:func:``, ``:meth:``, ``:mod:``, ``:attr:``, ``:data:``) into a
  cross-reference to the object, resolved in the docstring's scope; a reference that names
  nothing documented stays plain code (autorefs' ``optional``), never a broken link;
- runs of ``>>>`` lines (with their ``...`` continuations and output) into ``pycon`` code
  blocks, where Markdown would read ``>`` as a quotation;
- a paragraph ending in ``::`` (a reStructuredText literal block follows) into one ending in
  ``:``.

Used by mkdocs.yml (``plugins: mkdocstrings: handlers: python: options: extensions``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|attr|data|exc|obj):`(~?)([^`<>]+?)`")


def _resolve(obj: griffe.Object, target: str) -> str:
    """The full path that ``target`` names, seen from ``obj``; ``target`` itself if none."""
    if target.startswith("."):
        package = obj.module
        level = len(target) - len(target.lstrip("."))
        for _ in range(level - 1 if package.is_init_module else level):
            package = package.parent or package
        return f"{package.path}.{target.lstrip('.')}"
    head, _, rest = target.partition(".")
    scope = obj if obj.is_class or obj.is_module else obj.parent
    while scope is not None:
        if head in scope.members:
            member = scope.members[head]
            path = member.target_path if member.is_alias else member.path
            return f"{path}.{rest}" if rest else path
        try:
            path = scope.resolve(head)
        except (griffe.NameResolutionError, AttributeError, KeyError):
            scope = scope.parent
            continue
        return f"{path}.{rest}" if rest else path
    return target


def _roles(obj: griffe.Object, text: str) -> str:
    def link(match: re.Match) -> str:
        short, target = match.group(2), match.group(3).strip()
        title = target.lstrip(".").rsplit(".", 1)[-1] if short else target
        return (f'<autoref identifier="{_resolve(obj, target)}" optional>'
                f"<code>{title}</code></autoref>")

    return ROLE.sub(link, text)


def _doctests(text: str) -> str:
    lines, out, index = text.split("\n"), [], 0
    while index < len(lines):
        line = lines[index]
        if not line.lstrip().startswith(">>>"):
            out.append(line)
            index += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        block = []
        while index < len(lines) and lines[index].strip():
            block.append(lines[index][len(indent):] if lines[index].startswith(indent)
                         else lines[index].strip())
            index += 1
        if out and out[-1].strip():
            out.append("")
        out += ["```pycon", *block, "```", ""]
    return "\n".join(out)


def _literal_markers(text: str) -> str:
    return re.sub(r"(\S)::$", r"\1:", text, flags=re.M)


def _walk(obj: griffe.Object, seen: set[str]) -> None:
    if obj.path in seen:
        return
    seen.add(obj.path)
    if obj.docstring is not None:
        value = obj.docstring.value
        obj.docstring.value = _roles(obj, _doctests(_literal_markers(value)))
    for member in obj.members.values():
        if not member.is_alias:
            _walk(member, seen)


class SphinxRoles(griffe.Extension):
    """Rewrite reStructuredText roles, doctests and literal markers once the package is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: Any, **kwargs: Any) -> None:
        _walk(pkg, set())

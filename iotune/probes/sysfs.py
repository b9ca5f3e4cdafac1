"""Typed readers over a host's /sys, /proc and /run, rooted anywhere.

A :class:`SysTree` rooted at ``/`` reads the live host; rooted at a recorded directory it
reads the copy. With ``record=True`` it remembers every path it touched, so
:func:`copy_touched` can copy exactly those files (and the symlinks on the way to them)
into a fixture tree.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from iotune.errors import ProbeError


class SysTree:
    def __init__(self, root: Path | str = "/", *, record: bool = False) -> None:
        self.root = Path(root)
        self.touched: set[str] | None = set() if record else None

    @property
    def live(self) -> bool:
        return self.root == Path("/")

    def _p(self, rel: str) -> Path:
        if self.touched is not None:
            self.touched.add(rel)
        return self.root / rel.lstrip("/")

    def read(self, rel: str) -> str | None:
        """The stripped text of a file, or None if it does not exist or cannot be read."""
        try:
            return self._p(rel).read_text(errors="replace").strip()
        except OSError:
            return None

    def read_raw(self, rel: str) -> str | None:
        try:
            return self._p(rel).read_text(errors="replace")
        except OSError:
            return None

    def read_int(self, rel: str) -> int | None:
        """An integer attribute; None when absent; a ProbeError when present but not a number."""
        text = self.read(rel)
        if text is None or text == "":
            return None
        try:
            return int(text, 0) if text.startswith("0x") else int(text)
        except ValueError as exc:
            raise ProbeError(f"{rel}: expected an integer, found {text!r}") from exc

    def exists(self, rel: str) -> bool:
        return self._p(rel).exists()

    def is_dir(self, rel: str) -> bool:
        return self._p(rel).is_dir()

    def is_link(self, rel: str) -> bool:
        return self._p(rel).is_symlink()

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self._p(rel)))
        except OSError:
            return []

    def realpath(self, rel: str) -> str:
        """The symlink-resolved path of *rel*, as an absolute path inside this tree."""
        real = Path(os.path.realpath(self._p(rel)))
        try:
            return "/" + str(real.relative_to(self.root.resolve()))
        except ValueError:
            return str(real)


def disk_of(tree: SysTree, name: str) -> str | None:
    """The whole disk a block device belongs to (itself, or a partition's parent)."""
    if tree.exists(f"/sys/block/{name}/dev"):
        return name
    for disk in tree.listdir("/sys/block"):
        if tree.exists(f"/sys/block/{disk}/{name}/partition"):
            return disk
    return None


def copy_touched(touched: set[str], dest: Path, src_root: Path = Path("/")) -> None:
    """Copy every touched path from *src_root* into *dest*, keeping sysfs symlinks.

    /proc and /run files are copied as plain files (``/proc/self`` is not followed as a
    link: the recorded tree has a real ``proc/self`` directory).
    """
    for rel in sorted(touched):
        _copy_one(rel.lstrip("/"), src_root, dest)


def _copy_one(rel: str, src_root: Path, dest: Path) -> None:
    src = src_root / rel
    if rel.startswith(("proc/", "run/")):
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                target.write_text(src.read_text(errors="replace"))
            except OSError:
                return
        return
    parts = rel.split("/")
    cur = ""
    for i, comp in enumerate(parts):
        cur = f"{cur}/{comp}" if cur else comp
        here = src_root / cur
        if here.is_symlink():
            link = dest / cur
            if not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(os.readlink(here))
            real = os.path.relpath(os.path.realpath(here), src_root)
            rest = "/".join(parts[i + 1 :])
            _copy_one(f"{real}/{rest}" if rest else real, src_root, dest)
            return
    if src.is_dir():
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for entry in os.listdir(src):
            if (src / entry).is_symlink() and not (dest / rel / entry).is_symlink():
                # holders/, slaves/ and /sys/block entries are links: keep them as links
                (dest / rel / entry).symlink_to(os.readlink(src / entry))
            elif (src / entry).is_dir() and not (src / entry).is_symlink():
                (dest / rel / entry).mkdir(exist_ok=True)
    elif src.is_file():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(src, target)
        except OSError:
            return

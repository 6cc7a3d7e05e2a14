"""Image file datasets: `ImageFiles` and `ImageFolder` (one subfolder per class).

`DataLoader` reads them through the native image chain: files are read, decoded, resized
and cropped in Rust, in parallel, straight into the slots of a pooled batch buffer.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, overload

__all__ = ["IMAGE_EXTENSIONS", "ImageFiles", "ImageFolder"]

#: File name endings `ImageFolder` takes (compared in lower case).
IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".webp", ".bmp")

StrPath = str | os.PathLike[str]


class ImageFiles:
    """Image files, each with an optional int label: a map-style dataset of paths.

    ``files[i]`` is ``(path, label)`` when there are labels, else the path. Given to
    `DataLoader`, the files go through the native image chain (``transform`` is then an
    `ferrofeed.ops.decode_image` op); with a Python ``transform``, that function gets
    ``files[i]``. The sequences are kept, not copied: building one is O(1).

    Args:
        paths: the files (``str`` or ``os.PathLike``).
        labels: one int per file, or None.

    Example:
        >>> files = ImageFiles(["a.jpg", "b.png"], labels=[0, 1])
        >>> len(files), files[1]
        (2, ('b.png', 1))
    """

    def __init__(self, paths: Sequence[StrPath], labels: Sequence[int] | None = None) -> None:
        if isinstance(paths, str | bytes | os.PathLike):
            raise TypeError(
                "paths is a sequence of files; for a folder of class subfolders, "
                "use ImageFolder(root)"
            )
        if labels is not None and len(labels) != len(paths):
            raise ValueError(f"{len(labels)} labels for {len(paths)} paths")
        self.paths = paths
        self.labels = labels

    def __len__(self) -> int:
        return len(self.paths)

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> ImageFiles: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            labels = None if self.labels is None else self.labels[index]
            return ImageFiles(self.paths[index], labels)
        path = self.paths[index]
        if self.labels is None:
            return path
        return (path, int(self.labels[index]))

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        labelled = "with" if self.labels is not None else "without"
        return f"<ImageFiles: {len(self)} files {labelled} labels>"


def _find_classes(root: str) -> list[str]:
    with os.scandir(root) as entries:
        classes = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise FileNotFoundError(f"no class folders in {root!r} (expected root/<class>/<image>)")
    return classes


def _list_images(top: str, endings: tuple[str, ...]) -> list[str]:
    """The regular files under ``top`` (recursively) whose names end in ``endings``.

    Symbolic links are followed, so a link to a parent folder would make a loop: each
    folder is visited once, by device and inode, the first time it is reached in sorted
    order. Only regular files, and symbolic links to regular files, are kept: a named
    pipe, a socket or a device is left out (reading a FIFO would wait for a writer
    forever), and so is a broken link. Folders that cannot be read are left out.
    """
    found: list[str] = []
    seen: set[tuple[int, int]] = set()
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            continue
        dirs: list[str] = []
        for e in entries:
            if e.name.startswith("."):
                continue
            try:
                # DirEntry's is_dir/is_file follow symbolic links and are S_ISDIR/S_ISREG:
                # without a stat call, except for links and file systems without d_type.
                if e.is_dir():
                    dirs.append(e.path)
                elif e.name.lower().endswith(endings) and e.is_file():
                    found.append(e.path)
            except OSError:
                continue
        # Depth first, subfolders in sorted order (popped from the end).
        stack.extend(sorted(dirs, reverse=True))
    found.sort()
    return found


class ImageFolder(ImageFiles):
    """Images laid out one subfolder per class, as torchvision's ``ImageFolder``.

    ``root/dog/1.jpg`` has the label of ``dog``: classes are the subfolders' names in
    sorted order, numbered from 0. Files are found recursively (following symbolic links,
    each folder visited once per class even when links make a loop) and sorted; hidden
    files and folders are left out, and so are files whose names do not end in one of
    ``extensions`` (case-insensitive). Only regular files (and links to them) are taken:
    a named pipe, a socket or a device with an image's name is left out.

    Raises:
        FileNotFoundError: ``root`` is not a folder, has no class subfolders, or no images.

    Example:
        >>> import os, tempfile
        >>> root = tempfile.mkdtemp()
        >>> for cls in ("cat", "dog"):
        ...     os.makedirs(os.path.join(root, cls))
        ...     open(os.path.join(root, cls, "1.jpg"), "wb").close()
        >>> folder = ImageFolder(root)
        >>> folder.classes, [label for _, label in folder]
        (['cat', 'dog'], [0, 1])
    """

    def __init__(self, root: StrPath, *, extensions: Sequence[str] = IMAGE_EXTENSIONS) -> None:
        root = os.fspath(root)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"{root!r} is not a folder")
        endings = tuple(e.lower() for e in extensions)
        self.root = root
        self.classes = _find_classes(root)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        paths: list[str] = []
        labels: list[int] = []
        for label, name in enumerate(self.classes):
            found = _list_images(os.path.join(root, name), endings)
            paths.extend(found)
            labels.extend([label] * len(found))
        if not paths:
            raise FileNotFoundError(
                f"no images in the class folders of {root!r} (names ending in {endings})"
            )
        super().__init__(paths, labels)

    def __repr__(self) -> str:
        return f"<ImageFolder {self.root!r}: {len(self)} images, {len(self.classes)} classes>"

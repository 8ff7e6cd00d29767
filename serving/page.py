"""The search page of the REST port: a query image (uploaded, or an item of the index) and its
nearest items as thumbnails, read only from the images the index was built from.

:class:`ItemImages` is the one place that turns an item id into image bytes; the page itself is
``page.html`` (plain HTML and script), served as it is.
"""

from __future__ import annotations

import base64
import ipaddress
import os
from importlib import resources

from tfhash.serving.errors import invalid, not_found, permission_denied, too_large
from tfhash.serving.requests import Query, json_bool, json_int, json_object, json_version

from tfhash.artifacts import Item
from tfhash.data.export import image_type

__all__ = ["is_loopback_host", "page_html", "ItemImages"]


#: The fields of a ``POST /v1/search-image`` body.
UPLOAD_FIELDS = ("image", "k", "model_version", "refine")
#: Largest image file the page serves, or takes as a query.
MAX_IMAGE_BYTES = 10 << 20
def is_loopback_host(host_header: str) -> bool:
    """Whether an HTTP ``Host`` header names this machine's loopback (``localhost``, 127.0.0.0/8,
    ``[::1]``, with or without a port): a page of a loopback-bound service answers only those, so
    that a web page elsewhere cannot reach it through a name that resolves to 127.0.0.1."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else ""
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def page_html() -> bytes:
    """The search page (``page.html`` beside this module)."""
    return resources.files("tfhash.serving").joinpath("page.html").read_bytes()


class ItemImages:
    """The images an index was built from: each item's file of ``items.csv`` under ``root`` (the
    folder ``tfhash data export-user`` read), and how a query image becomes the model's input.

    A file is served only for an id of ``items``, only when its path, resolved with every symlink,
    lies inside ``root`` (an absolute path, a ``..`` or a link out of the root is refused), only up
    to :data:`MAX_IMAGE_BYTES` and only when its first bytes are an image's. Any other request gets
    NOT_FOUND (an id the index does not hold, an item without a file) or PERMISSION_DENIED.

    Args:
        root: the folder the item paths are relative to.
        items: ``{id: Item}`` of the indexed data.
        metadata_dir: the exported data folder whose ``metadata.json`` says how query images are
            read (size, colour): :func:`tfhash.data.user.image_query`.
        feature: the image's feature name in the served model's examples.
    """

    def __init__(self, root: str | os.PathLike, items: dict[int, Item], metadata_dir: str | os.PathLike, feature: str = "image"):
        self.root = os.path.realpath(root)
        if not os.path.isdir(self.root):
            raise ValueError(f"the image root {str(root)!r} is not a folder; pass the folder the data was exported from "
                             "(tfhash data export-user --images FOLDER)")  # fmt: skip
        self.items, self.metadata_dir, self.feature = items, os.fspath(metadata_dir), feature

    def path_of(self, item_id: int) -> str:
        """The real path of ``item_id``'s image, checked to lie inside the root."""
        item = self.items.get(int(item_id))
        if item is None or not item.path:
            raise not_found(f"no image for item {item_id}: the index's items.csv " + ("names no file for it" if item else "has no such id"))
        if os.path.isabs(item.path) or ".." in item.path.replace("\\", "/").split("/"):
            raise permission_denied(f"item {item_id}'s path {item.path!r} leaves the image root")
        real = os.path.realpath(os.path.join(self.root, item.path))
        if os.path.commonpath([real, self.root]) != self.root:
            raise permission_denied(f"item {item_id}'s file resolves outside the image root (a link out of it)")
        return real

    def read(self, item_id: int) -> tuple[bytes, str]:
        """``(bytes, content type)`` of ``item_id``'s image."""
        path = self.path_of(item_id)
        try:
            size = os.path.getsize(path)
            if size > MAX_IMAGE_BYTES:
                raise too_large(f"item {item_id}'s file is {size} bytes, over the page's limit of {MAX_IMAGE_BYTES}")
            with open(path, "rb") as handle:
                data = handle.read(MAX_IMAGE_BYTES + 1)
        except OSError as err:
            raise not_found(f"item {item_id}'s file cannot be read ({err.strerror})") from None
        kind = image_type(data[:16])
        if kind is None:
            raise permission_denied(f"item {item_id}'s file is not an image the page serves (PNG, JPEG, GIF, BMP, TIFF, WebP)")
        return data, kind

    def describe(self, item_id: int) -> dict:
        """An item as the page shows it: its id, file and class names."""
        item = self.items.get(int(item_id))
        if item is None:
            raise not_found(f"the index's items.csv has no item {item_id}")
        return {"id": int(item_id), "path": item.path, "labels": list(item.labels)}

    def query_example(self, encoded: str) -> bytes:
        """A query image sent by the page (base64 of the file's bytes) as the served model's
        serialized ``tf.Example``: checked to be an image under the size limit, then read as the
        exported images were."""
        from tfhash.data.dataset import DataFormatError
        from tfhash.data.user import image_query

        if not isinstance(encoded, str):
            raise invalid("image must be the base64 text of an image file")
        if len(encoded) > MAX_IMAGE_BYTES * 4 // 3 + 4:
            raise too_large(f"the image is over the page's limit of {MAX_IMAGE_BYTES} bytes")
        try:
            data = base64.b64decode(encoded, validate=True)
        except ValueError as err:
            raise invalid(f"image: invalid base64 ({err})") from None
        if image_type(data[:16]) is None:
            raise invalid("the upload is not an image (PNG, JPEG, GIF, BMP, TIFF or WebP)")
        try:
            return image_query(data, self.metadata_dir, self.feature)
        except DataFormatError as err:
            raise invalid(str(err)) from None

    def upload_query(self, raw: bytes) -> Query:
        """A ``POST /v1/search-image`` body, ``{"image": base64 of an image file, "k", "model_version", "refine"}``,
        as the query of that image (``k`` 10 when it is left out)."""
        body = json_object(raw, UPLOAD_FIELDS)
        if "image" not in body:
            raise invalid("the body needs image: the base64 text of an image file")
        return Query(examples=[self.query_example(body["image"])], k=json_int(body, "k", 10), model_version=json_version(body),
                     refine=json_bool(body, "refine", True))  # fmt: skip

"""Decoding an image part: PIL, off the event loop, briefly holding the GIL.

Owns ``decode_image``: the formats omnix reads (PNG, JPEG, WebP, GIF,
BMP), the pixel limit checked from the header before any pixel is
decoded, and the decoding arranged so that no step holds the GIL for long:
an RGB image is decoded into numpy memory (Pillow's own allocation zeroes
it holding the GIL), other images' pixels are copied out in bands of rows.
"""

from __future__ import annotations

import io
from typing import Final

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from omnix.http.media.common import bad, too_many_pixels, why
from omnix.pipelines.config import MediaLimits

_IMAGE_FORMATS: Final = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
_ACCEPTED_IMAGES = "PNG, JPEG, WebP, GIF or BMP"


def decode_image(param: str, data: bytes, limits: MediaLimits) -> np.ndarray:
    """The image as uint8 RGB of shape (height, width, 3): upright by its
    EXIF orientation, transparency shown over white, an animation's first
    frame; its pixels counted from the header, before any is decoded."""
    most = limits.max_pixels
    try:
        # open() reads the header only: the size is known before any pixel is.
        img = Image.open(io.BytesIO(data), formats=_IMAGE_FORMATS)
    except Image.DecompressionBombError:
        raise too_many_pixels(param, None, most) from None
    except UnidentifiedImageError:
        raise bad(
            param,
            f"{param} is not a {_ACCEPTED_IMAGES} image this server can read; send one of "
            "those formats.",
        ) from None
    except Exception as exc:
        raise bad(param, f"{param}: the image could not be read ({why(exc)}).") from None
    with img:
        width, height = img.size
        if width <= 0 or height <= 0:
            raise bad(param, f"{param}: the image is {width}x{height}: it has no pixels.")
        if width * height > most:
            raise too_many_pixels(param, (width, height), most)
        try:
            backing = _decode_into_numpy(img)
            if img.getexif().get(0x0112, 1) != 1:  # EXIF orientation: as a viewer shows it
                array = _pixels(_to_rgb(ImageOps.exif_transpose(img)))
            elif backing is not None:
                array = np.empty((height, width, 3), np.uint8)
                # A channel at a time: 3x faster than one (h, w, 3) copy.
                for c in range(3):
                    array[..., c] = backing[..., c]
            else:
                array = _pixels(_to_rgb(img))
        except Exception as exc:
            raise bad(param, f"{param}: the image could not be decoded ({why(exc)}).") from None
    if array.ndim != 3 or array.shape[2] != 3:  # pragma: no cover - convert("RGB") ensures it
        raise bad(param, f"{param}: the image decoded to shape {array.shape}, not RGB.")
    return array


def decode_mask(param: str, data: bytes, limits: MediaLimits) -> np.ndarray:
    """An image edit's mask as uint8 repaint weights of shape (height,
    width): OpenAI's convention is the mask's alpha, 0 where the image is
    to be repainted, so the weight is ``255 - alpha`` (diffusers' masks are
    white where they repaint).  The mask must have an alpha channel."""
    most = limits.max_pixels
    try:
        img = Image.open(io.BytesIO(data), formats=_IMAGE_FORMATS)
    except Image.DecompressionBombError:
        raise too_many_pixels(param, None, most) from None
    except Exception:
        raise bad(
            param,
            f"{param} is not a {_ACCEPTED_IMAGES} image this server can read; send a PNG "
            "whose alpha is 0 where the image is to be edited.",
        ) from None
    with img:
        width, height = img.size
        if width * height > most:
            raise too_many_pixels(param, (width, height), most)
        has_alpha = img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info
        if not has_alpha:
            raise bad(
                param,
                f"{param} has no alpha channel ({img.mode} image): a mask marks the area to "
                "edit with alpha 0 (fully transparent) and keeps the rest opaque. Send an RGBA "
                "PNG.",
            )
        try:
            alpha = np.asarray(ImageOps.exif_transpose(img).convert("RGBA"))[..., 3]
        except Exception as exc:
            raise bad(param, f"{param}: the mask could not be decoded ({why(exc)}).") from None
    return np.ascontiguousarray(255 - alpha)


def _decode_into_numpy(img: ImageFile.ImageFile) -> np.ndarray | None:
    """Decode an RGB image's pixels into a numpy buffer of shape (height,
    width, 4) (Pillow keeps RGB as four bytes a pixel), returned; None when
    the image is not RGB or Pillow would not decode into it, and then the
    image is decoded (or left to decode) as Pillow does.

    Why: Pillow allocates an image's memory zeroed and holding the GIL
    (10 ms and more for 16 megapixels, all of it lost to the event loop);
    numpy's is neither zeroed nor touched until the decoder, which runs
    without the GIL, writes it.  Pillow maps file memory the same way
    (``ImageFile.load``'s mmap path: ``Image.core.map_buffer``).
    """
    if img.mode != "RGB":
        return None
    width, height = img.size
    buf = np.empty((height, width, 4), np.uint8)
    try:
        core = Image.core.map_buffer(buf, img.size, "raw", 0, ("RGB", 0, 1))
        img.im = core
    except Exception:  # a Pillow without it: its own allocation
        return None
    img.load()
    return buf if img.im is core else None


def _pixels(img: Image.Image) -> np.ndarray:
    """An RGB image's pixels as a (height, width, 3) uint8 array.

    Copied a band of rows (about 1 MiB) at a time: ``np.asarray`` of the
    whole image goes through ``tobytes``, which holds the GIL for the whole
    copy (10 ms and more for a large image, all of it lost to the event
    loop); a band's copy is short, and the bands together are faster.
    """
    width, height = img.size
    out = np.empty((height, width, 3), np.uint8)
    rows = max(1, 2**20 // (3 * width))
    for top in range(0, height, rows):
        bottom = min(height, top + rows)
        out[top:bottom] = np.asarray(img.crop((0, top, width, bottom)))
    return out


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        # Transparent pixels show white, as a viewer shows them (a plain
        # convert would make them whatever colour they hide, often black).
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if img.mode != "RGB":
        return img.convert("RGB")
    img.load()
    return img

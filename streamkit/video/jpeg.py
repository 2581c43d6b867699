"""JPEG frames from the browser (message kind 0x02) -> uint8 BGR images.

    image = decode_jpeg(payload)          # np.ndarray (height, width, 3), uint8 BGR
    frame = VideoFrame(image, pts=..., index=...)

Raises ValueError (JpegError) with a message fit for the client on anything that is not one
whole baseline/progressive JPEG image within the size limit. Dimensions are read from the
SOF header before decoding, so an oversized image is refused without allocating it.
"""

from __future__ import annotations

import numpy as np

MAX_PIXELS = 4096 * 4096
MAX_BYTES = 16 * 1024 * 1024


class JpegError(ValueError):
    """The bytes are not a decodable JPEG image (or one too large to accept)."""


_SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the JPEG's SOF segment, without decoding. Raises JpegError."""
    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
        raise JpegError(f"not a JPEG image: {len(data)} bytes that do not start with the SOI marker FFD8")
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            raise JpegError(f"corrupt JPEG: expected a marker at byte {i}, found 0x{data[i]:02X}")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        if marker == 0xD9 or marker == 0xDA:
            break
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2 or i + 2 + length > n:
            raise JpegError(f"corrupt JPEG: segment 0x{marker:02X} at byte {i} runs past the end of the data")
        if marker in _SOF_MARKERS:
            if length < 8:
                raise JpegError("corrupt JPEG: short SOF segment")
            height = (data[i + 5] << 8) | data[i + 6]
            width = (data[i + 7] << 8) | data[i + 8]
            if width == 0 or height == 0:
                raise JpegError(f"JPEG has an empty size {width}x{height}")
            return width, height
        i += 2 + length
    raise JpegError("corrupt JPEG: no frame header (SOF) before the image data")


def decode_jpeg(data: bytes | bytearray | memoryview, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """Decode one JPEG image to uint8 BGR (height, width, 3). Raises JpegError (a ValueError)."""
    import cv2

    data = bytes(data)
    if not data:
        raise JpegError("empty video message: expected one JPEG image")
    if len(data) > MAX_BYTES:
        raise JpegError(f"JPEG of {len(data)} bytes is over the {MAX_BYTES}-byte limit")
    width, height = jpeg_size(data)
    if width * height > max_pixels:
        raise JpegError(f"JPEG of {width}x{height} is over the {max_pixels}-pixel limit")
    end = data.rstrip(b"\x00")
    if not end.endswith(b"\xff\xd9"):
        raise JpegError(f"truncated JPEG: {len(data)} bytes without the end-of-image marker FFD9")
    image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if image is None or image.ndim != 3 or image.shape[2] != 3:
        raise JpegError(f"corrupt JPEG: the {width}x{height} image data could not be decoded")
    return image


def encode_jpeg(image: np.ndarray, quality: int = 85) -> bytes:
    """BGR image -> JPEG bytes (what a browser sends; used by tests and clients)."""
    import cv2

    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise ValueError("JPEG encoding failed")
    return buf.tobytes()

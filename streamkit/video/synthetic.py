"""Synthetic test video with known ground truth: moving shapes, scene cuts, a real face still.

    truth = make_clip("clip.mp4", width=640, height=360, fps=30, seconds=4, cuts=[2.0])
    truth.frames[i] -> {"pts": s, "scene": k, "boxes": {"square": [x, y, w, h], "disc": [...], "face": [...]}}
    truth.cuts -> frame indices where a new scene starts

Used by the tests and by `streamkit bench video`. The face is a crop of a real photograph
shipped by an installed package (scikit-image's `astronaut.png`, NASA, public domain), found
on disk without importing that package; `face_image()` is None where none is installed.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# where the face is inside astronaut.png (512x512): Haar finds it at about (177, 66, 95, 95)
_ASTRONAUT_CROP = (150, 40, 300, 200)  # x0, y0, x1, y1


def face_image_path() -> str | None:
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.origin:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "data", "astronaut.png")
    return path if os.path.exists(path) else None


def face_image(height: int | None = None) -> np.ndarray | None:
    """A BGR crop around a real frontal face (head and shoulders), or None."""
    import cv2

    path = face_image_path()
    if path is None:
        return None
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    if image is None:
        return None
    x0, y0, x1, y1 = _ASTRONAUT_CROP
    crop = image[y0:y1, x0:x1]
    if height:
        crop = cv2.resize(crop, (int(round(crop.shape[1] * height / crop.shape[0])), height), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(crop)


@dataclass
class ClipTruth:
    width: int
    height: int
    fps: float
    frames: list[dict[str, Any]] = field(default_factory=list)
    cuts: list[int] = field(default_factory=list)
    face: bool = False


_SCENES = [  # (background BGR, texture strength)
    ((40, 40, 40), 18),
    ((150, 90, 30), 18),
    ((30, 120, 60), 18),
    ((110, 60, 140), 18),
]


def natural_texture(width: int, height: int, rng: np.random.Generator, contrast: float = 40.0) -> np.ndarray:
    """Signed float32 HxWx3 texture with a natural image's 1/f amplitude spectrum: detail at
    every scale from the whole frame down to single pixels (octaves of upsampled noise, the
    amplitude of each proportional to its wavelength**0.8), plus a few hard-edged rectangles
    (furniture, windows), colour channels partly correlated."""
    import cv2

    out = np.zeros((height, width, 3), np.float32)
    cell = 256
    while cell >= 1:
        grid = rng.standard_normal((height // cell + 2, width // cell + 2, 3)).astype(np.float32)
        grid[..., 1:] = 0.6 * grid[..., :1] + 0.4 * grid[..., 1:]  # luminance-dominated, like photos
        interp = cv2.INTER_CUBIC if cell > 1 else cv2.INTER_NEAREST
        up = cv2.resize(grid, (width + 2 * cell, height + 2 * cell), interpolation=interp)[:height, :width]
        out += up * float(cell) ** 0.8
        cell //= 2
    out *= contrast / float(out.std())
    for _ in range(12):  # edges: flat-ish objects with sharp borders
        w, h = int(rng.integers(width // 16, width // 4)), int(rng.integers(height // 16, height // 3))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        out[y:y + h, x:x + w] += rng.normal(0, contrast, 3).astype(np.float32)
    return out


def _background(k: int, width: int, height: int, rng: np.random.Generator, texture: "bool | str") -> np.ndarray:
    import cv2

    color, strength = _SCENES[k % len(_SCENES)]
    bg = np.empty((height, width, 3), np.uint8)
    bg[:] = color
    if texture == "natural":
        return np.clip(bg.astype(np.float32) + 40 + natural_texture(width, height, rng), 0, 255).astype(np.uint8)
    if texture:
        # coarse blotches, like a real room: gives the encoder and decoder real work
        small = rng.integers(0, strength * 3, (height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
        blotches = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)
        bg = cv2.add(bg, blotches)
    return bg


def render_frame(
    i: int, width: int, height: int, fps: float, scene: int, bg: np.ndarray, face: np.ndarray | None,
    noise: np.ndarray | None, noise_sd: float = 0.0, rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, dict[str, list[int]]]:
    import cv2

    t = i / fps
    img = bg.copy()
    boxes: dict[str, list[int]] = {}
    s = max(16, height // 6)
    # a square sliding left to right and back
    span = width - s - 20
    x = 10 + int(abs((t * width * 0.4) % (2 * span) - span))
    y = height // 8
    cv2.rectangle(img, (x, y), (x + s - 1, y + s - 1), (0, 0, 230), -1)
    boxes["square"] = [x, y, s, s]
    # a disc moving up and down on the right
    r = s // 2
    cx = width - width // 5
    vspan = height - 2 * r - 20
    cy = 10 + r + int(abs((t * height * 0.5) % (2 * vspan) - vspan))
    cv2.circle(img, (cx, cy), r, (0, 220, 0), -1)
    boxes["disc"] = [cx - r, cy - r, 2 * r + 1, 2 * r + 1]
    if face is not None:
        fh, fw = face.shape[:2]
        fx, fy = width // 3, height - fh - height // 12
        img[fy:fy + fh, fx:fx + fw] = face
        boxes["face_region"] = [fx, fy, fw, fh]
    if noise is not None:
        img = cv2.add(img, noise[i % len(noise)])
    if noise_sd > 0:
        # sensor noise, new every frame, mostly in luminance (as a camera's after demosaicing)
        rng = rng if rng is not None else np.random.default_rng(i)
        luma = rng.standard_normal((height, width, 1), dtype=np.float32) * noise_sd
        chroma = rng.standard_normal((height // 2, width // 2, 3), dtype=np.float32) * (noise_sd * 0.5)
        grain = luma + cv2.resize(chroma, (width, height), interpolation=cv2.INTER_NEAREST)
        img = np.clip(img.astype(np.float32) + grain, 0, 255).astype(np.uint8)
    return img, boxes


def make_clip(
    path: str | Path,
    width: int = 640,
    height: int = 360,
    fps: float = 30.0,
    seconds: float = 4.0,
    cuts: list[float] | None = None,
    with_face: bool = True,
    texture: "bool | str" = True,
    noise: int = 0,
    preset: str = "veryfast",
    crf: int = 23,
    seed: int = 0,
    noise_sd: float = 0.0,
    bitrate_kbps: int | None = None,
) -> ClipTruth:
    """Encode a synthetic H.264 MP4 and return its ground truth (see the module docstring).

    `texture`: True = coarse blotches (cheap, what the tests use), "natural" = a texture with
    a natural image's 1/f spectrum and hard edges, False = flat colour. `noise` adds one of 8
    fixed uniform noise patterns (0..noise) per frame; `noise_sd` fresh Gaussian sensor noise
    of that standard deviation every frame. `bitrate_kbps` encodes like a camera does, at a
    target bitrate (VBV-capped) instead of constant quality `crf`."""
    from streamkit.frames import VideoFrame
    from streamkit.video.encode import Mp4Writer

    rng = np.random.default_rng(seed)
    cut_times = sorted(cuts or [])
    face = face_image(height=max(48, height // 3)) if with_face else None
    truth = ClipTruth(width, height, fps, face=face is not None)
    noise_frames = None
    if noise:
        noise_frames = [rng.integers(0, noise, (height, width, 3), dtype=np.uint8) for _ in range(8)]
    n = int(round(seconds * fps))
    scene, bg = 0, _background(0, width, height, rng, texture)
    with Mp4Writer(path, fps, width, height, preset=preset, crf=crf, bitrate_kbps=bitrate_kbps) as writer:
        for i in range(n):
            t = i / fps
            k = sum(1 for c in cut_times if t + 1e-9 >= c)
            if k != scene:
                scene, bg = k, _background(k, width, height, rng, texture)
                truth.cuts.append(i)
            img, boxes = render_frame(i, width, height, fps, scene, bg, face, noise_frames, noise_sd, rng)
            writer.write(VideoFrame(img, pts=t, index=i))
            truth.frames.append({"pts": t, "scene": scene, "boxes": boxes})
    return truth

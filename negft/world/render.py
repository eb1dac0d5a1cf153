"""Drawing the embedded world: shapes, fills and backgrounds on a 64x64 RGB canvas.

Shape masks and background textures are drawn at 2x and box-downsampled (anti-aliased), then cached;
an image is pasted together from them at 64x64, so one image costs well under a millisecond.
Determinism: all randomness comes from the ``rng`` passed in (a numpy Generator).
"""

from __future__ import annotations

import io
import math
from functools import lru_cache

import numpy as np
from PIL import Image, ImageChops, ImageDraw

IMAGE_SIZE = 64
SCALE = 2
CANVAS = IMAGE_SIZE * SCALE

SHAPES = ("circle", "square", "triangle", "star", "heart", "cross", "diamond", "hexagon",
          "pentagon", "ring", "crescent", "arrow")
COLORS = {
    "red": (215, 30, 30),
    "orange": (255, 135, 0),
    "yellow": (255, 230, 0),
    "green": (40, 205, 70),
    "blue": (30, 80, 235),
    "purple": (145, 45, 205),
    "pink": (255, 105, 185),
    "cyan": (0, 225, 235),
}
SIZES = {"small": 14, "large": 22}          # object extent in output pixels
FILLS = ("solid", "striped", "dotted")
BACKGROUNDS = {                              # base colour, texture colour
    "beach": ((226, 204, 152), (200, 175, 120)),
    "grass": ((62, 112, 44), (40, 85, 30)),
    "night": ((14, 18, 52), (230, 230, 255)),
    "snow": ((236, 241, 249), (205, 215, 230)),
    "room": ((150, 108, 78), (120, 82, 55)),
}


# ------------------------------------------------------------------ shape masks (unit polygons)
def _regular(n: int, r: float = 1.0, phase: float = -math.pi / 2):
    return [(r * math.cos(phase + 2 * math.pi * k / n), r * math.sin(phase + 2 * math.pi * k / n))
            for k in range(n)]


def _star():
    pts = []
    for k in range(10):
        r = 1.0 if k % 2 == 0 else 0.42
        a = -math.pi / 2 + math.pi * k / 5
        pts.append((r * math.cos(a), r * math.sin(a)))
    return pts


def _heart():
    pts = []
    for k in range(48):
        t = 2 * math.pi * k / 48
        x = 16 * math.sin(t) ** 3
        y = -(13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t))
        pts.append((x / 17, (y + 2.5) / 17))
    return pts


POLYGONS = {
    "square": [(-0.85, -0.85), (0.85, -0.85), (0.85, 0.85), (-0.85, 0.85)],
    "triangle": [(0, -1.0), (0.95, 0.8), (-0.95, 0.8)],
    "star": _star(),
    "heart": _heart(),
    "cross": [(-0.33, -1), (0.33, -1), (0.33, -0.33), (1, -0.33), (1, 0.33), (0.33, 0.33), (0.33, 1),
              (-0.33, 1), (-0.33, 0.33), (-1, 0.33), (-1, -0.33), (-0.33, -0.33)],
    "diamond": [(0, -1), (0.62, 0), (0, 1), (-0.62, 0)],
    "hexagon": _regular(6, 1.0, 0.0),
    "pentagon": _regular(5, 1.0),
    "arrow": [(-1, -0.25), (0.15, -0.25), (0.15, -0.7), (1, 0), (0.15, 0.7), (0.15, 0.25), (-1, 0.25)],
}
ROTATE = {"circle": 0, "ring": 0, "heart": 6, "square": 6, "triangle": 6, "star": 6, "cross": 6,
          "diamond": 6, "hexagon": 6, "pentagon": 6, "crescent": 9, "arrow": 9}


def shape_mask(shape: str, px: int, angle: float) -> Image.Image:
    """An L-mode mask of size ``px`` x ``px`` (drawing scale) with the shape centred (cached; read-only)."""
    m = Image.new("L", (px, px), 0)
    d = ImageDraw.Draw(m)
    r = px / 2 - 1
    c = px / 2
    if shape == "circle":
        d.ellipse([c - r, c - r, c + r, c + r], fill=255)
    elif shape == "ring":
        d.ellipse([c - r, c - r, c + r, c + r], fill=255)
        ri = r * 0.55
        d.ellipse([c - ri, c - ri, c + ri, c + ri], fill=0)
    elif shape == "crescent":
        d.ellipse([c - r, c - r, c + r, c + r], fill=255)
        ca, sa = math.cos(math.radians(angle)), math.sin(math.radians(angle))
        ox, oy = c + 0.45 * r * ca, c - 0.45 * r * sa - 0.15 * r
        d.ellipse([ox - 0.85 * r, oy - 0.85 * r, ox + 0.85 * r, oy + 0.85 * r], fill=0)
    else:
        a = math.radians(angle)
        ca, sa = math.cos(a), math.sin(a)
        pts = [(c + r * (x * ca - y * sa), c + r * (x * sa + y * ca)) for x, y in POLYGONS[shape]]
        d.polygon(pts, fill=255)
    return m


@lru_cache(maxsize=8192)
def object_mask(shape: str, px: int, angle: float) -> Image.Image:
    """The anti-aliased mask at output scale: drawn at 2x, box-downsampled (cached; read-only)."""
    return shape_mask(shape, px * SCALE, angle).reduce(SCALE)


@lru_cache(maxsize=None)
def _pattern(fill: str, px: int, phase: int) -> Image.Image:
    """A 0/255 mask (output scale) marking where the darker shade goes for a fill pattern."""
    yy, xx = np.mgrid[0:px, 0:px]
    if fill == "striped":
        on = ((xx + yy + phase) // 3) % 2 == 0
    else:  # dotted
        on = (((xx + phase) % 5 - 2) ** 2 + ((yy + phase) % 5 - 2) ** 2) <= 1
    return Image.fromarray((on * 255).astype(np.uint8), "L")


SPECKLES = {"beach": 260, "night": 30}      # point count of the speckled backgrounds


@lru_cache(maxsize=None)
def background_texture(name: str, variant: int) -> Image.Image:
    """A textured 64x64 background (drawn at 2x); a few fixed variants per background (seeded by name)."""
    base, tex = BACKGROUNDS[name]
    rng = np.random.default_rng([sum(map(ord, name)), variant])
    img = Image.new("RGB", (CANVAS, CANVAS), base)
    d = ImageDraw.Draw(img)
    if name in SPECKLES:      # sand grains, faint stars
        for _ in range(SPECKLES[name]):
            x, y = rng.integers(0, CANVAS, 2)
            d.point((int(x), int(y)), fill=tex)
    elif name == "grass":     # short blades
        for _ in range(140):
            x, y = rng.integers(0, CANVAS, 2)
            d.line([(int(x), int(y)), (int(x) + int(rng.integers(-2, 3)), int(y) - 6)], fill=tex, width=1)
    elif name == "snow":      # soft flakes
        for _ in range(60):
            x, y = rng.integers(0, CANVAS, 2)
            d.ellipse([int(x), int(y), int(x) + 2, int(y) + 2], fill=tex)
    elif name == "room":      # floorboards and a wall line
        for y in range(0, CANVAS, 16):
            d.line([(0, y), (CANVAS, y)], fill=tex, width=2)
        d.rectangle([0, 0, CANVAS, 20], fill=(178, 160, 140))
    return img.reduce(SCALE)


def _jitter_color(rgb, rng, amount: int = 12):
    j = rng.random(3) * (2 * amount + 1) - amount
    return tuple(min(255, max(0, v + int(d))) for v, d in zip(rgb, j.tolist()))


def render(scene: dict, rng, backdrop=None, keep=None) -> Image.Image:
    """Draw a scene (see world.py for its layout) and return a 64x64 RGB PIL image.

    Each object dict carries its drawing params: ``_px`` (extent in output pixels) and ``_angle``.
    Probe-B variants: ``backdrop(background) -> image`` replaces the background before the objects are
    drawn, and only the objects indexed by ``keep`` are drawn. The same random draws are made either way,
    so a variant's objects are pixel-identical to the original's.
    """
    img = background_texture(scene["background"], int(rng.random() * 4)).copy()
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    if backdrop is not None:
        img = backdrop(img)
    for k, o in enumerate(scene["objects"]):
        px = o["_px"]
        mask = object_mask(o["shape"], px, o["_angle"])
        box = tuple(o["bbox"])
        color = _jitter_color(COLORS[o["color"]], rng)
        drawn = keep is None or k in keep
        if drawn:
            img.paste(color, box, mask)
        if o["fill"] != "solid":
            pat = _pattern(o["fill"], px, int(rng.random() * 6))
            if drawn:
                dark = tuple(int(v * 0.7) for v in color)
                img.paste(dark, box, ImageChops.multiply(mask, pat))
    # light per-image jitter that keeps PNGs small: a global brightness shift and sparse grain
    shift = int(rng.random() * 17) - 8
    if shift > 0:
        img = ImageChops.add(img, _const(shift))
    elif shift < 0:
        img = ImageChops.subtract(img, _const(-shift))
    grain = rng.integers(0, IMAGE_SIZE, (3, 48))
    arr = np.array(img, dtype=np.int16)
    arr[grain[1], grain[0]] += (grain[2] // 2 - 16)[:, None].astype(np.int16)
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")
    return img


@lru_cache(maxsize=None)
def _const(v: int) -> Image.Image:
    return Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (v, v, v))


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def color_contrast_ok(min_dist: float = 70.0) -> bool:
    """Every colour differs from every background's base colour by at least ``min_dist`` (RGB)."""
    for c in COLORS.values():
        for base, _ in BACKGROUNDS.values():
            if math.dist(c, base) < min_dist:
                return False
    return True

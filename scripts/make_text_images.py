#!/usr/bin/env python3
"""Render text images for the OCR examples: pages for PP-OCRv4 det, lines for PP-OCRv4 rec.

Why rendered: a text detector judged on noise answers ~1e-7 everywhere (no text, no
probability), so its verdict proves nothing; `trtbuild` warns of such data (an output
constant or nearly so). Real photos of text are few and carry licences; text drawn
with Pillow's own font is real text to these models, made here from a fixed seed, so
the same Pillow gives the same pixels every time and no binary is committed.

The font is Pillow's default (`ImageFont.load_default(size)`, a FreeType font built into
Pillow >= 10.1; an older Pillow is told to upgrade); nothing is downloaded.

Written under --out (default `models/`):
  text/pages/page_0.png, page_1.png   960x960 pages of text lines of several sizes (det;
                                      its profile's max is 960x960: no point is upsampled)
  text/lines/line_0.png ... line_7.png  640x48 single lines (rec; its max is [4, 3, 48, 640])

Usage: python scripts/make_text_images.py [--out models]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

PAGE = (960, 960)
LINE = (640, 48)
PAGES, LINES = 2, 8
SEED = 42

# What the lines say: words and figures as a receipt, a form or a sign has them.
WORDS = (
    "invoice", "total", "amount", "date", "paid", "order", "number", "account", "customer",
    "service", "street", "road", "station", "north", "south", "east", "west", "open",
    "closed", "monday", "friday", "price", "tax", "receipt", "cash", "card", "change",
    "store", "market", "coffee", "tea", "bread", "milk", "water", "ticket", "platform",
    "gate", "exit", "entrance", "floor", "room", "office", "hotel", "hospital", "pharmacy",
    "bank", "post", "museum", "library", "school", "park", "delivery", "express",
    "priority", "standard", "return", "refund", "warranty", "model", "serial", "version"
)  # fmt: skip


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: a fixed bitmap font, too small for these models
        sys.exit("make_text_images.py needs Pillow >= 10.1 (pip install -U pillow)")


def _phrase(rng: random.Random, words: int) -> str:
    out = []
    for _ in range(words):
        pick = rng.random()
        if pick < 0.2:
            out.append(f"{rng.randint(1, 9999)}")
        elif pick < 0.3:
            out.append(f"{rng.randint(0, 999)}.{rng.randint(0, 99):02d}")
        else:
            word = rng.choice(WORDS)
            out.append(word.upper() if rng.random() < 0.2 else word.capitalize())
    return " ".join(out)


def _ink(rng: random.Random) -> tuple[int, int, int]:
    return tuple(rng.randint(0, 90) for _ in range(3))


def _paper(rng: random.Random) -> tuple[int, int, int]:
    return tuple(rng.randint(215, 255) for _ in range(3))


def page(rng: random.Random):
    """Lines of several sizes down a page, some indented, on a light background."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", PAGE, _paper(rng))
    draw = ImageDraw.Draw(img)
    y = rng.randint(20, 60)
    while y < PAGE[1] - 40:
        size = rng.choice((18, 24, 28, 32, 40, 48, 64))
        font = _font(size)
        x = rng.randint(20, 200)
        text = _phrase(rng, rng.randint(2, 7))
        while len(text) > 1 and draw.textlength(text, font=font) > PAGE[0] - x - 20:
            text = text.rsplit(" ", 1)[0] if " " in text else text[:-1]
        draw.text((x, y), text, fill=_ink(rng), font=font)
        y += int(size * rng.uniform(1.4, 2.4))
    return img


def line(rng: random.Random):
    """One line of text filling most of a 640x48 strip, as a detector crops it for rec."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", LINE, _paper(rng))
    draw = ImageDraw.Draw(img)
    font = _font(rng.choice((28, 30, 32, 34)))
    text = _phrase(rng, 3)
    while draw.textlength(text + " w", font=font) < LINE[0] - 24:
        text += " " + _phrase(rng, 1)
    while draw.textlength(text, font=font) > LINE[0] - 12:
        text = text.rsplit(" ", 1)[0]
    top, bottom = draw.textbbox((0, 0), text, font=font)[1::2]
    draw.text((6, (LINE[1] - (bottom - top)) // 2 - top), text, fill=_ink(rng), font=font)
    return img


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("models"))
    args = ap.parse_args(argv)
    rng = random.Random(SEED)
    made = []
    for folder, count, draw in (("pages", PAGES, page), ("lines", LINES, line)):
        where = args.out / "text" / folder
        where.mkdir(parents=True, exist_ok=True)
        for k in range(count):
            path = where / f"{folder[:-1]}_{k}.png"
            tmp = path.with_name(path.name + ".tmp")
            draw(rng).save(tmp, format="PNG")
            tmp.replace(path)  # never a half-written image
            made.append(path)
    print(f"wrote {len(made)} text images under {args.out / 'text'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

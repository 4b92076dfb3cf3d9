#!/usr/bin/env python3
"""Writes a synthetic image-classification dataset in Hydra's images-u8 format.

Each record is one label byte followed by the image's pixels, channel-planar (all red, then
all green, then all blue, each row by row): CIFAR-10's binary layout, so CIFAR-10's own
data_batch_*.bin files work with the same manifest (imageShape [3, 32, 32], numClasses 10).

Ten classes: five shapes (square, disc, triangle, horizontal bar, vertical bar) in two tints
(warm, cool), at random places and sizes on a noisy background. Standard library only.

    python3 examples/images/make_shapes.py                  # examples/images/data/shapes.bin
    hydra run examples/images/sweep.yaml
"""
import argparse
import os
import random
import sys

SHAPES = ("square", "disc", "triangle", "hbar", "vbar")


def inside(shape: str, x: int, y: int, cx: int, cy: int, r: int) -> bool:
    dx, dy = x - cx, y - cy
    if shape == "square":
        return abs(dx) <= r and abs(dy) <= r
    if shape == "disc":
        return dx * dx + dy * dy <= r * r
    if shape == "triangle":
        return -r <= dy <= r and abs(dx) * 2 <= dy + r
    if shape == "hbar":
        return abs(dx) <= r and abs(dy) <= max(1, r // 3)
    return abs(dy) <= r and abs(dx) <= max(1, r // 3)  # vbar


def record(rng: random.Random, label: int, size: int) -> bytes:
    shape, warm = SHAPES[label % 5], label < 5
    tint = (200, 120, 40) if warm else (40, 120, 200)
    r = rng.randint(max(2, size // 6), max(3, size // 3))
    cx, cy = rng.randint(r, size - 1 - r), rng.randint(r, size - 1 - r)
    planes = []
    for c in range(3):
        plane = bytearray(size * size)
        for y in range(size):
            for x in range(size):
                base = tint[c] if inside(shape, x, y, cx, cy, r) else 70
                plane[y * size + x] = max(0, min(255, base + rng.randint(-30, 30)))
        planes.append(bytes(plane))
    return bytes([label]) + b"".join(planes)


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(here, "data", "shapes.bin"),
                   help="file to write (default: %(default)s)")
    p.add_argument("--images", type=int, default=6000, help="how many (default: %(default)s)")
    p.add_argument("--size", type=int, default=16,
                   help="height and width in pixels, >= 8 (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default: %(default)s)")
    args = p.parse_args()
    if args.size < 8 or args.size > 4096 or args.images < 1:
        p.error("--size must be 8..4096 and --images >= 1")
    rng = random.Random(args.seed)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        for _ in range(args.images):
            f.write(record(rng, rng.randrange(10), args.size))
    os.replace(tmp, args.out)
    print(f"wrote {args.images} images of 3x{args.size}x{args.size} in 10 classes to {args.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

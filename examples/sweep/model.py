"""The example sweep's program: the logistic map x -> r * x * (1 - x).

Reads the starting value from ``config.ini`` in the current folder (the sweep writes it
there for each task), iterates ``--steps`` times with growth rate ``--r``, writes the last
ten values to ``--out`` and prints one summary line: the mean of the second half of the
trajectory and how many distinct values (to 6 digits) it visits there -- 1 for a fixed
point, 2, 4, ... for periodic orbits, many for chaos.
"""

from __future__ import annotations

import argparse
import configparser


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--r", type=float, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    config = configparser.ConfigParser()
    with open("config.ini", encoding="utf-8") as stream:
        config.read_string("[task]\n" + stream.read())
    x = config.getfloat("task", "x0")
    label = config.get("task", "label")
    values = []
    for _ in range(args.steps):
        x = args.r * x * (1.0 - x)
        values.append(x)
    tail = values[len(values) // 2:]
    with open(args.out, "w", encoding="utf-8") as out:
        out.writelines(f"{v:.9f}\n" for v in values[-10:])
    distinct = len({round(v, 6) for v in tail})
    print(f"{label}: r={args.r} steps={args.steps} mean={sum(tail) / len(tail):.9f} "
          f"distinct={distinct}")


if __name__ == "__main__":
    main()

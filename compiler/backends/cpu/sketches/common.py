"""What the CPU sketches share: when running a nest in parallel (OpenMP) pays off."""

from __future__ import annotations

# Below this much work (elements touched, or flops / 8 for contractions) an OpenMP fork/join costs more
# than it saves, and on a loaded machine a spinning thread pool can cost milliseconds: stay serial.
PARALLEL_MIN_WORK = 1 << 16

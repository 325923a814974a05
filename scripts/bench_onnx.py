#!/usr/bin/env python
"""ONNX benchmark: writes the ONNX tests' nets at benchmark sizes (``tests/compiler/frontend/onnx_nets.py``:
MLP, conv-bn-relu-pool, ResNet basic block, BERT-style encoder layer, GPT-style block with causal
attention, RMSNorm + SwiGLU MLP) plus the zoo's ``encoder_layer`` through ``export_onnx`` into a folder,
then runs ``kiln bench --suite onnx FOLDER`` on them, passing every other argument on. The methodology,
contenders and report are `kiln bench`'s (tuner/bench/).

    python scripts/bench_onnx.py --workdir W --db sqlite:///W/onnx.db --tune 150 --out benchmarks/onnx.md
    # is: (write the nets into W/nets) + kiln bench --suite onnx W/nets --db ... --tune 150 --out ...
    python scripts/bench_onnx.py --workdir W --write-only     # only write the nets
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NET_ORDER = [
    "mlp",
    "conv_bn_relu_pool",
    "resnet_block",
    "encoder_layer",
    "gpt_block",
    "rmsnorm_swiglu",
    "zoo_encoder_layer",
]


def write_nets(names: list[str], folder: Path) -> dict[str, Path]:
    """Save each net as folder/NAME.onnx (graph name = NAME, so tuning runs and results are told apart)."""
    import onnx

    from tests.compiler.frontend.onnx_nets import NETS

    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in names:
        if name == "zoo_encoder_layer":
            from compiler.frontend.models import get_model
            from compiler.frontend.onnx_export import export_onnx

            model = export_onnx(get_model("encoder_layer"), 17)
        else:
            model = NETS[name][1]()
        model.graph.name = name
        paths[name] = folder / f"{name}.onnx"
        onnx.save(model, paths[name])
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nets", nargs="*", default=NET_ORDER, choices=NET_ORDER)
    ap.add_argument("--workdir", help="the nets go to WORKDIR/nets (default: a new temporary folder)")
    ap.add_argument("--write-only", action="store_true", help="write the nets, do not run kiln bench")
    args, rest = ap.parse_known_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="kiln-bench-onnx-"))
    folder = workdir / "nets"
    write_nets(args.nets, folder)
    print(f"wrote {len(args.nets)} ONNX nets to {folder}", file=sys.stderr)
    if args.write_only:
        return 0
    from tuner.cli import main as kiln

    return kiln(["bench", "--suite", "onnx", str(folder), *rest])


if __name__ == "__main__":
    raise SystemExit(main())

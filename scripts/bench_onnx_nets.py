#!/usr/bin/env python
"""Kiln vs onnxruntime on ONNX nets exported from PyTorch: writes the nets of
``tests/compiler/frontend/torch_nets.py`` at benchmark sizes (an MNIST MLP, a conv net with BatchNorm and
pooling, a ResNet basic block, a MobileNetV2 inverted residual with a depthwise 3x3 convolution, a
transformer encoder layer, a GPT block, RMSNorm + SwiGLU and an MLP-Mixer layer) into a folder with
``torch.onnx.export`` (TorchScript exporter, opset 17; the conv nets keep their BatchNormalization nodes,
so both runtimes fold them), then runs ``kiln bench --suite onnx FOLDER`` on them, passing every other
argument on. The methodology, contenders and report are `kiln bench`'s (tuner/bench/): outputs checked
first, rounds interleaved in rotated order, the same threads for every contender (``--threads``).

``KILN_HOST_ISA=avx2`` makes Kiln generate AVX2 code on an AVX-512 host (emulated AVX2: the hardware
still has AVX-512, onnxruntime still uses it).

    python scripts/bench_onnx_nets.py --workdir W --contenders "kiln default,onnxruntime" --threads 1 \\
        --no-store --out table.md
    python scripts/bench_onnx_nets.py --nets conv_net --workdir W --db sqlite:///W/n.db --tune 100
    python scripts/bench_onnx_nets.py --workdir W --write-only     # only write the nets
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NET_ORDER = [
    "mnist_mlp",
    "conv_net",
    "resnet_block",
    "mobilenetv2_block",
    "encoder_layer",
    "gpt_block",
    "rmsnorm_swiglu",
    "mlp_mixer",
]


def write_nets(names: list[str], folder: Path) -> dict[str, Path]:
    """Export each net to folder/NAME.onnx (graph name = NAME, so tuning runs and results are told apart)."""
    import onnx

    from tests.compiler.frontend.torch_nets import CONV_NETS, NETS, export

    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in names:
        module, x = NETS[name][1]("bench")
        model = export(module, x, keep_batchnorm=name in CONV_NETS)
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
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="kiln-bench-onnx-nets-"))
    folder = workdir / "nets"
    for stale in folder.glob("*.onnx"):  # the suite is every file of the folder: only the nets asked for
        stale.unlink()
    write_nets(args.nets, folder)
    print(f"wrote {len(args.nets)} ONNX nets to {folder}", file=sys.stderr)
    if args.write_only:
        return 0
    from tuner.cli import main as kiln

    return kiln(["bench", "--suite", "onnx", str(folder), *rest])


if __name__ == "__main__":
    raise SystemExit(main())

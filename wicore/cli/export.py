"""`wicore-export`: compile a model into ONNX partitions."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wicore.errors import WiCoreError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="wicore-export",
        description="Compile a Gemma 3, Llama, Qwen2 or Qwen3 model (GGUF file, Hugging Face folder or named model) into ONNX partitions.",
    )
    ap.add_argument(
        "--model", required=True, help="gemma3-270m, smollm2-135m-instruct (pulled), a .gguf file or a Hugging Face folder"
    )
    ap.add_argument(
        "--mmproj", default=None, help="llama.cpp's mmproj GGUF of a multimodal Gemma 3: its vision tower (with a text .gguf)"
    )
    ap.add_argument("--out", required=True, type=Path, help="output folder (written atomically)")
    ap.add_argument("--partitions", type=int, default=1, help="number of ONNX files to split the layers over")
    ap.add_argument(
        "--for",
        dest="target",
        default=None,
        metavar="DEVICES",
        help="the devices the export will run on (cpu, cuda, openvino, ..., or a list: cuda:0,cpu; they need not be "
        "installed here): --dtype, --op-flavour and --attention default to what suits them, as `wicore serve` "
        "exports named models (cpu: a GGUF's own quantized weights, ort-quant; cuda: fp16 with the paged attention)",
    )
    ap.add_argument("--dtype", default=None, choices=["fp32", "fp16"], help="default fp32, or what --for suits")
    ap.add_argument(
        "--op-flavour",
        default=None,
        choices=["portable", "ort-quant", "webgpu", "webgpu-quant"],
        help="portable: standard ONNX ops, any EP; ort-quant: MatMulNBits linear layers (CPU, CUDA), "
        "GGUF blocks transcoded without loss; webgpu: float weights, norms, RoPE and GELU in ONNX Runtime's fused "
        "kernels and int32 index arithmetic, for the WebGPU EP (CPU too); webgpu-quant: the same with MatMulNBits linear "
        "layers (--weight-bits) (default portable, or what --for suits)",
    )
    ap.add_argument(
        "--attention",
        default=None,
        choices=["portable", "paged", "batch-invariant"],
        help="portable: standard ONNX ops, any EP; paged: ONNX Runtime's PagedAttention reading the fp16 KV in place "
        "(CUDA EP, --dtype fp16); batch-invariant: standard ops, a request's tokens do not depend on the other "
        "requests of its batch on the CPU EP (docs/RELIABILITY.md); default portable, or what --for suits",
    )
    ap.add_argument(
        "--vision-flavour",
        default="auto",
        choices=["auto", "portable", "fused"],
        help="the vision tower's ops (multimodal models): portable: standard ONNX ops, any EP; fused: ONNX Runtime's "
        "MultiHeadAttention (a flash kernel on CUDA) and FastGelu, CPU and CUDA EPs, 3x portable on an H100; "
        "auto: fused with --op-flavour ort-quant, else portable",
    )
    ap.add_argument(
        "--sampling-head",
        default="auto",
        choices=["auto", "on", "off"],
        help="draw temperature / top-k / top-p tokens in the graph, so sampled rows read back a token and 64 "
        "candidates instead of their logits (graph/sampling.py); auto: on with --attention paged",
    )
    ap.add_argument(
        "--kernels",
        default="ort",
        choices=["ort", "wicore"],
        help="wicore: WiCore's own kernels (wicore/kernels; built once where the model loads): with --attention paged "
        "the residual adds, RMS norms and gated activation (CUDA); with --op-flavour ort-quant and fp32 the linear "
        "layers on wicore.MatMulQ (CPU, llama.cpp's int8 activations); ort: ONNX Runtime's ops",
    )
    ap.add_argument(
        "--matmul-q16",
        action="store_true",
        help="with --kernels wicore, --dtype fp16 and --weight-bits 4 or 8: the linear layers on WiCore's wicore.MatMulQ16 "
        "(CUDA) instead of MatMulNBits: faster at 1 to 16 rows a step (one H200, 27B shape: ~1.3x the GEMVs), much slower "
        "above, so for single-stream serving (docs/PERFORMANCE.md)",
    )
    ap.add_argument(
        "--matmul-i8",
        action="store_true",
        help="with --kernels wicore, --dtype fp16 and --weight-bits 8: the linear layers and the LM head on WiCore's "
        "wicore.MatMulI8 (CUDA): int8 weights a scale per output channel, read by a GEMV up to 16 rows a step and "
        "multiplied on int8 tensor cores (cuBLASLt, int8 activations a scale per row) above; not lossless: on the real "
        "Gemma 3 270M 187 of 200 prompt positions keep HF's argmax (docs/PERFORMANCE.md)",
    )
    ap.add_argument(
        "--block-attention",
        default="auto",
        choices=["auto", "off", "sliding", "all"],
        help="with --attention paged, the layer kinds on WiCore's BlockAttention kernel instead of ONNX Runtime's "
        "PagedAttention (graph/paged_block.py): sliding (its split-KV decode is faster there), all (also fp32 graphs, "
        "the CPU's kernel); auto: with --kernels wicore the kinds measured faster end to end (the sliding layers, "
        "where the op's own prologue serves them), else off",
    )
    ap.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "int8"],
        help="auto: the KV blocks in the graphs' dtype; int8: in 8 bits with a power-of-two scale per token and head "
        "(a quarter of fp32's bytes; portable attention; graph/kv_quant.py)",
    )
    ap.add_argument(
        "--weight-bits",
        type=int,
        default=None,
        choices=[4, 8],
        help="quantize float weights to 4 or 8 bits (MatMulNBits: the ort-quant op flavour, which this implies; default 8 "
        "with --op-flavour ort-quant). On an NVIDIA GPU (--for cuda) 8 bits decode the 27B shape ~1.4x faster than fp16 "
        "at batch 1 to 32 (docs/PERFORMANCE.md)",
    )
    ap.add_argument(
        "--expert-bits",
        type=int,
        default=None,
        choices=[4, 8],
        help="with --weight-bits: a mixture of experts' expert weights in 4 or 8 bits instead (nearly all of its bytes), "
        "e.g. --weight-bits 8 --expert-bits 4 keeps attention and LM head in 8 bits (docs/FAMILIES.md)",
    )
    ap.add_argument(
        "--quantize-embedding",
        action="store_true",
        help="with --weight-bits: the embedding's rows read the tied LM head's 4- or 8-bit codes instead of float rows "
        "(float checkpoints; a GGUF's own 8-bit table is used either way): 2.6 GiB less for Gemma 3 27B in 4 bits",
    )
    ap.add_argument(
        "--attention-stats", action="store_true", help="also output each KV block's attention mass (for the A2CR cache policy)"
    )
    ap.add_argument("--force", action="store_true", help="replace --out if it exists")
    ap.add_argument(
        "--verify",
        action="store_true",
        help="compare the graphs' logits with HF transformers' on a fixed text (needs torch; see wicore/cli/verify.py)",
    )
    ap.add_argument("--verify-tokens", type=int, default=64, help="prompt length for --verify")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        from wicore.export.exporter import ExportConfig, export_model, stderr_progress
        from wicore.export.sources import open_source

        if args.out.exists() and not args.force:  # before reading (and hashing) a multi-GB source
            raise WiCoreError(f"{args.out} already exists; pass --force to replace it")
        if args.weight_bits and args.op_flavour in ("portable", "webgpu"):
            raise WiCoreError(
                "--weight-bits quantizes the weights (the ort-quant or webgpu-quant op flavour): "
                f"drop --op-flavour {args.op_flavour} or name its quantized form"
            )
        dtype, flavour, attention = "fp32", "portable", "portable"
        if args.target is not None:
            from wicore.cli.models import export_targets, suited_export

            dtype, flavour, attention = suited_export(export_targets(args.target), args.model)
        config = ExportConfig(
            dtype=args.dtype or dtype,
            num_partitions=args.partitions,
            op_flavour=args.op_flavour or ("ort-quant" if args.weight_bits else flavour),
            attention_stats=args.attention_stats,
            overwrite=args.force,
            weight_bits=args.weight_bits or 8,
            expert_bits=args.expert_bits,
            quantize_embedding=args.quantize_embedding,
            attention=args.attention or attention,
            vision_flavour=args.vision_flavour,
            sampling_head=args.sampling_head,
            kernels=args.kernels,
            matmul_q16=args.matmul_q16,
            matmul_i8=args.matmul_i8,
            kv_cache_dtype=args.kv_cache_dtype,
            block_attention=args.block_attention,
        )
        source = open_source(args.model, args.mmproj, stderr_progress)
        export_model(source, args.out, config)
        if args.verify:
            from wicore.cli.verify import verify_against_hf

            report = verify_against_hf(args.out, args.model, num_tokens=args.verify_tokens)
            print(report.summary())
            if not report.ok:
                print(
                    f"wicore-export: {args.out} is a complete export (it loads and serves) that failed the check above; "
                    "delete it, or export again (--op-flavour portable --dtype fp32 computes what HF computes)",
                    file=sys.stderr,
                )
                return 1
    except WiCoreError as exc:
        print(f"wicore-export: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("wicore-export: interrupted; nothing was written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

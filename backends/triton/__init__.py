"""Portable Triton kernels shared by every GPU vendor.

The vendor folders (``cuda``, ``rocm``, ``xpu``) wrap these in Kernel classes and pass
their policy in (tile configs, fp8 flavour, TMA or wgmma switches); this folder never
registers kernels itself and never imports a vendor folder.

- ``w4a16``: int4/int8 weight-only GEMV and GEMM (canonical layout, act-order gathered in-kernel)
- ``act_quant``: fused activation quantization (per token, per token group, per tensor, static)
- ``fp8_mm``: fp8 W8A8 GEMM/GEMV with row-wise or block scales
- ``fp8_weight_only``: fp8 weights decoded by bit tricks (no fp8 hardware needed), 16-bit activations
- ``int8_mm``: int8 W8A8 GEMM with the scales in the epilogue
- ``moe``: the grouped GEMM of MoE experts (tokens sorted by expert, one launch over every expert,
  int4/int8, fp8/int8 W8A8 incl. block scales, NVFP4/MXFP4 decoded in the K loop)
- ``moe_align``: the routing sorted by expert and padded to the tile, in one launch
- ``kv``: the quantized KV cache: quantize-on-write and split-K decode attention over paged blocks,
  dequantizing in registers (fp8/int8 per tensor, head, token or group; TurboQuant's codes)
- ``lut4``, ``gguf``, ``gguf_gemm``: 4-bit code books and GGUF's block types
- ``common``: the tile configuration, argument checks, output buffers and shared jit helpers
"""

"""Loading onto a GPU: dense weights streamed through pinned chunks (``DeviceStaging``) are the
file's tensors, also while the default stream is busy with work on memory the allocator hands
back, and a model loaded dense or quantized at load on the GPU holds exactly the weights a
host-side read gives (every dense weight of a Llama-shaped checkpoint staged, small ones not)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import quantrt
from quantrt.checkpoint.safetensors_file import SafetensorsFile
from quantrt.checkpoint.staging import DeviceStaging
from quantrt.formats import base

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("chunk", [4096 + 6, 1 << 20, 64 << 20])
def test_staged_tensors_reach_the_gpu_intact(tmp_path: Path, chunk: int) -> None:
    g = torch.Generator().manual_seed(5)
    tensors = {
        "big.weight": torch.randn(2053, 1031, generator=g).bfloat16(),
        "odd.weight": torch.randn(3, 7, generator=g),
        "empty.weight": torch.empty(0, 4, dtype=torch.float16),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    f = SafetensorsFile(path)
    staging = DeviceStaging("cuda", chunk_bytes=chunk, ring=2)
    for _ in range(3):
        # work queued on the default stream over memory freed just before the read: the staged copy
        # must not overwrite it while it still runs
        junk = torch.randn(4096, 4096, device="cuda")
        keep = junk @ junk
        del junk
        for name, t in tensors.items():
            got = staging.read(f.path, f.data_start, f.tensors[name])
            assert got.device.type == "cuda" and got.dtype == t.dtype and got.shape == t.shape
            assert torch.equal(got.cpu(), t), name
        torch.cuda.synchronize()
        assert torch.isfinite(keep).all()


@pytest.mark.parametrize("quantize", [None, "w4a16-int-g128-asym"])
def test_a_gpu_load_stages_every_dense_weight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quantize: str | None
) -> None:
    cfg = transformers.AutoConfig.for_model(
        "llama", hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=320, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(3)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.05)
    ref.save_pretrained(tmp_path)
    monkeypatch.setattr(base, "STAGED_BYTES", 64 << 10)  # the projections and embeddings, not the norms
    staged: list[str] = []
    real = DeviceStaging.read

    def spy(self: DeviceStaging, path: Path, start: int, info: object) -> torch.Tensor:
        staged.append(info.name)  # type: ignore[attr-defined]
        return real(self, path, start, info)  # type: ignore[arg-type]

    monkeypatch.setattr(DeviceStaging, "read", spy)
    model = quantrt.from_pretrained(
        tmp_path, device="cuda", dtype=torch.bfloat16, progress=False, quantize=quantize
    )
    big = {n for n, p in ref.state_dict().items() if p.numel() * 2 >= 64 << 10}
    assert set(staged) == big
    x = torch.randint(0, 320, (2, 9))
    if quantize is None:  # the same parameters as a load through host memory
        host = quantrt.from_pretrained(tmp_path, device="cpu", dtype=torch.bfloat16, progress=False)
        params = dict(model.named_parameters())
        for n, p in host.named_parameters():
            assert torch.equal(params[n].cpu(), p), n
    with torch.no_grad():
        got = model(input_ids=x.cuda()).logits.float().cpu()
        want = ref.cuda()(input_ids=x.cuda()).logits.float().cpu()
    err = float((got - want).norm() / want.norm())
    assert err < (0.02 if quantize is None else 0.2), err

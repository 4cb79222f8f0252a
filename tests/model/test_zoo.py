"""The model zoo: every model builds, cuts anywhere, is batch-independent, and full sizes match published counts."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from dvasim.errors import ConfigError  # noqa: E402
from dvasim.model import zoo  # noqa: E402

ALL = zoo.MODEL_NAMES + zoo.EXTRA_MODEL_NAMES


@pytest.fixture(scope="module")
def small_models():
    torch.set_num_threads(2)
    return {name: zoo.build(name, "small", seed=0) for name in ALL}


def _input(m, bs, seed=1, seq_len=None):
    g = torch.Generator().manual_seed(seed)
    return m.example_input(bs, seq_len=seq_len if m.input_kind == "tokens" else None, generator=g)


def _close(a, b, rtol=1e-4):
    scale = b.abs().max().item() + 1e-30
    return torch.allclose(a, b, rtol=rtol, atol=rtol * scale)


def test_model_names_and_unknown_name():
    assert zoo.MODEL_NAMES == ("bert_base", "bert_large", "resnet152", "vgg19", "unet", "linknet")
    with pytest.raises(ValueError, match="allowed: bert_base"):
        zoo.build("resnet18")
    with pytest.raises(ConfigError, match="variant"):
        zoo.build("vgg19", variant="tiny")


@pytest.mark.parametrize("name", ALL)
def test_cut_anywhere_equals_whole(small_models, name):
    m = small_models[name]
    n = m.n_ops()
    x = _input(m, 3, seq_len=12)
    whole = m.run_ops(x, 0, n)
    assert isinstance(whole, torch.Tensor) and torch.isfinite(whole).all()
    assert whole.abs().max() > 0
    # every single cut point, plus a three-way cut; stage_module must agree with run_ops
    for k in range(n + 1):
        two = m.run_ops(m.run_ops(x, 0, k), k, n)
        assert torch.equal(two, whole) or _close(two, whole, 1e-6), (name, k)
    a, b = n // 3, 2 * n // 3
    with torch.no_grad():
        staged = m.stage_module(b, n)(m.stage_module(a, b)(m.stage_module(0, a)(x)))
    assert _close(staged, whole, 1e-6)


@pytest.mark.parametrize("name", ALL)
def test_batch_independence(small_models, name):
    m = small_models[name]
    x = _input(m, 4, seed=2, seq_len=9)
    out = m.forward(x)
    assert out.shape[0] == 4
    for i in range(4):
        alone = m.forward(x[i : i + 1])
        assert _close(out[i : i + 1], alone), (name, i)
    # the queries really differ (otherwise the check above would be vacuous)
    assert not _close(out[0:1], out[1:2])


def test_bert_mid_carry_batch_independence(small_models):
    """A carry cut in the middle of an attention layer still splits row-wise (what a *split* does)."""
    m = small_models["bert_base"]
    x = _input(m, 3, seq_len=7)
    k = 3  # after embeddings, qkv, attn: carry is (ctx, mask, residual)
    carry = m.run_ops(x, 0, k)
    assert isinstance(carry, tuple) and len(carry) == 3
    whole = m.run_ops(carry, k, m.n_ops())
    for i in range(3):
        part = m.run_ops(zoo.carry_rows(carry, slice(i, i + 1)), k, m.n_ops())
        assert _close(part, whole[i : i + 1])


def test_bert_padding_mask(small_models):
    """Padding (id 0) is masked: a short query padded to a longer length gives the same logits."""
    m = small_models["bert_base"]
    ids = _input(m, 1, seq_len=6)
    padded = torch.cat([ids, torch.zeros(1, 10, dtype=torch.int64)], dim=1)
    assert _close(m.forward(padded), m.forward(ids), 1e-4)
    # but changing a real token does change the output
    other = ids.clone()
    other[0, 3] = (other[0, 3] % 900) + 1 if other[0, 3] != 5 else 6
    assert not _close(m.forward(other), m.forward(ids), 1e-4)


def test_deterministic_weights():
    a = zoo.build("unet", "small", seed=3)
    b = zoo.build("unet", "small", seed=3)
    c = zoo.build("unet", "small", seed=4)
    pa, pb, pc = (torch.cat([p.flatten() for p in m.module().parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    # building does not disturb the caller's RNG
    torch.manual_seed(123)
    r1 = torch.rand(3)
    torch.manual_seed(123)
    zoo.build("vgg19", "small", seed=0)
    assert torch.equal(torch.rand(3), r1)


def test_bert_accepts_variable_seq_len(small_models):
    m = small_models["bert_large"]
    for L in (1, 8, 128, 256):
        assert m.forward(_input(m, 2, seq_len=L)).shape == (2, 2)
    with pytest.raises(ValueError):
        m.example_input(1, seq_len=513)


# Published parameter counts: BERT (Devlin et al. 2019, Table/Sec. 3: 110M and 340M; HuggingFace
# bert-base/large-uncased count 109.48M / 335.14M), torchvision ResNet-152 60.19M and VGG-19 143.67M,
# ResNet-50 25.56M, VGG-16 138.36M, LinkNet 11.5M (Chaurasia & Culurciello 2017, Table 1).
PUBLISHED_PARAMS = {
    "bert_base": 110e6,
    "bert_large": 340e6,
    "resnet152": 60.2e6,
    "vgg19": 143.7e6,
    "resnet50": 25.6e6,
    "vgg16": 138.4e6,
    "linknet": 11.5e6,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_full_parameter_counts(name):
    m = zoo.build(name, "full", device="meta")
    got = m.parameters_count()
    assert abs(got / PUBLISHED_PARAMS[name] - 1) < 0.03, (name, got)


# Op counts and output shapes of the full models (meta device: no weights, no compute).
FULL_OPS = {
    "bert_base": 2 + 5 * 12,
    "bert_large": 2 + 5 * 24,
    # stem conv+pool, 50 blocks x 3 convs, 4 projections, head
    "resnet152": 2 + 3 * 50 + 4 + 1,
    "resnet50": 2 + 3 * 16 + 4 + 1,
    "resnet101": 2 + 3 * 33 + 4 + 1,
    "vgg19": 16 + 5 + 3,
    "vgg16": 13 + 5 + 3,
    "unet": 4 * 3 + 2 + 4 * 3 + 1,
    # init 2, encoder 8 blocks x 2 convs + 3 projections, 4 decoders x 3, head 3
    "linknet": 2 + 16 + 3 + 12 + 3,
}


@pytest.mark.parametrize("name", sorted(FULL_OPS))
def test_full_structure_on_meta(name):
    m = zoo.build(name, "full", device="meta")
    assert m.n_ops() == FULL_OPS[name]
    x = m.example_input(2, seq_len=128 if m.input_kind == "tokens" else None, device="meta")
    carry = x
    for k in range(m.n_ops()):
        carry = m.run_ops(carry, k, k + 1)
    if m.input_kind == "tokens":
        assert carry.shape == (2, 2)
    elif name in ("unet", "linknet"):
        assert carry.shape == (2, 2, m.image_size, m.image_size)
    else:
        assert carry.shape == (2, 1000)
